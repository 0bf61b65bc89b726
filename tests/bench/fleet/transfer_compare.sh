#!/usr/bin/env bash
# KV transfer on a mock fleet (issue: one fleet-wide KV cache): kv with pulls, kv without
# (router --transfer-bytes-per-s 0), approx and preble, each row on a freshly started fleet of
# 8 mock workers, on the conversation trace and the Mooncake synthetic trace at two loads.
#   tests/bench/fleet/transfer_compare.sh KVFLEET_BIN_DIR MOONCAKE_TRACE OUT_DIR [DURATION_S]
# KVFLEET_TRANSFER_BPS (default 0.5e9): the mock's simulated link (--mock-transfer-bytes-per-s)
# and the router's assumed bandwidth (--transfer-bytes-per-s), the same. KVFLEET_TRANSFER_ROUTER_ARGS:
# more router flags for every fleet (e.g. --no-ttft-calibration). KVFLEET_CONV_SEED (default 1): the
# conversation trace's seed. KVFLEET_CONV_ROWS (default "2.0x:2.23"): the conversation rows, each
# NAME:TIME_SCALE[:DURATION_S:WARMUP_S] ("0.9x:1.25 2.0x:2.23" for both loads; "0.9x:1.25:60:30"
# measures 30 s of the conversations after 30 s of warm-up, `kvfleet bench --warmup-s`, when the
# conversations' later turns have caught up with their first turns). KVFLEET_MOONCAKE_ROWS (default
# "0.9x:15.28 1.3x:20.54"): the Mooncake rows, the same form ("1.3x:20.54:32:7" leaves out the first
# 7 s, when the fleet's caches are empty and the trace's opening burst overloads it whatever the
# policy). KVFLEET_CONV_TRACE_S (default 60):
# the seconds of the trace in which conversations start (a row replays DURATION_S x TIME_SCALE of
# it: 60 s at 1.25 needs 75). KVFLEET_TRANSFER_LOGS=1: each router writes its decision log
# (--decision-log) and each row its requests (`kvfleet bench --requests-out`) in OUT_DIR,
# for taking a row apart (a run's log is ~50 MB). Prints one table per trace and
# load; JSON under OUT_DIR, and each fleet's logs under OUT_DIR/logs*/<start time>.
# Several rounds' OUT_DIRs pooled per row and policy: tests/bench/fleet/pooled_ttft.py.
set -uo pipefail
BIN="$(cd "$1" && pwd)"; TRACE="$2"; OUT="$3"; DURATION="${4:-25}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT"
PORT="${KVFLEET_BENCH_PORT:-29600}"
get() { python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2>/dev/null; }
decision_log() {  # $1: the fleet's suffix; a log per start, named when the fleet starts
  [ -n "${KVFLEET_TRANSFER_LOGS:-}" ] && echo "--router-arg=--decision-log=$OUT/decisions$1-\$(date +%s%N).jsonl"
}
requests_out() {  # $1: the row's name
  [ -n "${KVFLEET_TRANSFER_LOGS:-}" ] && echo "--requests-out $OUT/$1-requests.jsonl"
}
fleet() {  # fleet.sh for `kvfleet bench --fleet-cmd`; $1: extra router args
  cat >"$OUT/fleet$2.sh" <<EOS
#!/usr/bin/env bash
exec "$BIN/kvfleet" up --backend mock --workers 8 --http-port $PORT --registration-port $((PORT + 1)) \
  --worker-base-port $((PORT + 10)) --worker-http-base-port $((PORT + 100)) --log-dir "$OUT/logs$2/\$(date +%s%N)" \
  --router-bin "$BIN/kvfleet-router" --worker-bin "$BIN/kvfleet-worker" $1 $EXTRA $(decision_log "$2")
EOS
  chmod +x "$OUT/fleet$2.sh"
}
BPS="${KVFLEET_TRANSFER_BPS:-0.5e9}"
EXTRA=""
for a in ${KVFLEET_TRANSFER_ROUTER_ARGS:-}; do EXTRA="$EXTRA --router-arg=$a"; done
fleet "--router-arg=--transfer-bytes-per-s=$BPS --worker-arg=--mock-transfer-bytes-per-s=$BPS" ""
fleet "--router-arg=--transfer-bytes-per-s=0" "-nopull"
python3 "$HERE/conversation_trace.py" --rate 40 --duration "${KVFLEET_CONV_TRACE_S:-60}" --think-s 5 --seed "${KVFLEET_CONV_SEED:-1}" >"$OUT/conv40.jsonl"
run() {  # name trace scale [duration warmup]
  local duration="${4:-$DURATION}" warmup="${5:-0}"
  echo "== $1 (time scale $3, $duration s, warm-up $warmup s); uptime: $(uptime)"
  "$BIN/kvfleet" bench --router "http://127.0.0.1:$PORT" --trace "$2" --time-scale "$3" --length-scale 4 \
    --duration "$duration" --warmup-s "$warmup" --compare kv,approx,preble --fleet-cmd "$OUT/fleet.sh" \
    --fleet-workers 8 --ttft-slo-ms 1000 --out "$OUT/$1.json" $(requests_out "$1") --quiet 2>&1 | grep -v "^bench: \|^kvfleet up"
  echo "-- kv without pulls (--transfer-bytes-per-s 0):"
  "$BIN/kvfleet" bench --router "http://127.0.0.1:$PORT" --trace "$2" --time-scale "$3" --length-scale 4 \
    --duration "$duration" --warmup-s "$warmup" --compare kv --fleet-cmd "$OUT/fleet-nopull.sh" \
    --fleet-workers 8 --ttft-slo-ms 1000 --out "$OUT/$1-nopull.json" $(requests_out "$1-nopull") --quiet 2>&1 | grep -v "^bench: \|^kvfleet up"
}
for row in ${KVFLEET_CONV_ROWS:-2.0x:2.23}; do
  IFS=: read -r name scale duration warmup <<<"$row"
  run "conv40-$name" "$OUT/conv40.jsonl" "$scale" "$duration" "$warmup"
