#!/usr/bin/env bash
# Runs routing_scale_bench at a base commit and at this checkout side by side: for each fleet
# size, the base's binary then this one's, with the same flags (same index, same requests).
#
#   tests/bench/router/routing_scale_ab.sh BASE_REV [--workers 100,500,1000] [bench flags...]
#
# The base's tree is extracted (git archive) into $AB_DIR/src (default /tmp/kvfleet-routing-ab)
# and built in $AB_DIR/build (one job, RelWithDebInfo: ccache serves what both trees share).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BASE="${1:?usage: routing_scale_ab.sh BASE_REV [--workers LIST] [bench flags...]}"
shift
WORKERS="100,500,1000"
FLAGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workers) WORKERS="$2"; shift 2 ;;
    *) FLAGS+=("$1"); shift ;;
  esac
done
AB_DIR="${AB_DIR:-/tmp/kvfleet-routing-ab}"
BASE_SHA="$(git -C "$ROOT" rev-parse --short "$BASE^{commit}")"
rm -rf "$AB_DIR/src"
mkdir -p "$AB_DIR/src"
# -m: files get the extraction time, so the kept build directory recompiles what changed.
git -C "$ROOT" archive "$BASE_SHA" | tar -x -m -C "$AB_DIR/src"
build() {  # $1: the source tree, $2: its build directory
  JOBS=1 BUILD_DIR="$2" BUILD_TARGET=routing_scale_bench "$1/deploy/build.sh" \
    -DKVFLEET_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
}
build "$AB_DIR/src" "$AB_DIR/build"
build "$ROOT" "$ROOT/build"
echo "base $BASE_SHA, head $(git -C "$ROOT" rev-parse --short HEAD)" \
  "$(git -C "$ROOT" diff --quiet HEAD || echo '(with uncommitted changes)'), flags: ${FLAGS[*]:-none}"
for n in ${WORKERS//,/ }; do
  echo "== base, N=$n"
  "$AB_DIR/build/bench/routing_scale_bench" --workers "$n" "${FLAGS[@]}"
  echo "== head, N=$n"
  "$ROOT/build/bench/routing_scale_bench" --workers "$n" "${FLAGS[@]}"
done
