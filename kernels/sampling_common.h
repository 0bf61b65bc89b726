// Pieces of sampling shared by the GPU kernel and its CPU reference, so both draw the same
// numbers: the counter-based uniform generator and the order-preserving float key.
// Pure functions; host and device.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/attention_mask.h"  // KVF_HD

namespace kvfleet::kernels {

// Fixed-point scale of probabilities in top-p sums: integer sums are exact and so
// independent of summation order (a seeded request draws the same token on any launch).
constexpr double kProbFixedScale = 4294967296.0;  // 2^32

// Uniform in (0, 1) for (seed, step, index): splitmix64's finaliser over a mixed counter.
KVF_HD float SampleUniform(uint64_t seed, uint64_t step, uint64_t index) {
  uint64_t x = seed ^ (step * 0x9E3779B97F4A7C15ull) ^ ((index + 1) * 0xD1B54A32D192ED03ull);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return (static_cast<float>(x >> 40) + 0.5f) * (1.0f / 16777216.0f);
}

// A uint32 whose unsigned order is the float order (for radix selection).
KVF_HD uint32_t FloatOrderKey(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, sizeof(u));
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace kvfleet::kernels
