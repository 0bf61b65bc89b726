#!/usr/bin/env bash
# Router scale bench: builds kvfleet and kvfleet-router, then runs router_scale_bench.py (one
# router and `kvfleet simulate` with N workers, for each N) with the arguments given.
#   tests/bench/fleet/router_scale_bench.sh                      # N = 100, 500, 1000; 60 s each
#   tests/bench/fleet/router_scale_bench.sh --workers 100 --duration 3600
# Figures go to stdout; keep them in tests/bench/results/ with the command that made them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
if [ -z "${NO_BUILD:-}" ]; then
  BUILD_DIR="$BUILD_DIR" BUILD_TARGET="kvfleet kvfleet-router" "$ROOT/deploy/build.sh" >&2
fi
exec "$ROOT/tests/bench/fleet/router_scale_bench.py" --kvfleet "$BUILD_DIR/cli/kvfleet" \
  --router-bin "$BUILD_DIR/router/kvfleet-router" "$@"
