// Pieces of sampling shared by the GPU kernel and its CPU reference, so both draw the same
// numbers: the counter-based uniform generator, the order-preserving float key, the logit
// adjustments (bias, penalties) and min_p's threshold.
// Pure functions; host and device.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/attention_mask.h"  // KVF_HD

namespace kvfleet::kernels {

// OpenAI's bound on top_logprobs: the kernels' top-entry arrays are this wide.
constexpr int32_t kMaxTopLogprobs = 20;

// Fixed-point scale of probabilities in top-p sums: integer sums are exact and so
// independent of summation order (a seeded request draws the same token on any launch).
constexpr double kProbFixedScale = 4294967296.0;  // 2^32

// Constrained decoding's token bitmask: token v may be sampled iff bit v % 32 of word v / 32
// is set (grammar::Matcher::FillNextTokenBitmask's layout). The bits of tokens [v, v + n),
// bit i for token v + i (n a power of two <= 32, v a multiple of n): the kernel's 16-byte
// passes take 4 at once.
KVF_HD uint32_t TokenAllowedBits(const uint32_t* bits, int64_t v, int n) {
  return (bits[v >> 5] >> (v & 31)) & (n == 32 ? ~0u : (1u << n) - 1u);
}
KVF_HD bool TokenAllowed(const uint32_t* bits, int64_t v) { return TokenAllowedBits(bits, v, 1) != 0; }

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

// One token's adjustment in one sequence's row, before temperature (vLLM's order): a
// logit_bias entry and/or a token seen in the prompt or generated. A sequence's entries name
// distinct tokens. Built on the host (backend::BuildLogitAdjusts).
struct LogitAdjust {
  int32_t token = 0;
  float bias = 0.0f;        // added first (logit_bias)
  float repetition = 1.0f;  // then HF's repetition penalty: positive divided, negative multiplied
  float subtract = 0.0f;    // then subtracted: frequency * generated count + presence (if generated)
};

KVF_HD float AdjustLogit(float logit, const LogitAdjust& a) {
  float l = logit + a.bias;
  l = l > 0.0f ? l / a.repetition : l * a.repetition;
  return l - a.subtract;
}

// min_p (vLLM): keep p >= min_p * p_max of softmax(l / T), i.e. l >= max + T * ln(min_p).
// REQUIRES: min_p > 0.
KVF_HD float MinPThreshold(float max_logit, float temperature, float min_p) {
  return max_logit + temperature * logf(min_p);
}

}  // namespace kvfleet::kernels
