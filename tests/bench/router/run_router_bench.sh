#!/usr/bin/env bash
# The router benchmark: kvfleet-router + 8 mock workers (one kvfleet-worker process with
# --mock-workers 8) on loopback, then router_loadgen at 200 req/s for 1K- and 8K-token
# prompts, and closed-loop for the sustained requests/s.
#   tests/bench/router/run_router_bench.sh [BUILD_DIR]
# KVFLEET_BENCH_WORKER_ARGS: extra worker flags, e.g. "--mock-prefill-token-us 1" so the
# mock workers can take 200 req/s of 8K-token prompts and the router is what is measured.
set -euo pipefail
BUILD="${1:-build}"
PORT="${KVFLEET_BENCH_PORT:-18800}"
SECONDS_EACH="${KVFLEET_BENCH_SECONDS:-10}"
dir="$(mktemp -d)"
"$BUILD/router/kvfleet-router" --http-host 127.0.0.1 --http-port "$PORT" --http-threads 2 \
  --registration "tcp://127.0.0.1:$((PORT + 1))" --log-level warn >"$dir/router.log" 2>&1 &
rpid=$!
"${KVFLEET_WORKER_BIN:-$BUILD/worker/kvfleet-worker}" --backend mock --mock-workers 8 --worker-id bench --model-name mock \
  --requests "tcp://127.0.0.1:$((PORT + 10))" --events "tcp://127.0.0.1:$((PORT + 11))" \
  --replay "tcp://127.0.0.1:$((PORT + 12))" --http-port $((PORT + 500)) --router "tcp://127.0.0.1:$((PORT + 1))" \
  --advertise-host 127.0.0.1 --max-context 16384 --log-level warn ${KVFLEET_BENCH_WORKER_ARGS:-} >"$dir/workers.log" 2>&1 &
wpid=$!
trap 'kill $rpid $wpid 2>/dev/null; wait 2>/dev/null; echo "logs: $dir"' EXIT
for _ in $(seq 300); do
  n=$(curl -s "http://127.0.0.1:$PORT/fleet" | grep -c '"routable": true' || true)
  [ "$n" -ge 8 ] && break
  sleep 0.1
done
echo "router + $n mock workers; $(nproc) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for tokens in 1024 8192; do
  "$BUILD/bench/router_loadgen" --port "$PORT" --prompt-tokens "$tokens" --rate 200 --seconds "$SECONDS_EACH"
done
"$BUILD/bench/router_loadgen" --port "$PORT" --prompt-tokens 1024 --rate 0 --concurrency 32 --seconds 5
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg) (target: router-added p99 <= 1 ms for 8192-token prompts at 200 req/s)"
