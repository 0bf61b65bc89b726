// CPU reference of sampling.h. Also exposes the surviving set and its probabilities, which the
// GPU test checks draws against. Thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

namespace kvfleet::kernels {

struct SamplingRow {
  float temperature = 0;  // <= 0: greedy
  int32_t top_k = 0;      // <= 0 or >= vocab: off
  float top_p = 1;        // 1: off
  uint64_t seed = 0;
  uint64_t step = 0;
};

// Probabilities of the surviving tokens (zero elsewhere), after temperature, top-k and top-p,
// with the kernel's definitions (sampling.h). Greedy rows give 1 at the argmax.
std::vector<double> SamplingDistributionRef(const float* logits, int32_t vocab, const SamplingRow& row);

// The token the kernel draws for this row (same generator, same selection rule).
int32_t SampleRef(const float* logits, int32_t vocab, const SamplingRow& row);

}  // namespace kvfleet::kernels
