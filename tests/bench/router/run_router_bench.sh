#!/usr/bin/env bash
# The router benchmark: kvfleet-router + 8 mock workers (one kvfleet-worker process with
# --mock-workers 8) on loopback, then router_loadgen at 200 req/s for 1K- and 8K-token
# prompts, and closed-loop for the sustained requests/s.
#   tests/bench/router/run_router_bench.sh [BUILD_DIR]
set -euo pipefail
BUILD="${1:-build}"
PORT="${KVFLEET_BENCH_PORT:-18800}"
SECONDS_EACH="${KVFLEET_BENCH_SECONDS:-10}"
dir="$(mktemp -d)"
"$BUILD/router/kvfleet-router" --http-host 127.0.0.1 --http-port "$PORT" --http-threads 2 \
  --registration "tcp://127.0.0.1:$((PORT + 1))" --log-level warn >"$dir/router.log" 2>&1 &
rpid=$!
"$BUILD/worker/kvfleet-worker" --backend mock --mock-workers 8 --worker-id bench --model-name mock \
  --requests "tcp://127.0.0.1:$((PORT + 10))" --events "tcp://127.0.0.1:$((PORT + 11))" \
  --replay "tcp://127.0.0.1:$((PORT + 12))" --http-port $((PORT + 50)) --router "tcp://127.0.0.1:$((PORT + 1))" \
  --advertise-host 127.0.0.1 --max-context 16384 --log-level warn >"$dir/workers.log" 2>&1 &
wpid=$!
trap 'kill $rpid $wpid 2>/dev/null; wait 2>/dev/null; echo "logs: $dir"' EXIT
for _ in $(seq 300); do
  n=$(curl -s "http://127.0.0.1:$PORT/fleet" | grep -c '"routable": true' || true)
  [ "$n" -ge 8 ] && break
  sleep 0.1
done
echo "router + $n mock workers"
for tokens in 1024 8192; do
  "$BUILD/bench/router_loadgen" --port "$PORT" --prompt-tokens "$tokens" --rate 200 --seconds "$SECONDS_EACH"
done
"$BUILD/bench/router_loadgen" --port "$PORT" --prompt-tokens 1024 --rate 0 --concurrency 32 --seconds 5
