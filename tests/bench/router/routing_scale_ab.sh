#!/usr/bin/env bash
# Runs routing_scale_bench at a base commit and at this checkout side by side: for each fleet
# size, the base's binary then this one's, with the same flags (same index, same requests).
#
#   tests/bench/router/routing_scale_ab.sh BASE_REV [--workers 100,500,1000] [bench flags...]
#
# The base is checked out in a scratch worktree ($AB_DIR, default /tmp/kvfleet-routing-ab)
# and built there (one job, RelWithDebInfo: ccache serves what both trees share).
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
if [[ ! -d "$AB_DIR" ]]; then
  git -C "$ROOT" worktree add --detach "$AB_DIR" "$BASE" >/dev/null
else
  git -C "$AB_DIR" checkout --detach -q "$BASE"
fi
build() {  # $1: the source tree
  JOBS=1 BUILD_DIR="$1/build" BUILD_TARGET=routing_scale_bench "$1/deploy/build.sh" \
    -DKVFLEET_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
}
build "$AB_DIR"
build "$ROOT"
echo "base $(git -C "$AB_DIR" rev-parse --short HEAD), head $(git -C "$ROOT" rev-parse --short HEAD)" \
  "$(git -C "$ROOT" diff --quiet HEAD || echo '(with uncommitted changes)'), flags: ${FLAGS[*]:-none}"
for n in ${WORKERS//,/ }; do
  echo "== base, N=$n"
  "$AB_DIR/build/bench/routing_scale_bench" --workers "$n" "${FLAGS[@]}"
  echo "== head, N=$n"
  "$ROOT/build/bench/routing_scale_bench" --workers "$n" "${FLAGS[@]}"
done
