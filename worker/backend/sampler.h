// Token sampling from one row of logits: logit bias, repetition/frequency/presence
// penalties, greedy, temperature, min_p, top-k, top-p, seeded; and logprobs.
//
// This is the CPU sampler of the cpu backend. The procedure, in order (vLLM's):
//   0. The row's adjustments (BuildLogitAdjusts: logit_bias, then the repetition penalty over
//      prompt + generated tokens, then frequency and presence over generated tokens;
//      kernels::AdjustLogit) replace the raw logits of the tokens they name.
//   1. temperature == 0 (or top_k == 1): the argmax; ties go to the lowest token id.
//   2. Scale logits by 1/temperature; softmax (max subtracted) over the whole vocab.
//   3. top_k > 0: keep the k most probable tokens (ties: lower id first); min_p > 0: of
//      those, keep tokens whose probability is >= min_p times the top one.
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
// Logprobs (TokenLogprobs) are log-softmax of the raw logits, before step 0 (OpenAI's and
// vLLM's default), computed in double.
//
// Thread safety: pure functions; Sampler holds scratch memory and is thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "kernels/sampling_common.h"
#include "worker/model/splitmix64.h"

namespace kvfleet::backend {

// What the backend needs of a request's sampling settings (stop conditions and
// max_tokens are the engine's).
struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]; 1: off
  int32_t top_k = 0;         // 0: off
  uint64_t seed = 0;         // the request's seed
  float presence_penalty = 0.0f;    // [-2, 2]; 0: off
  float frequency_penalty = 0.0f;   // [-2, 2]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  std::span<const std::pair<TokenId, float>> logit_bias = {};  // (token, bias in [-100, 100]); the request's
  int32_t logprobs = -1;            // -1: none; 0..kMaxTopLogprobs top entries with the sampled token's
  bool prompt_logprobs = false;     // also every prompt token's logprob (the engine's prefill rows)

  bool penalized() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || !logit_bias.empty();
  }
};

// OpenAI's bound on top_logprobs (and the completions API's logprobs).
inline constexpr int32_t kMaxTopLogprobs = kernels::kMaxTopLogprobs;
// OpenAI's bound on logit_bias entries.
inline constexpr size_t kMaxLogitBias = 300;

// InvalidArgument naming the field when a value is out of range (temperature < 0 or not
// finite, top_p outside (0, 1], top_k < 0, penalties outside [-2, 2], repetition_penalty
// <= 0, min_p outside [0, 1], a bias outside [-100, 100] or a token twice, logprobs
// outside -1..20).
Status ValidateSamplingParams(const SamplingParams& p);

// The adjustments of one row (kernels::LogitAdjust, sorted by token, distinct): every
// logit_bias token, every token of `history` (repetition penalty), and the generated ones
// (history[prompt_len..]: frequency and presence). Empty when !p.penalized().
void BuildLogitAdjusts(const SamplingParams& p, std::span<const TokenId> history, size_t prompt_len,
                       std::vector<kernels::LogitAdjust>* out);

// A token's logprob and the top entries of its row.
struct TokenLogprobs {
  TokenId token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<TokenId, float>> top;  // descending logprob, lower id first on ties
};

// log-softmax of `logits` (raw) in double: the logprob of `token` and the `top` largest.
// REQUIRES: 0 <= top <= logits.size(); token < logits.size().
TokenLogprobs ComputeLogprobs(std::span<const float> logits, TokenId token, int32_t top);

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
  // `adjust`: the row's BuildLogitAdjusts (applied to a copy; `logits` is not changed).
  // REQUIRES: ValidateSamplingParams(p).ok(); logits.size() > 0; adjust's tokens < logits.size().
  TokenId Sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter,
                 std::span<const kernels::LogitAdjust> adjust = {});

 private:
  std::vector<float> adjusted_;
  std::vector<float> probs_;
  std::vector<int32_t> order_;
};

// The greedy choice: the index of the largest logit, lowest on ties. NaN never wins.
TokenId ArgMax(std::span<const float> logits);

}  // namespace kvfleet::backend
