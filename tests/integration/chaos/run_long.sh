#!/usr/bin/env bash
# The long chaos and soak runs of issue 9 (not in ctest: about 20 minutes in all).
#   tests/integration/chaos/run_long.sh [BUILD_DIR [ASAN_BUILD_DIR]] [-- SCENARIO...]
# BUILD_DIR (default build) holds kvfleet, kvfleet-router and kvfleet-worker; ASAN_BUILD_DIR
# (default build-asan, -DKVFLEET_SANITIZE=address) the ASan router and worker for the
# sanitizer soak, skipped when they are missing. Scenarios (default all): kill drop
# router_restart soak asan_soak. Results: tests/bench/results/<date>-chaos-<scenario>.json
# and a one-line summary each in <date>-chaos-summary.txt; run logs under $WORK
# (default /tmp/kvfleet-chaos).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=$root/build
asan=$root/build-asan
if (( $# )) && [[ $1 != -- ]]; then build=$1; shift; fi
if (( $# )) && [[ $1 != -- ]]; then asan=$1; shift; fi
if (( $# )) && [[ $1 == -- ]]; then shift; fi
scenarios=(kill drop router_restart soak asan_soak)
(( $# )) && scenarios=("$@")
work=${WORK:-/tmp/kvfleet-chaos}
results=$root/tests/bench/results
day=$(date -u +%F)
summary=$results/$day-chaos-summary.txt
bins=(--kvfleet "$build/cli/kvfleet" --router-bin "$build/router/kvfleet-router" --worker-bin "$build/worker/kvfleet-worker")
rc=0
run() {  # name, chaos.py arguments...
  local name=$1; shift
  local out=$results/$day-chaos-$name.json
  echo "== $name: chaos.py $*" >&2
  "$here/chaos.py" "$@" --work "$work/$name" --out "$out"
  local r=$?
  python3 - "$out" "$name" "$*" >>"$summary" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: {'PASSED' if r['passed'] else 'FAILED'}  chaos.py {sys.argv[3]}")
for k, v in r["figures"].items():
    if k != "rss_kb_series":
        print(f"  {k} = {v}")
for f in r["failures"]:
    print(f"  failure: {f}")
PY
  (( r == 0 )) || rc=1
}
echo "# $(date -u +%FT%TZ) $(nproc) cores; load average at start of each run in its figures" >>"$summary"
for s in "${scenarios[@]}"; do
  case $s in
    kill) run kill "${bins[@]}" --scenario kill --duration-s 120 --rate 15 --workers 4 --port-base 22000 ;;
    drop) run drop "${bins[@]}" --scenario drop --duration-s 60 --rate 15 --workers 4 --port-base 22200 ;;
    router_restart) run router_restart "${bins[@]}" --scenario router_restart --duration-s 60 --rate 15 --workers 4 --port-base 22400 ;;
    soak) run soak "${bins[@]}" --scenario soak --duration-s 600 --rate 15 --workers 4 --port-base 22600 ;;
    asan_soak)
      if [[ -x $asan/router/kvfleet-router && -x $asan/worker/kvfleet-worker ]]; then
        ASAN_OPTIONS=detect_leaks=1 run asan_soak --kvfleet "$build/cli/kvfleet" --router-bin "$asan/router/kvfleet-router" \
          --worker-bin "$asan/worker/kvfleet-worker" --scenario soak --asan --duration-s 60 --rate 5 --workers 2 --port-base 22800
      else
        echo "asan_soak: skipped, no ASan build in $asan" | tee -a "$summary" >&2
      fi ;;
    *) echo "unknown scenario $s" >&2; rc=2 ;;
  esac
done
exit $rc
