// Small device helpers shared by the kernels: 16-byte bf16 vectors, bf16 rounding, warp
// reductions and the launcher's error return. Header-only, device code; include from .cu
// files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launch.h"

namespace kvfleet::kernels {

// log2(e): the kernels fold it into the softmax scale and use exp2f.
constexpr float kLog2e = 1.4426950408889634f;

// Returns the launch error of the kernel just launched, if any.
#define KVF_RETURN_LAUNCH_ERROR()              \
  do {                                         \
    cudaError_t _kvf_err = cudaGetLastError(); \
    if (_kvf_err != cudaSuccess) return _kvf_err; \
  } while (0)

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent launch
// when it is on (launch.h). The kernel must call GridDependencyWait() before it reads or
// writes anything an earlier kernel of the stream writes or reads.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = ProgrammaticDependentLaunch() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (e != cudaSuccess) cudaGetLastError();  // not left behind for the next launcher's check
  return e;
}

// PDL (launch.h): waits until the previous kernel of the stream has completed and its writes
// are visible. A no-op when the kernel was launched without PDL.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// PDL: lets the next kernel of the stream be scheduled once every block of this one has
// called it (or exited). It still waits in GridDependencyWait() for this one to complete.
__device__ __forceinline__ void GridDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

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

// The value a float takes once stored as bf16 (round to nearest even): the kernels round
// each op's result as a bf16 model does.
__device__ __forceinline__ float Bf16Round(float v) { return __bfloat162float(__float2bfloat16(v)); }

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
