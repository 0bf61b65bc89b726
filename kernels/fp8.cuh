// Device helpers of the fp8 e4m3 KV cache (paged_kv.h): 8 values <-> 8 bytes through the
// hardware conversions (sm_89 and up). Quantising divides by the scale with IEEE rounding
// and saturates to +-448 (fp8.h is the host reference, bit for bit); dequantising to bf16 is
// exact (e4m3 has 3 mantissa bits, bf16 7, and every e4m3 exponent is a normal bf16), so the
// attention kernels fold the scales into their softmax scale (K) and output (V).
// Header-only, device code; include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kvfleet::kernels {

// Two e4m3 (low byte first) as two floats.
__device__ __forceinline__ float2 Fp8x2ToFloat2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(__half2(h));
}

// 8 e4m3 (one 8-byte word) as 8 floats, unscaled.
__device__ __forceinline__ void Fp8x8ToFloat(const uint2& v, float (&f)[8]) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = Fp8x2ToFloat2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// 8 e4m3 as 8 bf16 (one 16-byte word), unscaled and exact.
__device__ __forceinline__ uint4 Fp8x8ToBf16x8(const uint2& v) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&v);
  uint4 out;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = __float22bfloat162_rn(Fp8x2ToFloat2(h[i]));
  return out;
}

// e4m3(f / scale) of 8 floats as one 8-byte word.
__device__ __forceinline__ uint2 FloatToFp8x8(const float (&f)[8], float scale) {
  uint2 out;
  uint16_t* h = reinterpret_cast<uint16_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = make_float2(__fdiv_rn(f[2 * i], scale), __fdiv_rn(f[2 * i + 1], scale));
    h[i] = __nv_cvt_float2_to_fp8x2(x, __NV_SATFINITE, __NV_E4M3);
  }
  return out;
}

}  // namespace kvfleet::kernels
