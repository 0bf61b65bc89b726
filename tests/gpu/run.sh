#!/usr/bin/env bash
# Runs every GPU test and benchmark of an unpacked bundle (deploy/bundle.sh). Builds nothing.
#
#   run.sh [BUNDLE_DIR [RESULTS_DIR]]
#     BUNDLE_DIR: defaults to this script's folder when it holds bin/ (the bundle's copy),
#                 else $KVFLEET_BUNDLE, else .bundle/kvfleet
#     RESULTS_DIR: defaults to BUNDLE_DIR/results; gets results.txt (the summary), one log per
#                  test, bench.txt, and sanitizer logs
#   KVFLEET_GPU_SANITIZERS="memcheck racecheck"  compute-sanitizer tools run over each GPU test
#                                                ("" for none)
#   KVFLEET_GPU_FULL=1                           the long cases at full length (the 1M-token
#                                                stream, about 8 more minutes on an H200);
#                                                without it the tests fit one 10-minute call
#   KVFLEET_GPU_BENCH=0                          skip the benchmarks
#   KVFLEET_BENCH_ARGS="--quick"                 arguments for the kernel bench
#   KVFLEET_BENCH_MODEL=DIR                      also run cuda_backend_bench over that model
#                                                (e.g. kvfleet make-model --shape llama-3.1-8b or qwen3-8b),
#                                                then the same model through HF transformers
#                                                (hf_transformers_bench.py) for the side by side
#   KVFLEET_HF_BENCH=0                           skip the transformers side by side
# Exits non-zero when any test or sanitizer run fails.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -ge 1 ]; then BUNDLE="$1"; elif [ -d "$HERE/bin" ]; then BUNDLE="$HERE"; else BUNDLE="${KVFLEET_BUNDLE:-.bundle/kvfleet}"; fi
BUNDLE="$(cd "$BUNDLE" && pwd)"
RESULTS="${2:-$BUNDLE/results}"
mkdir -p "$RESULTS"
SANITIZERS="${KVFLEET_GPU_SANITIZERS-memcheck racecheck}"

# CUDA libraries come from the target: the toolkit, or the pip wheels of its Python.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
if command -v python3 >/dev/null; then
  site="$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)"
  for d in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  done
fi
export LD_LIBRARY_PATH
# The parity test's references and the tokenizer its models are built with (bundle.sh).
[ -d "$BUNDLE/data/model" ] && export KVFLEET_TEST_DATA="$BUNDLE/data"
[ -d "$BUNDLE/cache/npm" ] && export KVFLEET_CACHE="$BUNDLE/cache"
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"

summary="$RESULTS/results.txt"
{
  echo "kvfleet GPU results, $(date -u +%FT%TZ), bundle commit $(cat "$BUNDLE/COMMIT" 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/device: /'
} > "$summary"
fail=0
while IFS=$'\t' read -r name labels exe; do
  case ",$labels," in *,gpu,*) ;; *) continue ;; esac
  t0=$(date +%s%N)
  timeout 600 "$BUNDLE/$exe" > "$RESULTS/$name.log" 2>&1
  rc=$?
  dt=$(( ($(date +%s%N) - t0) / 1000000 ))
  status=$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)")
  [ $rc -eq 0 ] || fail=1
  echo "test $name: $status ${dt} ms; $(grep -E '^\[doctest\] (test cases|assertions)' "$RESULTS/$name.log" | tr '\n' ' ')" >> "$summary"
  for tool in $SANITIZERS; do
    [ -n "$SAN" ] || { echo "sanitizer $tool $name: SKIPPED (no compute-sanitizer)" >> "$summary"; continue; }
    # KVFLEET_UNDER_SANITIZER: the sanitizer serialises kernels, so tests skip what needs two
    # kernels running at once (tensor parallelism's device-side barrier), saying so.
    KVFLEET_UNDER_SANITIZER="$tool" timeout 900 "$SAN" --tool "$tool" --error-exitcode 99 "$BUNDLE/$exe" \
      > "$RESULTS/$name.$tool.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || fail=1
    echo "sanitizer $tool $name: $([ $rc -eq 0 ] && echo CLEAN || echo "FAIL(rc=$rc)"); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$RESULTS/$name.$tool.log" | tail -1)" >> "$summary"
  done
done < "$BUNDLE/tests.tsv"

if [ "${KVFLEET_GPU_BENCH:-1}" != 0 ]; then
  for b in "$BUNDLE"/bin/kvfleet_*bench; do
    [ -x "$b" ] || continue
    timeout 600 "$b" ${KVFLEET_BENCH_ARGS:-} > "$RESULTS/$(basename "$b").txt" 2>&1 || { fail=1; echo "bench $(basename "$b"): FAILED" >> "$summary"; }
    sed -n '/^summary/,$p' "$RESULTS/$(basename "$b").txt" >> "$summary"
  done
  if [ -n "${KVFLEET_BENCH_MODEL:-}" ] && [ -x "$BUNDLE/bin/cuda_backend_bench" ]; then
    timeout 600 "$BUNDLE/bin/cuda_backend_bench" --model "$KVFLEET_BENCH_MODEL" > "$RESULTS/cuda_backend_bench.txt" 2>&1 ||
      { fail=1; echo "bench cuda_backend_bench: FAILED" >> "$summary"; }
    grep -E '^(device|decode|prefill|copy|cuBLASLt)' "$RESULTS/cuda_backend_bench.txt" >> "$summary"
    if [ "${KVFLEET_HF_BENCH:-1}" != 0 ] && [ -f "$BUNDLE/hf_transformers_bench.py" ] &&
       python3 -c 'import torch, transformers' 2>/dev/null; then
      PYTHONUNBUFFERED=1 timeout 900 python3 "$BUNDLE/hf_transformers_bench.py" --model "$KVFLEET_BENCH_MODEL" \
        --kvfleet-log "$RESULTS/cuda_backend_bench.txt" > "$RESULTS/hf_transformers_bench.txt" 2>&1 ||
        { fail=1; echo "bench hf_transformers_bench: FAILED" >> "$summary"; }
      grep -E '^(hf |side by side|  decode|  prefill)' "$RESULTS/hf_transformers_bench.txt" >> "$summary"
    fi
  fi
fi
echo "overall: $([ $fail -eq 0 ] && echo PASS || echo FAIL)" >> "$summary"
cat "$summary"
exit $fail
