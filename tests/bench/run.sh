#!/usr/bin/env bash
# Builds the benchmarks (target kvfleet_benches: the default build leaves them out), runs every
# CPU benchmark in build/bench/ and writes what they print to tests/bench/results/cpu-<host>.txt. Each benchmark runs
# pinned to one core where it measures one core.
#   tests/bench/run.sh [name-filter]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH="${BENCH_DIR:-$ROOT/build/bench}"
if [ -z "${BENCH_DIR:-}" ]; then
  cmake --build "$ROOT/build" --target kvfleet_benches || { echo "bench: building kvfleet_benches failed" >&2; exit 1; }
fi
OUTDIR="$ROOT/tests/bench/results"
mkdir -p "$OUTDIR"
out="$OUTDIR/cpu-$(hostname -s).txt"
filter="${1:-}"
{
  echo "# kvfleet CPU benchmarks, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  for b in "$BENCH"/*; do
    [ -x "$b" ] || continue
    name="$(basename "$b")"
    [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
    echo; echo "## $name"
    timeout 600 "$b" || echo "($name exited $?)"
  done
} 2>&1 | tee "$out"
echo "wrote $out"
