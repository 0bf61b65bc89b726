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

#include "kernels/fp8.h"

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

// 4 e4m3 (one word, low byte first) as 4 bf16, unscaled and exact: x = (v0, v1), y = (v2, v3)
// as bf16x2. Bit moves and one bf16x2 multiply per pair (fp8.h, Fp8PairToScaledBf16Pair) on
// the integer and FMA pipes: the cvt path above spends 4 conversion-unit instructions per pair
// (e4m3x2 -> f16x2, 2x f16 -> f32, f32x2 -> bf16x2) on a unit with a fraction of their rate.
__device__ __forceinline__ uint2 Fp8x4ToBf16x4(uint32_t v) {
  const __nv_bfloat162 rebias = __float2bfloat162_rn(kFp8ToBf16Rebias);
  uint32_t x = Fp8PairToScaledBf16Pair(__byte_perm(v, 0u, 0x1404));  // [0, b0, 0, b1]
  uint32_t y = Fp8PairToScaledBf16Pair(__byte_perm(v, 0u, 0x3424));  // [0, b2, 0, b3]
  *reinterpret_cast<__nv_bfloat162*>(&x) = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&x), rebias);
  *reinterpret_cast<__nv_bfloat162*>(&y) = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&y), rebias);
  return make_uint2(x, y);
}

// 8 e4m3 as 8 bf16 (one 16-byte word), unscaled and exact.
__device__ __forceinline__ uint4 Fp8x8ToBf16x8(const uint2& v) {
  const uint2 lo = Fp8x4ToBf16x4(v.x), hi = Fp8x4ToBf16x4(v.y);
  return make_uint4(lo.x, lo.y, hi.x, hi.y);
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
