#!/usr/bin/env bash
# Prefill and decode on different workers against colocated ones, on mock fleets of 8 workers
# (router/routing/README.md, "Prefill and decode on different workers"): for each trace and
# load, one kv row on 8 workers of role both, then one on 3 prefill + 5 decode workers with
# the conditional split, each on a freshly started fleet. Both fleets' links are modelled at
# KVFLEET_PD_BPS (25e9 by default: the mock's simulated link and the router's assumption).
#   tests/bench/fleet/pd_compare.sh KVFLEET_BIN_DIR MOONCAKE_TRACE OUT_DIR [DURATION_S] [WHICH]
# WHICH: mooncake, conversations or both (default). Prints the bench's table per row, then
# pd_goodput.py's table (goodput at a TTFT and an ITL SLO) over the rows' request lines.
# KVFLEET_PD_ARGS: more `kvfleet up` args for the split fleet only (e.g.
# "--worker-arg=--decode-step-cap=1.4"), to compare decode-role settings against one colocated row;
# KVFLEET_PD_PREFILL: its prefill workers of the 8 (default 3). KVFLEET_PD_ROUTER_ARGS: router flags
# for both fleets (e.g. "--admission-ttft-s=1", the TTFT SLO as the router's admission bound).
# KVFLEET_CONV_SEED: the conversation trace's seed (default 1).
set -uo pipefail
BIN="$(cd "$1" && pwd)"; TRACE="$2"; OUT="$3"; DURATION="${4:-25}"; WHICH="${5:-both}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT"
PORT="${KVFLEET_BENCH_PORT:-29600}"
BPS="${KVFLEET_PD_BPS:-25e9}"
fleet() {  # name, extra `kvfleet up` args: fleet-NAME.sh for `kvfleet bench --fleet-cmd`
  cat >"$OUT/fleet-$1.sh" <<EOS
#!/usr/bin/env bash
exec "$BIN/kvfleet" up --backend mock --workers 8 $2 --http-port $PORT --registration-port $((PORT + 1)) \
  --worker-base-port $((PORT + 10)) --worker-http-base-port $((PORT + 100)) --log-dir "$OUT/logs-$1" \
  --router-bin "$BIN/kvfleet-router" --worker-bin "$BIN/kvfleet-worker" \
  --router-arg=--transfer-bytes-per-s=$BPS --worker-arg=--mock-transfer-bytes-per-s=$BPS $ROUTER_ARGS
EOS
  chmod +x "$OUT/fleet-$1.sh"
}
ROUTER_ARGS=""
for a in ${KVFLEET_PD_ROUTER_ARGS:-}; do ROUTER_ARGS="$ROUTER_ARGS --router-arg=$a"; done
fleet colocated ""
fleet pd "--prefill-workers ${KVFLEET_PD_PREFILL:-3} ${KVFLEET_PD_ARGS:-}"
run() {  # name trace scale
  for kind in colocated pd; do
    echo "== $1 $kind (time scale $3); uptime: $(uptime)"
    "$BIN/kvfleet" bench --router "http://127.0.0.1:$PORT" --trace "$2" --time-scale "$3" --length-scale 4 \
      --duration "$DURATION" --compare kv --fleet-cmd "$OUT/fleet-$kind.sh" --ttft-slo-ms 1000 \
      --out "$OUT/$1-$kind.json" --requests-out "$OUT/$1-$kind.requests.jsonl" --quiet 2>&1 |
      grep -v "^bench: \|^kvfleet up"
  done
}
if [ "$WHICH" != conversations ]; then
  run mooncake-0.9x "$TRACE" 15.28
  run mooncake-1.3x "$TRACE" 20.54
fi
if [ "$WHICH" != mooncake ]; then
  python3 "$HERE/conversation_trace.py" --rate 40 --duration 60 --think-s 5 --seed "${KVFLEET_CONV_SEED:-1}" >"$OUT/conv40.jsonl"
  run conv40-0.9x "$OUT/conv40.jsonl" 1.25
  run conv40-1.3x "$OUT/conv40.jsonl" 1.81
fi
python3 "$HERE/pd_goodput.py" "$OUT"/*.requests.jsonl
echo "uptime at end: $(uptime)"
