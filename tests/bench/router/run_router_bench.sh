#!/usr/bin/env bash
# The router benchmark: kvfleet-router + 8 mock workers (one kvfleet-worker process with
# --mock-workers 8) on loopback, then router_loadgen at 200 req/s for 1K- and 8K-token
# prompts, and closed-loop for the sustained requests/s.
#   tests/bench/router/run_router_bench.sh [BUILD_DIR]
# KVFLEET_BENCH_WORKER_ARGS: extra worker flags, e.g. "--mock-prefill-token-us 1" so the
# mock workers can take 200 req/s of 8K-token prompts and the router is what is measured.
# KVFLEET_BENCH_REPEAT (default 1): runs of each case, each on a fresh fleet; with more than
# one, a summary line per case gives the median and the spread of the runs' percentiles.
# KVFLEET_BENCH_ROUTER_ARGS: extra router flags; KVFLEET_BENCH_HTTP_THREADS (default 2): the
# router's --http-threads.
# KVFLEET_BENCH_CPU_LATENCY_US: the router's --cpu-latency-us (default: unset, the machine as
# it is). 0 keeps idle CPUs polling while the router runs (a machine-wide CPU latency QoS
# request, common/cpu_latency.h): every hand-off on the request path then wakes a CPU in µs
# instead of paying a halt exit, which on a VM is tens of µs with ms tails. Needs root.
# KVFLEET_ROUTER_BIN / KVFLEET_WORKER_BIN: other binaries (A/B comparisons: run the script
# once per router binary, alternately, and compare the summaries).
#
# What is measured (router_loadgen.cc says it in full): router-added = the client's time to
# the first text chunk minus the worker's own TTFT for that very request, which the worker
# reports in the response (kvfleet.worker_ttft_ms, from reading the request frame off its
# socket to handing its first token to the socket). The rest of the worker-side transport
# (its ZMQ I/O thread before the read and after the send) is counted as router-added.
# So the last two cases measure that floor: router_loadgen --direct 1 sends the same
# requests straight to the workers over Contract 3 (a bare DEALER client, no router, no
# HTTP) and makes the same subtraction; router-added minus the floor is the router's own
# share (HTTP, parse, tokenize, hash, route, its ZMQ hops beyond a bare client's).
set -euo pipefail
BUILD="${1:-build}"
PORT="${KVFLEET_BENCH_PORT:-18800}"
SECONDS_EACH="${KVFLEET_BENCH_SECONDS:-10}"
REPEAT="${KVFLEET_BENCH_REPEAT:-1}"
[ -x "$BUILD/bench/router_loadgen" ] || cmake --build "$BUILD" --target router_loadgen
ROUTER_BIN="${KVFLEET_ROUTER_BIN:-$BUILD/router/kvfleet-router}"
WORKER_BIN="${KVFLEET_WORKER_BIN:-$BUILD/worker/kvfleet-worker}"
dir="$(mktemp -d)"
rpid=""
wpid=""
stop_fleet() {
  [ -n "$rpid" ] && kill "$rpid" 2>/dev/null || true
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null || true
  wait 2>/dev/null || true
  rpid=""
  wpid=""
}
trap 'stop_fleet; echo "logs: $dir"' EXIT
start_fleet() {
  "$ROUTER_BIN" --http-host 127.0.0.1 --http-port "$PORT" --http-threads "${KVFLEET_BENCH_HTTP_THREADS:-2}" \
    --registration "tcp://127.0.0.1:$((PORT + 1))" --log-level warn --report-timings 1 \
    ${KVFLEET_BENCH_CPU_LATENCY_US:+--cpu-latency-us "$KVFLEET_BENCH_CPU_LATENCY_US"} \
    ${KVFLEET_BENCH_ROUTER_ARGS:-} >>"$dir/router.log" 2>&1 &
  rpid=$!
  "$WORKER_BIN" --backend mock --mock-workers 8 --worker-id bench --model-name mock \
    --requests "tcp://127.0.0.1:$((PORT + 10))" --events "tcp://127.0.0.1:$((PORT + 11))" \
    --replay "tcp://127.0.0.1:$((PORT + 12))" --http-port $((PORT + 500)) --router "tcp://127.0.0.1:$((PORT + 1))" \
    --advertise-host 127.0.0.1 --max-context 16384 --log-level warn ${KVFLEET_BENCH_WORKER_ARGS:-} \
    >>"$dir/workers.log" 2>&1 &
  wpid=$!
  n=0
  for _ in $(seq 300); do
    n=$(curl -s "http://127.0.0.1:$PORT/fleet" | grep -c '"routable": true' || true)
    [ "$n" -ge 8 ] && break
    sleep 0.1
  done
}
echo "router $ROUTER_BIN; $(nproc) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "CPU latency request: ${KVFLEET_BENCH_CPU_LATENCY_US:-none} (cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown), guest halt poll $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || echo n/a) ns)"
cases=("--prompt-tokens 1024 --rate 200 --seconds $SECONDS_EACH"
       "--prompt-tokens 8192 --rate 200 --seconds $SECONDS_EACH"
       "--prompt-tokens 1024 --rate 0 --concurrency 32 --seconds 5"
       "--direct 1 --prompt-tokens 1024 --rate 200 --seconds $SECONDS_EACH"
       "--direct 1 --prompt-tokens 8192 --rate 200 --seconds $SECONDS_EACH")
for run in $(seq "$REPEAT"); do
  start_fleet
  echo "run $run: router + $n mock workers; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for c in "${!cases[@]}"; do
    # shellcheck disable=SC2086
    "$BUILD/bench/router_loadgen" --port "$PORT" ${cases[$c]} | tee -a "$dir/case$c.txt"
  done
  stop_fleet
done
if [ "$REPEAT" -gt 1 ]; then
  echo "summary over $REPEAT runs (median [min..max] of each run's figure):"
  for c in "${!cases[@]}"; do
    python3 - "$dir/case$c.txt" <<'PY'
import re, statistics, sys
text = open(sys.argv[1]).read()
head = text.splitlines()[0].split(":")[0]
def col(pattern):
    return [float(x) for x in re.findall(pattern, text)]
def fmt(v):
    return f"{statistics.median(v):.3f} [{min(v):.3f}..{max(v):.3f}]" if v else "-"
p50 = col(r"(?:router-added latency|transport floor).*?p50 ([\d.]+) ms")
p99 = col(r"(?:router-added latency|transport floor).*?p99 ([\d.]+) ms")
rps = col(r"([\d.]+) req/s sustained")
route = col(r"mean ([\d.]+) ms")
what = "floor" if "DIRECT" in head else "router-added"
print(f"  {head}: {what} p50 {fmt(p50)} ms, p99 {fmt(p99)} ms; {fmt(rps)} req/s; routing step {fmt(route)} ms")
hops = {}
for name, a, b, c in re.findall(r"^    (\S.*?\S)\s+([\d.-]+) /\s+([\d.-]+) /\s+([\d.-]+)$", text, re.M):
    hops.setdefault(name, []).append((float(a), float(b), float(c)))
for name, rows in hops.items():
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(f"    {name:<36} p50 {med[0]:.3f}  p99 {med[1]:.3f}  slowest-2% mean {med[2]:.3f} ms (medians over runs)")
PY
  done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) (target: router-added p99 <= 1 ms for 8192-token prompts at 200 req/s)"
