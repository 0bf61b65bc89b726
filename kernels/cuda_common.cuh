// Small device helpers shared by the kernels: 16-byte bf16 vectors, warp reductions and the
// launcher's error return. Header-only, device code; include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kvfleet::kernels {

// log2(e): the kernels fold it into the softmax scale and use exp2f.
constexpr float kLog2e = 1.4426950408889634f;

// Returns the launch error of the kernel just launched, if any.
#define KVF_RETURN_LAUNCH_ERROR()              \
  do {                                         \
    cudaError_t _kvf_err = cudaGetLastError(); \
    if (_kvf_err != cudaSuccess) return _kvf_err; \
  } while (0)

// 8 bf16 <-> 8 floats through one 16-byte access.
__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 FloatToBf16x8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// Read-only, streaming 16-byte load (the KV cache and weights are read once per launch).
__device__ __forceinline__ uint4 LoadStreaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int kWidth = 32>
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kWidth = 32>
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace kvfleet::kernels
