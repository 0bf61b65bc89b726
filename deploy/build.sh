#!/usr/bin/env bash
# Configures and builds kvfleet into ${BUILD_DIR:-build}. Extra arguments go to cmake.
# Shared by tests/run.sh and deploy/quickstart.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
JOBS="${JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Relative paths and no working-directory hash: clones at other paths share the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
mkdir -p "$BUILD_DIR"
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja "$@" >"$BUILD_DIR/configure.log" 2>&1 || {
  cat "$BUILD_DIR/configure.log"; echo "build: cmake configure failed" >&2; exit 1; }
grep -E "^-- kvfleet" "$BUILD_DIR/configure.log" || true
cmake --build "$BUILD_DIR" -j "$JOBS" ${BUILD_TARGET:+--target $BUILD_TARGET}
