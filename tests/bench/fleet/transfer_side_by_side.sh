#!/usr/bin/env bash
# Issue rows for KV transfer with the compared fleets running at once: for each seed and row, one
# fleet of 8 mock workers per name, all started together, so that every policy of a row meets the
# same host load (transfer_compare.sh runs them one after another).
#   tests/bench/fleet/transfer_side_by_side.sh KVFLEET_BIN_DIR MOONCAKE_TRACE OUT_DIR "SEEDS" "ROWS"
# SEEDS: e.g. "41 42 43"; a seed names a round, and is the conversation trace's --seed.
# ROWS: any of conv09 (conversations at 0.9x: time scale 1.25), conv13 (1.3x: 1.81), conv20 (2.0x:
# 2.23; the conversations reuse ~70% of their tokens, so 2.0x offered is their loaded point), mc09 (the
# Mooncake trace at 0.9x: 15.28, past its first 7 s) and mc13 (1.3x: 20.54, past its first 7 s);
# every row replays 25 s (conversations) or 32 s (Mooncake) at length scale 4.
# NAMES (default "kv nopull approx preble"; letters, digits and _): the fleets. kv, approx,
# preble: that routing policy with pulls priced at KVFLEET_TRANSFER_BPS (default 25e9, router
# --transfer-bytes-per-s, the mock's --mock-transfer-bytes-per-s); nopull: kv with
# --transfer-bytes-per-s 0. KVFLEET_WORKER_BIN_<NAME> (e.g. KVFLEET_WORKER_BIN_kv2=/path/kvfleet-worker
# with NAMES="kv kv2"; the name's policy is then kv) runs that fleet on another worker binary, to
# compare two workers side by side.
# KVFLEET_FLEET_ARGS: more `kvfleet up` arguments for every fleet (e.g.
# "--worker-arg=--host-cache-bytes=28991029248" gives each worker a host tier);
# KVFLEET_FLEET_ARGS_<NAME>, when set (even empty), replaces them for that fleet.
# Writes OUT_DIR/s<seed>/<name>/<row>[-nopull].json (`kvfleet bench --out`; pooled_ttft.py reads
# OUT_DIR/s*/*) and prints, per row and name, each seed's TTFT mean/p99 (ms), cached/ideal ratio
# and the router's pulls, then the four standard fleets' TTFT pooled over the seeds.
set -uo pipefail
BIN="$(cd "$1" && pwd)"; TRACE="$2"; OUT="$3"; SEEDS="$4"; ROWS="$5"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NAMES="${KVFLEET_NAMES:-${NAMES:-kv nopull approx preble}}"
BPS="${KVFLEET_TRANSFER_BPS:-25e9}"
mkdir -p "$OUT"

row_args() {  # row -> trace time-scale duration warm-up
  case "$1" in
    conv09) echo "conv 1.25 25 0" ;;
    conv13) echo "conv 1.81 25 0" ;;
    conv20) echo "conv 2.23 25 0" ;;
    mc09) echo "mc 15.28 32 7" ;;
    mc13) echo "mc 20.54 32 7" ;;
    *) echo "transfer_side_by_side: unknown row '$1' (conv09 conv13 conv20 mc09 mc13)" >&2; return 1 ;;
  esac
}

one() {  # seed row name index
  local seed="$1" row="$2" name="$3" i="$4" kind scale duration warmup trace policy router_bps suffix=""
  read -r kind scale duration warmup <<<"$(row_args "$row")" || return 1
  trace="$TRACE"; [ "$kind" = conv ] && trace="$OUT/conv-s$seed.jsonl"
  policy="$name"; router_bps="$BPS"
  case "$name" in
    nopull) policy=kv; router_bps=0; suffix=-nopull ;;
    approx|preble|kv|llmd|dynamo|round_robin|least_loaded) ;;
    *) policy=kv ;;
  esac
  local worker_var="KVFLEET_WORKER_BIN_$name" port=$((29600 + 1000 * i)) dir="$OUT/s$seed/$name"
  local worker_bin="${!worker_var:-$BIN/kvfleet-worker}" args_var="KVFLEET_FLEET_ARGS_$name"
  local fleet_args="${!args_var-${KVFLEET_FLEET_ARGS:-}}"
  mkdir -p "$dir"
  cat >"$dir/fleet.sh" <<EOS
#!/usr/bin/env bash
exec "$BIN/kvfleet" up --backend mock --workers 8 --http-port $port --registration-port $((port + 1)) \
  --worker-base-port $((port + 10)) --worker-http-base-port $((port + 100)) --log-dir "$dir/logs-$row" \
  --router-bin "$BIN/kvfleet-router" --worker-bin "$worker_bin" \
  --router-arg=--transfer-bytes-per-s=$router_bps --worker-arg=--mock-transfer-bytes-per-s=$BPS $fleet_args
EOS
  chmod +x "$dir/fleet.sh"
  "$BIN/kvfleet" bench --router "http://127.0.0.1:$port" --trace "$trace" --time-scale "$scale" --length-scale 4 \
    --duration "$duration" --warmup-s "$warmup" --compare "$policy" --fleet-cmd "$dir/fleet.sh" \
    --fleet-workers 8 --ttft-slo-ms 1000 --out "$dir/$row$suffix.json" --quiet >"$dir/$row.log" 2>&1 ||
    echo "transfer_side_by_side: s$seed $row $name failed (exit $?): $(tail -3 "$dir/$row.log")" >&2
}

for name in $NAMES; do
  [[ "$name" =~ ^[A-Za-z0-9_]+$ ]] || { echo "transfer_side_by_side: fleet name '$name': letters, digits and _ only" >&2; exit 2; }
done
for row in $ROWS; do row_args "$row" >/dev/null || exit 2; done

for seed in $SEEDS; do
  python3 "$HERE/conversation_trace.py" --rate 40 --duration 75 --think-s 5 --seed "$seed" >"$OUT/conv-s$seed.jsonl"
  for row in $ROWS; do
    echo "== s$seed $row; uptime: $(uptime)"
    i=0
    for name in $NAMES; do
      one "$seed" "$row" "$name" "$i" &
      i=$((i + 1))
    done
    wait
  done
done

python3 - "$OUT" "$ROWS" "$NAMES" "$SEEDS" <<'EOF'
import json, os, sys
out, rows, names, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
for row in rows:
    print(f"# {row}: TTFT mean/p99 ms, cached/ideal, router pulls")
    for name in names:
        cells = []
        for s in seeds:
            base = os.path.join(out, f"s{s}", name, row + ("-nopull" if name == "nopull" else ""))
            try:
                r = json.load(open(base + ".json"))["runs"][0]
            except (OSError, ValueError, KeyError, IndexError):
                cells.append(f"s{s} (no result)")
                continue
            t = r["ttft_ms"]
            cells.append(f"s{s} {t['mean']:.2f}/{t['p99']:.1f} {r['cached_token_ratio']:.3f}/"
                         f"{r['ideal_cached_token_ratio']:.3f} {int(r['router_pulls'])}"
                         + (f" failed {r['failed']}" if r["failed"] else ""))
        print(f"  {name:8s} " + " | ".join(cells))
EOF
# Pooled over the seeds (pooled_ttft.py), for the four standard fleets: another name's runs would
# join the pool of their policy.
pooled=()
for seed in $SEEDS; do
  for name in kv nopull approx preble; do
    [ -d "$OUT/s$seed/$name" ] && pooled+=("$OUT/s$seed/$name")
  done
done
[ ${#pooled[@]} -gt 0 ] && python3 "$HERE/pooled_ttft.py" "${pooled[@]}"
echo "uptime at end: $(uptime)"