done
if [ -z "${KVFLEET_TRANSFER_QUICK:-}" ]; then
  for row in ${KVFLEET_MOONCAKE_ROWS:-0.9x:15.28 1.3x:20.54}; do
    IFS=: read -r name scale duration warmup <<<"$row"
    run "mooncake-$name" "$TRACE" "$scale" "$duration" "$warmup"
  done
fi
# KVFLEET_TRANSFER_DIAG=1: one more kv run of the Mooncake trace at 1.3x on each fleet (with pulls,
# then without), left up, then the router's pull decisions and the workers' pull outcomes and
# evictions from /metrics.
if [ -n "${KVFLEET_TRANSFER_DIAG:-}" ]; then
  for f in "" -nopull; do
    echo "== diagnosis: kv$f, mooncake-1.3x, pulls by outcome, evictions"
    "$OUT/fleet$f.sh" >"$OUT/diag-fleet$f.log" 2>&1 &
    fpid=$!
    for _ in $(seq 100); do get "http://127.0.0.1:$PORT/ready" >/dev/null && break; sleep 0.3; done
    "$BIN/kvfleet" bench --router "http://127.0.0.1:$PORT" --trace "$TRACE" --time-scale 20.54 --length-scale 4 \
      --duration "$DURATION" --policy kv --ttft-slo-ms 1000 --quiet 2>&1 | grep -v "^bench: "
    get "http://127.0.0.1:$PORT/metrics" | grep -E "^kvfleet_router_(pull|passed_over)"
    for i in $(seq 0 7); do get "http://127.0.0.1:$((PORT + 100 + i))/metrics"; done |
      grep -E "^kvfleet_worker_(kv_(pulls_total|pull_fallbacks_total|imported|served_total|pulled_bytes|pull_seconds|serve_waits)|evictions_total)" |
      sed -E 's/source="[^"]*",?//; s/\{\}//' |
      awk '{k=$1; v[k]+=$2} END {for (k in v) printf "%s %.3f\n", k, v[k]}' | sort
    kill "$fpid"; wait "$fpid" 2>/dev/null
    sleep 1
  done
fi
echo "uptime at end: $(uptime)"
