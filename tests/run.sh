#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test this machine can run.
#
#   tests/run.sh            everything: unit, integration, sanitizers, fuzzers (bounded), GPU if present
#   KVFLEET_SANITIZERS="address thread"   which sanitizer passes to run ("" for none)
#   KVFLEET_FUZZ_SECONDS=20                how long each fuzzer runs
#
# The builds compile only what the tests use: no benchmarks (target kvfleet_benches), and the
# CUDA backend only where a GPU is present to run its tests.
#
# Exits non-zero when any test fails.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-$(nproc)}"
SANITIZERS="${KVFLEET_SANITIZERS-address thread}"
export KVFLEET_FUZZ_SECONDS="${KVFLEET_FUZZ_SECONDS:-20}"
export KVFLEET_CACHE="${KVFLEET_CACHE:-$HOME/.cache/kvfleet}"
# Sanitizer and fuzz builds: -O1 with line tables compiles markedly faster on 2 cores and
# still gives symbolized stack traces.
export SAN_OPT_FLAGS="-O1 -g1 -DNDEBUG"
failures=()
t0=$(date +%s)
stage() { echo; echo "=== tests/run.sh: $* ($(( $(date +%s) - t0 ))s)"; }

stage "dependencies"
deploy/install-deps.sh || { echo "FAILED: installing dependencies" >&2; exit 1; }
if [ -x tests/assets.sh ]; then
  tests/assets.sh || { echo "FAILED: test assets" >&2; exit 1; }
fi

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
if has_gpu; then cuda_flag=-UKVFLEET_CUDA; else cuda_flag=-DKVFLEET_CUDA=OFF; fi
stage "build (RelWithDebInfo, $([ "$cuda_flag" = -UKVFLEET_CUDA ] && echo "CUDA if nvcc is found" || echo "CUDA off: no GPU to test it on"))"
BUILD_DIR="$ROOT/build" deploy/build.sh "$cuda_flag" || { echo "FAILED: build" >&2; exit 1; }

stage "ctest (every label but gpu)"
CTEST_LOG="$(mktemp)"
trap 'rm -f "$CTEST_LOG"' EXIT
(cd build && ctest -LE gpu --output-on-failure -j "$JOBS" --timeout 600) 2>&1 | tee -a "$CTEST_LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || failures+=("ctest")

for san in $SANITIZERS; do
  case "$san" in
    address) label=asan ;;
    thread) label=tsan ;;
    *) echo "unknown sanitizer '$san'" >&2; failures+=("sanitizer $san"); continue ;;
  esac
  stage "sanitizer: $san (tests labelled $label)"
  dir="$ROOT/build-$label"
  if BUILD_DIR="$dir" BUILD_TARGET="kvfleet_${label}_tests" deploy/build.sh \
      -DKVFLEET_SANITIZE="$san" -DKVFLEET_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$SAN_OPT_FLAGS" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$SAN_OPT_FLAGS"; then
    (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      ctest -L "^$label\$" --output-on-failure -j "$JOBS" --timeout 900 --no-tests=ignore) 2>&1 | tee -a "$CTEST_LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || failures+=("$san")
  else
    failures+=("$san build")
  fi
done

if [ -x tests/fuzz/run.sh ]; then
  stage "fuzzers (${KVFLEET_FUZZ_SECONDS}s each)"
  tests/fuzz/run.sh || failures+=("fuzz")
fi

stage "GPU tests"
if has_gpu; then
  if [ -x tests/gpu/run.sh ]; then
    tests/gpu/run.sh || failures+=("gpu")
  fi
else
  echo "##################################################################"
  echo "# SKIPPED: GPU tests (tests/gpu/). This machine has no NVIDIA GPU. #"
  echo "##################################################################"
fi

stage "done"
# One closing count over every ctest pass above (each sanitizer pass counts its tests again).
read -r total failed < <(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\2 \1/p' "$CTEST_LOG" |
  awk '{t += $1; f += $2} END {print t + 0, f + 0}')
echo "summary: $((total - failed)) passed, $failed failed"
if [ ${#failures[@]} -ne 0 ]; then
  echo "tests/run.sh: FAILED: ${failures[*]}"
  exit 1
fi
echo "tests/run.sh: all passed"
