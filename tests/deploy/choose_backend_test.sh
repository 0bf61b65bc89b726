#!/usr/bin/env bash
# deploy/choose-backend.sh with fake build caches and fake nvidia-smi lines: cuda only when
# the build has it and its kernels fit the GPU's compute capability.
set -uo pipefail
ROOT="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
. "$ROOT/deploy/choose-backend.sh"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0

# cache NAME LINE...: a CMakeCache.txt holding these lines.
cache() {
  local f="$TMP/$1"; shift
  printf '%s\n' "# This is the CMakeCache file." "$@" >"$f"
  echo "$f"
}
# expect WANT CACHE GPU: choose_backend's line must be WANT.
expect() {
  local got
  got="$(choose_backend "$2" "$3")"
  if [ "$got" != "$1" ]; then
    echo "FAIL: choose_backend $2 '$3'"; echo "  want: $1"; echo "  got:  $got"; failures=$((failures + 1))
  fi
}

H100="NVIDIA H100 80GB HBM3, 9.0"
A100="NVIDIA A100-SXM4-80GB, 8.0"
B200="NVIDIA B200, 10.0"
L4="NVIDIA L4, 8.9"
off="$(cache off 'KVFLEET_CUDA:BOOL=OFF' 'KVFLEET_CUDA_GENCODE:STRING=-gencode=arch=compute_90a,code=sm_90a')"
off_cli="$(cache off_cli 'KVFLEET_CUDA:UNINITIALIZED=OFF')"
hopper="$(cache hopper 'KVFLEET_CUDA:BOOL=ON' 'KVFLEET_CUDA_GENCODE:STRING=-gencode=arch=compute_90a,code=sm_90a')"
sm80="$(cache sm80 'KVFLEET_CUDA:BOOL=ON' 'KVFLEET_CUDA_GENCODE:STRING=-gencode=arch=compute_80,code=sm_80')"
ptx80="$(cache ptx80 'KVFLEET_CUDA:BOOL=ON' 'KVFLEET_CUDA_GENCODE:STRING=-gencode=arch=compute_80,code=[sm_80,compute_80]')"
arch90="$(cache arch90 'KVFLEET_CUDA:BOOL=ON' 'KVFLEET_CUDA_GENCODE:STRING=' 'CMAKE_CUDA_ARCHITECTURES:STRING=90')"
arch90a="$(cache arch90a 'KVFLEET_CUDA:BOOL=ON' 'CMAKE_CUDA_ARCHITECTURES:STRING=90a')"
archreal="$(cache archreal 'KVFLEET_CUDA:BOOL=ON' 'CMAKE_CUDA_ARCHITECTURES:STRING=80-real;90-real')"
native="$(cache native 'KVFLEET_CUDA:BOOL=ON' 'CMAKE_CUDA_ARCHITECTURES:STRING=native')"
arch_short="$(cache arch_short 'KVFLEET_CUDA:BOOL=ON' 'KVFLEET_CUDA_GENCODE:STRING=-arch=sm_90')"
none="$(cache none 'KVFLEET_CUDA:BOOL=ON' 'KVFLEET_CUDA_GENCODE:STRING=' 'CMAKE_CUDA_ARCHITECTURES:STRING=OFF')"

expect "cpu build has no CUDA" "$off" "$H100"
expect "cpu build has no CUDA" "$off_cli" "$H100"
expect "cpu no build configuration at $TMP/missing" "$TMP/missing" "$H100"
expect "cpu no NVIDIA GPU found" "$hopper" ""
expect "cuda NVIDIA H100 80GB HBM3, compute capability 9.0" "$hopper" "$H100"
expect "cpu GPU compute capability 8.0, build targets sm_90a" "$hopper" "$A100"
expect "cpu GPU compute capability 10.0, build targets sm_90a" "$hopper" "$B200"
expect "cpu nvidia-smi reports no compute capability for NVIDIA H100" "$hopper" "NVIDIA H100, [N/A]"
# sm_80 runs on 8.x; PTX for compute_80 on anything newer.
expect "cuda NVIDIA L4, compute capability 8.9" "$sm80" "$L4"
expect "cpu GPU compute capability 9.0, build targets sm_80" "$sm80" "$H100"
expect "cuda NVIDIA H100 80GB HBM3, compute capability 9.0" "$ptx80" "$H100"
# CMake's forms: 90 (real and virtual), 90a (exactly 9.0), NN-real, native.
expect "cuda NVIDIA B200, compute capability 10.0" "$arch90" "$B200"
expect "cpu GPU compute capability 8.0, build targets 90" "$arch90" "$A100"
expect "cuda NVIDIA H100 80GB HBM3, compute capability 9.0" "$arch90a" "$H100"
expect "cpu GPU compute capability 10.0, build targets 90a" "$arch90a" "$B200"
expect "cuda NVIDIA L4, compute capability 8.9" "$archreal" "$L4"
expect "cpu GPU compute capability 10.0, build targets 80-real 90-real" "$archreal" "$B200"
expect "cuda NVIDIA A100-SXM4-80GB, compute capability 8.0" "$native" "$A100"
expect "cuda NVIDIA B200, compute capability 10.0" "$arch_short" "$B200"
expect "cpu GPU compute capability 8.0, build targets 90" "$arch_short" "$A100"
expect "cpu build names no CUDA architectures" "$none" "$H100"

if [ "$failures" -ne 0 ]; then echo "$failures failed"; exit 1; fi
echo "choose_backend: all cases pass"
