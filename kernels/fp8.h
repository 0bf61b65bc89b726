// FP8 e4m3 (OCP "E4M3FN": bias 7, no infinities, one NaN code per sign) <-> float for host
// code: the CPU references of the fp8 KV cache and its tests. Matches CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round to nearest even, finite values
// beyond +-448 (and +-inf) saturate to +-448, NaN stays NaN (0x7f with the sign).
// A stored KV element is e4m3(x / scale); it reads back as e4m3 * scale (paged_kv.h).
// Thread-safe (pure functions).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_mask.h"  // KVF_HD
#include "kernels/bf16.h"

namespace kvfleet::kernels {

using fp8_bits = uint8_t;

constexpr float kFp8E4m3Max = 448.f;  // 1.75 * 2^8: the largest finite e4m3

inline float Fp8E4m3ToFloat(fp8_bits b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
  if (exp == 0xf && man == 7) return sign ? -std::nanf("") : std::nanf("");
  // exp 0: subnormal, man * 2^-9; else (1 + man / 8) * 2^(exp - 7).
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9) : std::ldexp(1.f + man / 8.f, exp - 7);
  return sign ? -mag : mag;
}

inline fp8_bits FloatToFp8E4m3(float x) {
  const fp8_bits sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= kFp8E4m3Max) return sign | 0x7e;
  // Below 2^-6 the step is 2^-9 (subnormals); a result of 8 steps is the code of 2^-6.
  if (a < 0x1p-6) return sign | static_cast<fp8_bits>(std::nearbyint(a * 512.0));
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int q = static_cast<int>(std::nearbyint((m * 2.0 - 1.0) * 8.0));  // mantissa steps, ties to even
  int exp = e - 1 + 7;
  if (q == 8) q = 0, ++exp;
  if (exp > 15 || (exp == 15 && q == 7)) return sign | 0x7e;  // rounded past 448
  return sign | static_cast<fp8_bits>(exp << 3 | q);
}

// e4m3 -> bf16 by bit moves, as the prefill kernel does it (fp8.cuh, Fp8x4ToBf16x4): `lanes`
// holds two e4m3 codes in the high bytes of its 16-bit halves ([0, b0, 0, b1], low byte first);
// the result holds two bf16 whose values are the e4m3 values times 2^-120 exactly (sign kept,
// eeee.mmm shifted into the low exponent and high mantissa bits: e4m3 bias 7, bf16 bias 127;
// the e4m3 subnormals land on bf16 subnormals). Multiplying by kFp8ToBf16Rebias restores them.
// The NaN codes (0x7f, 0xff) read as +-480: the quantiser saturates finite values, never writes them.
constexpr float kFp8ToBf16Rebias = 0x1p120f;
KVF_HD uint32_t Fp8PairToScaledBf16Pair(uint32_t lanes) {
  return (lanes & 0x80008000u) | ((lanes & 0x7f007f00u) >> 4);
}

// The value x takes once stored with this scale and read back.
inline float RoundTripFp8E4m3(float x, float scale) { return Fp8E4m3ToFloat(FloatToFp8E4m3(x / scale)) * scale; }

}  // namespace kvfleet::kernels
