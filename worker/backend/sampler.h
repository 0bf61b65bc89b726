// Token sampling from one row of logits: greedy, temperature, top-k, top-p, seeded.
//
// This is the CPU sampler of the cpu backend and the reference the CUDA sampling kernel
// is tested against. The procedure, in order:
//   1. temperature == 0 (or top_k == 1): the argmax; ties go to the lowest token id.
//   2. Scale logits by 1/temperature; softmax (max subtracted) over the whole vocab.
//   3. top_k > 0: keep the k most probable tokens (ties: lower id first).
//   4. top_p < 1: of those, sorted by probability (ties: lower id first), keep the
//      shortest prefix whose probability mass reaches top_p · (mass kept by step 3);
//      at least one token.
//   5. Draw u = SampleUniform(seed, counter) in [0, 1), walk the kept tokens in
//      ascending token id order and return the first whose running mass exceeds
//      u · (mass kept). (Id order needs no sort when nothing is filtered.)
//
// The random number is counter-based: a pure function of the request's seed and the index
// of the token being sampled (the engine passes the number of tokens the request has
// sampled before). So a request gives the same tokens whatever batch it runs in, and a
// preempted request recomputed from scratch samples exactly what it would have.
//
// Thread safety: pure functions; Sampler holds scratch memory and is thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "worker/model/splitmix64.h"

namespace kvfleet::backend {

// What the backend needs of a request's sampling settings (stop conditions and
// max_tokens are the engine's).
struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]; 1: off
  int32_t top_k = 0;         // 0: off
  uint64_t seed = 0;         // the request's seed
};

// InvalidArgument naming the field when a value is out of range (temperature < 0 or not
// finite, top_p outside (0, 1], top_k < 0).
Status ValidateSamplingParams(const SamplingParams& p);

using model::SplitMix64;

// The uniform draw in [0, 1) for the `counter`-th sampled token of a request: 24 random
// bits, so the float is exact.
constexpr float SampleUniform(uint64_t seed, uint64_t counter) {
  uint64_t bits = SplitMix64(SplitMix64(seed) ^ counter);
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// Holds scratch buffers so sampling a 128k vocab allocates nothing per call.
class Sampler {
 public:
  // REQUIRES: ValidateSamplingParams(p).ok(); logits.size() > 0.
  TokenId Sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter);

 private:
  std::vector<float> probs_;
  std::vector<int32_t> order_;
};

// The greedy choice: the index of the largest logit, lowest on ties. NaN never wins.
TokenId ArgMax(std::span<const float> logits);

}  // namespace kvfleet::backend
