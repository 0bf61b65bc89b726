#!/usr/bin/env bash
# One router against four, with and without their shared state (gossip), on 8 mock workers:
# the Mooncake synthetic trace and conversation_trace.py, each at two loads. Every row runs on a
# freshly started fleet (`kvfleet up --routers N [--no-gossip]`) with the kv policy; the bench's
# clients go to the routers in turn (request i to router i mod N).
#
#   tests/bench/fleet/routers_compare.sh KVFLEET_BIN_DIR MOONCAKE_TRACE OUT_DIR [DURATION_S]
#
# Loads: the time scales of tests/bench/fleet/transfer_compare.sh, measured for the same mock
# fleet (length scale 4): Mooncake 15.28 (0.9x) and 20.54 (1.3x); the conversation trace at
# 40 conversations/s is 2.0x at time scale 2.23, so 0.9x and 1.3x are scales 1.00 and 1.45.
# KVFLEET_ROUTERS_TRACES (default "mooncake conv") runs the named traces only, and
# KVFLEET_ROUTERS_LOADS (default "0.9x 1.3x") the named loads, KVFLEET_ROUTERS_CONFIGS (default
# "one gossip none") the named fleets; KVFLEET_ROUTER_EXTRA adds kvfleet-router arguments to every
# router (e.g. "--gossip-interval-ms 10");
# KVFLEET_BENCH_PORT (default 27000) is the first of 300 ports used. Prints one table per
# trace and load (the bench's own), JSON under OUT_DIR, where router_gossip_frames and
# router_gossip_bytes are what the routers' gossip sent during the run (summed over them).
# Gossip is sent on change by default; KVFLEET_ROUTER_EXTRA="--gossip-on-change=false" gives
# the timer alone (every --gossip-interval-ms), as before 2026-11-30.
set -uo pipefail
BIN="$(cd "$1" && pwd)"; TRACE="$2"; OUT="$3"; DURATION="${4:-25}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$OUT"
PORT="${KVFLEET_BENCH_PORT:-27000}"
TRACES="${KVFLEET_ROUTERS_TRACES:-mooncake conv}"
LOADS="${KVFLEET_ROUTERS_LOADS:-0.9x 1.3x}"
CONFIGS="${KVFLEET_ROUTERS_CONFIGS:-one gossip none}"
EXTRA=""
for a in ${KVFLEET_ROUTER_EXTRA:-}; do EXTRA="$EXTRA --router-arg=$a"; done
fleet() {  # fleet.sh NAME ROUTERS [FLAGS]: a fleet for `kvfleet bench --fleet-cmd`
  cat >"$OUT/fleet-$1.sh" <<EOS
#!/usr/bin/env bash
exec "$BIN/kvfleet" up --backend mock --workers 8 --routers $2 $3 --http-port $PORT --registration-port $((PORT + 10)) \
  --gossip-base-port $((PORT + 20)) --worker-base-port $((PORT + 100)) --worker-http-base-port $((PORT + 200)) \
  --log-dir "$OUT/logs-$1" --router-bin "$BIN/kvfleet-router" --worker-bin "$BIN/kvfleet-worker"$EXTRA
EOS
  chmod +x "$OUT/fleet-$1.sh"
}
fleet one 1 ""
fleet gossip 4 ""
fleet none 4 "--no-gossip"
urls() { local u="" i; for ((i = 0; i < $1; i++)); do u+="${u:+,}http://127.0.0.1:$((PORT + i))"; done; echo "$u"; }
python3 "$HERE/conversation_trace.py" --rate 40 --duration 60 --think-s 5 --seed 1 >"$OUT/conv40.jsonl"
run() {  # name trace scale
  [[ " $LOADS " == *" ${1#*-} "* ]] || return 0
  echo "== $1 (time scale $3); uptime: $(uptime)"
  local config n
  for config in one:1 gossip:4 none:4; do
    n="${config#*:}"; config="${config%%:*}"
    [[ " $CONFIGS " == *" $config "* ]] || continue
    echo "-- $config: $n router(s)"
    "$BIN/kvfleet" bench --router "$(urls "$n")" --trace "$2" --time-scale "$3" --length-scale 4 \
      --duration "$DURATION" --compare kv --fleet-cmd "$OUT/fleet-$config.sh" --ttft-slo-ms 1000 \
      --out "$OUT/$1-$config.json" --quiet 2>&1 | grep -v "^bench: \|^kvfleet up"
  done
}
for t in $TRACES; do
  case "$t" in
    mooncake) run mooncake-0.9x "$TRACE" 15.28; run mooncake-1.3x "$TRACE" 20.54 ;;
    conv) run conv-0.9x "$OUT/conv40.jsonl" 1.00; run conv-1.3x "$OUT/conv40.jsonl" 1.45 ;;
    *) echo "routers_compare: unknown trace $t" >&2; exit 2 ;;
  esac
done
echo "uptime at end: $(uptime)"
