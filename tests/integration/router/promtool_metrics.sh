#!/usr/bin/env bash
# promtool_metrics.sh ROUTER_BIN WORKER_BIN WORK_DIR PORT: serves a few requests through a
# router and one mock worker, then checks /metrics with `promtool check metrics`.
set -uo pipefail
router="$1"; worker="$2"; dir="$3"; port="$4"
port=$((port + ($$ % 20) * 50))  # other fleets may run here; stays below the ephemeral range (32768+)
command -v promtool >/dev/null || { echo "SKIP: promtool is missing (Debian package prometheus)"; exit 77; }
rm -rf "$dir"; mkdir -p "$dir"
"$router" --http-host 127.0.0.1 --http-port "$port" --registration "tcp://127.0.0.1:$((port + 1))" >"$dir/router.log" 2>&1 &
rpid=$!
wpid=
if [ "$worker" != missing ] && [ -x "$worker" ]; then
  p=$((port + 10))
  "$worker" --backend mock --worker-id w0 --model-name mock --requests "tcp://127.0.0.1:$p" \
    --events "tcp://127.0.0.1:$((p + 1))" --replay "tcp://127.0.0.1:$((p + 2))" --http-port $((port + 20)) \
    --router "tcp://127.0.0.1:$((port + 1))" --advertise-host 127.0.0.1 >"$dir/worker.log" 2>&1 &
  wpid=$!
fi
cleanup() { kill $rpid $wpid 2>/dev/null; wait $rpid $wpid 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
if [ -n "$wpid" ]; then
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/ready" >/dev/null && break; sleep 0.1; done
  for i in 1 2 3; do
    curl -s "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\":\"mock\",\"prompt\":\"hello $i\",\"max_tokens\":4}" >/dev/null
  done
fi
curl -s "http://127.0.0.1:$port/v1/completions" -d '{bad json' >/dev/null
curl -sf "http://127.0.0.1:$port/metrics" >"$dir/metrics.txt" || { echo "no /metrics"; exit 1; }
grep -q kvfleet_router_routing_seconds "$dir/metrics.txt" || { echo "router metrics missing"; exit 1; }
promtool check metrics <"$dir/metrics.txt"
