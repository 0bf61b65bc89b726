// bf16 <-> float conversion for host code (CPU references and tests).
// A bf16 value is stored as its 16 raw bits (uint16_t), bit-identical to CUDA's __nv_bfloat16,
// so host buffers can be copied to and from the GPU unchanged. Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <cstring>

namespace kvfleet::kernels {

using bf16_bits = uint16_t;

inline float Bf16ToFloat(bf16_bits b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even, as __float2bfloat16 does; NaN stays a (quiet) NaN.
inline bf16_bits FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>(u >> 16);
}

// The value a float takes once stored as bf16.
inline float RoundBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace kvfleet::kernels
