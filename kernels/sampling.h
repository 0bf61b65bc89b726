// Token sampling over the full vocabulary, one thread block per sequence.
//
// Per sequence s, over logits row s:
//   temperature[s] <= 0 or top_k[s] == 1: greedy (argmax, lowest index on ties).
//   otherwise, in HF's order: divide by temperature; top-k keeps every logit >= the k-th
//   largest (ties kept; k <= 0 or k >= vocab: off); top-p keeps every logit >= the largest
//   threshold whose kept mass of softmax (over the top-k survivors) is >= top_p (1: off);
//   then one token is drawn from the softmax of the survivors by Gumbel-max with the
//   counter-based generator of sampling_common.h keyed by (seed[s], step[s], token id).
// The same (logits, seed, step) always gives the same token.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvfleet::kernels {

struct SamplingParams {
  const float* logits = nullptr;       // [num_seqs][vocab]
  const float* temperature = nullptr;  // [num_seqs]
  const int32_t* top_k = nullptr;      // [num_seqs]
  const float* top_p = nullptr;        // [num_seqs] in (0, 1]
  const uint64_t* seed = nullptr;      // [num_seqs]
  const uint64_t* step = nullptr;      // [num_seqs] draws so far for this request
  int32_t* tokens = nullptr;           // [num_seqs] out
  int32_t num_seqs = 0;
  int32_t vocab = 0;
};

cudaError_t LaunchSampling(const SamplingParams& p, cudaStream_t stream);

}  // namespace kvfleet::kernels
