#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test this machine can run.
#
#   tests/run.sh            everything: unit, integration, sanitizers, fuzzers (bounded), GPU if present
#   KVFLEET_SANITIZERS="address thread"   the sanitizer passes ("" for none). With address, the
#                                         one build that every CPU test runs in is ASan+UBSan
#                                         (build-asan); without it, a plain build (build-tests)
#   KVFLEET_FUZZ_SECONDS=20                how long each fuzzer runs
#
# Each build compiles only what the tests use: no benchmarks (target kvfleet_benches), and the
# CUDA backend only where a GPU is present (its tests need one), in the deploy build (build/)
# that tests/gpu/run.sh bundles.
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
# The test executables' own sources build at -O0 (KVFLEET_TEST_CXX_FLAGS): they are most of what
# these builds compile, and -O0 halves their code generation; the code under test keeps -O1.
SAN_FLAGS=(-DKVFLEET_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVFLEET_TEST_CXX_FLAGS=-O0
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$SAN_OPT_FLAGS" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$SAN_OPT_FLAGS")
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
failures=()
t0=$(date +%s)
stage() { echo; echo "=== tests/run.sh: $* ($(( $(date +%s) - t0 ))s)"; }
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

stage "dependencies"
deploy/install-deps.sh || { echo "FAILED: installing dependencies" >&2; exit 1; }
if [ -x tests/assets.sh ]; then
  tests/assets.sh || { echo "FAILED: test assets" >&2; exit 1; }
fi

CTEST_LOG="$(mktemp)"
trap 'rm -f "$CTEST_LOG"' EXIT

# Every CPU test (all labels but gpu) in one build: ASan+UBSan when the address pass is asked
# for, so the unit and integration tests are also the memory-safety pass.
case " $SANITIZERS " in
  *" address "*) dir="$ROOT/build-asan"; what="ASan+UBSan"; flags=(-DKVFLEET_SANITIZE=address "${SAN_FLAGS[@]}") ;;
  *) dir="$ROOT/build-tests"; what="plain"; flags=(-DKVFLEET_SANITIZE= -DKVFLEET_CUDA=OFF) ;;
esac
stage "build ($what, CUDA off, for the CPU tests)"
if BUILD_DIR="$dir" deploy/build.sh "${flags[@]}"; then
  stage "ctest ($what: every label but gpu)"
  (cd "$dir" && ctest -LE gpu --output-on-failure -j "$JOBS" --timeout 900) 2>&1 | tee -a "$CTEST_LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failures+=("ctest")
else
  failures+=("build")
fi

for san in $SANITIZERS; do
  case "$san" in
    address) continue ;;  # the ctest pass above
    thread) label=tsan ;;
    *) echo "unknown sanitizer '$san'" >&2; failures+=("sanitizer $san"); continue ;;
  esac
  stage "sanitizer: $san (tests labelled $label)"
  dir="$ROOT/build-$label"
  if BUILD_DIR="$dir" BUILD_TARGET="kvfleet_${label}_tests" deploy/build.sh -DKVFLEET_SANITIZE="$san" "${SAN_FLAGS[@]}"; then
    (cd "$dir" && ctest -L "^$label\$" --output-on-failure -j "$JOBS" --timeout 900 --no-tests=ignore) 2>&1 | tee -a "$CTEST_LOG"
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
  # The deploy build, with the CUDA backend: tests/gpu/run.sh runs a bundle of it.
  if BUILD_DIR="$ROOT/build" deploy/build.sh -UKVFLEET_CUDA && [ -x tests/gpu/run.sh ]; then
    deploy/bundle.sh "$ROOT/build" "$ROOT/.bundle/kvfleet" && tests/gpu/run.sh "$ROOT/.bundle/kvfleet" || failures+=("gpu")
  else
    failures+=("gpu build")
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
if [ "$failed" -gt 0 ]; then
  # The failing tests' own lines (doctest's assertions, sanitizer reports), again at the end: a
  # log kept only in part (its head and tail) still says what failed.
  echo "what the failing tests said (first 60 lines; their whole output is above):"
  grep -aE '\*\*\*(Failed|Timeout|Exception)|ERROR: |WARNING: ThreadSanitizer|runtime error: |TEST CASE: |^  values: ' \
    "$CTEST_LOG" | head -60
fi
if [ ${#failures[@]} -ne 0 ]; then
  echo "tests/run.sh: FAILED: ${failures[*]}"
  exit 1
fi
echo "tests/run.sh: all passed"
