// CPU reference of sampling.h. Also exposes the surviving set and its probabilities, which the
// GPU test checks draws against. Thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/sampling_common.h"

namespace kvfleet::kernels {

struct SamplingRow {
  float temperature = 0;  // <= 0: greedy
  int32_t top_k = 0;      // <= 0 or >= vocab: off
  float top_p = 1;        // 1: off
  uint64_t seed = 0;
  uint64_t step = 0;
  float min_p = 0;        // 0: off
  std::vector<LogitAdjust> adjust = {};  // distinct tokens
  std::vector<uint32_t> allowed = {};    // the allowed-token bitmask; empty: every token
};

// The row after its adjustments and its allowed-token mask (step 1 of sampling.h).
std::vector<float> AdjustedRowRef(const float* logits, int32_t vocab, const SamplingRow& row);

// Probabilities of the surviving tokens (zero elsewhere), after the adjustments, temperature,
// top-k, min_p and top-p, with the kernel's definitions (sampling.h). Greedy rows give 1 at
// the argmax.
std::vector<double> SamplingDistributionRef(const float* logits, int32_t vocab, const SamplingRow& row);

// The token the kernel draws for this row (same generator, same selection rule).
int32_t SampleRef(const float* logits, int32_t vocab, const SamplingRow& row);

// Log-softmax of a raw row in double: `token`'s logprob and the `top` largest entries
// (descending, lowest index on ties).
struct LogprobsRef {
  double token_logprob = 0;
  std::vector<int32_t> top_tokens;
  std::vector<double> top_logprobs;
};
LogprobsRef RowLogprobsRef(const float* logits, int32_t vocab, int32_t token, int32_t top);

}  // namespace kvfleet::kernels
