// Token sampling over the full vocabulary, one thread block per sequence, with logit
// adjustments, min_p and logprobs in the same kernel.
//
// Per sequence s, over logits row s:
//   0. logprobs[s] >= 0: log-softmax of the raw row (before anything below, OpenAI's and
//      vLLM's default): the logsumexp and the logprobs[s] largest entries (descending, lowest
//      index on ties) go out; the sampled token's raw logprob once it is drawn.
//   1. The row's LogitAdjusts (sampling_common.h: logit_bias, repetition, frequency and
//      presence penalties, built on the host) replace the logits of their tokens, in place;
//      then, for a row with an allowed-token bitmask (constrained decoding), every token whose
//      bit is clear becomes -inf, in place (within step 2's argmax pass: one bitmask word
//      read per 32 tokens, beside the 16-byte logit loads). Logprobs (step 0) stay those of
//      the raw row.
//   2. temperature[s] <= 0 or top_k[s] == 1: greedy (argmax, lowest index on ties).
//   3. otherwise, in vLLM's order: divide by temperature; top-k keeps every logit >= the k-th
//      largest (ties kept; k <= 0 or k >= vocab: off) and min_p every logit >=
//      MinPThreshold (0: off); top-p keeps every logit >= the largest threshold whose kept
//      mass of softmax (over those survivors) is >= top_p (1: off); then one token is drawn
//      from the softmax of the survivors by Gumbel-max with the counter-based generator of
//      sampling_common.h keyed by (seed[s], step[s], token id).
// The same (logits, adjustments, seed, step) always gives the same token. Sequences with
// different settings share one launch: every setting is per sequence.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/sampling_common.h"

namespace kvfleet::kernels {

struct SamplingParams {
  float* logits = nullptr;             // [num_seqs][vocab]; rows with adjustments are changed in place
  const float* temperature = nullptr;  // [num_seqs]
  const int32_t* top_k = nullptr;      // [num_seqs]
  const float* top_p = nullptr;        // [num_seqs] in (0, 1]
  const uint64_t* seed = nullptr;      // [num_seqs]
  const uint64_t* step = nullptr;      // [num_seqs] draws so far for this request
  int32_t* tokens = nullptr;           // [num_seqs] out
  int32_t num_seqs = 0;
  int32_t vocab = 0;
  const float* min_p = nullptr;        // [num_seqs] in [0, 1], 0: off; null: off for all
  // Adjustments of sequence s: adjust[adjust_begin[s] .. adjust_begin[s + 1]), distinct tokens.
  const int32_t* adjust_begin = nullptr;  // [num_seqs + 1]; null: none
  const LogitAdjust* adjust = nullptr;    // [entries]
  float* adjust_raw = nullptr;            // [entries] scratch: the raw logits they replace
  // Allowed tokens (grammar::Matcher's bitmask: bit id % 32 of word id / 32, at least one set)
  // of the rows whose allowed_rows[s] != 0: allowed[s * allowed_words ..]. Null: none.
  const int32_t* allowed_rows = nullptr;  // [num_seqs]
  const uint32_t* allowed = nullptr;      // [num_seqs][allowed_words]
  int32_t allowed_words = 0;              // >= ceil(vocab / 32)
  // Logprobs (step 0); null: none for all.
  const int32_t* logprobs = nullptr;   // [num_seqs]: -1 none, else 0..kMaxTopLogprobs top entries
  float* token_logprob = nullptr;      // [num_seqs] out: the sampled token's raw logprob
  int32_t* top_tokens = nullptr;       // [num_seqs][kMaxTopLogprobs] out, first logprobs[s] written
  float* top_logprobs = nullptr;       // [num_seqs][kMaxTopLogprobs] out
};

cudaError_t LaunchSampling(const SamplingParams& p, cudaStream_t stream);

// Logprobs of given tokens over raw logits rows (prompt logprobs): row r gives target[r]'s
// log-softmax and the `top` largest entries, as step 0 above; target[r] < 0: row r is skipped
// (nothing written). One thread block per row.
struct LogprobsParams {
  const float* logits = nullptr;  // [rows][vocab]
  const int32_t* target = nullptr;  // [rows]; < 0: skip the row
  int32_t top = 0;                // 0..kMaxTopLogprobs
  float* token_logprob = nullptr;  // [rows] out
  int32_t* top_tokens = nullptr;   // [rows][kMaxTopLogprobs] out
  float* top_logprobs = nullptr;   // [rows][kMaxTopLogprobs] out
  int32_t rows = 0;
  int32_t vocab = 0;
};

cudaError_t LaunchLogprobs(const LogprobsParams& p, cudaStream_t stream);

}  // namespace kvfleet::kernels
