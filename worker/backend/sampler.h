// Token sampling from one row of logits: logit bias, repetition/frequency/presence
// penalties, greedy, temperature, min_p, top-k, top-p, seeded; and logprobs.
//
// This is the CPU sampler of the cpu backend. It reads a request's SamplingParams
// (schema/sampling.h) as the router sent them, and its sequence's seed. The procedure, in
// order (vLLM's):
//   0. The row's adjustments (BuildLogitAdjusts: logit_bias, then the repetition penalty over
//      prompt + generated tokens, then frequency and presence over generated tokens;
//      kernels::AdjustLogit) replace the raw logits of the tokens they name. Then, with a
//      token bitmask (constrained decoding, grammar/), every token it does not allow gets
//      -inf, so steps 1-5 choose among the allowed ones only.
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
#include "schema/sampling.h"
#include "worker/model/splitmix64.h"

namespace kvfleet::backend {

// The sampling kernel's output rows have one slot per top entry a request may ask for.
static_assert(sampling::config::kMaxTopLogprobs == kernels::kMaxTopLogprobs);

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
  // The `counter`-th token of the sequence whose seed is `seed` (the request's own, or the
  // worker's, plus the sequence's index). `adjust`: the row's BuildLogitAdjusts (applied to a
  // copy; `logits` is not changed). `allowed`: empty, or the token bitmask of step 0 (bit
  // id % 32 of word id / 32) with at least one bit set among the first logits.size().
  // REQUIRES: ValidateSampling(p).ok(); logits.size() > 0; adjust's tokens < logits.size().
  TokenId Sample(std::span<const float> logits, const SamplingParams& p, uint64_t seed, uint64_t counter,
                 std::span<const kernels::LogitAdjust> adjust = {}, std::span<const uint32_t> allowed = {});

 private:
  std::vector<float> adjusted_;
  std::vector<float> probs_;
  std::vector<int32_t> order_;
};

// Sets logits[id] to -inf for every id whose bit in `allowed` is clear.
// REQUIRES: allowed.size() * 32 >= logits.size().
void MaskLogits(std::span<float> logits, std::span<const uint32_t> allowed);

// The greedy choice: the index of the largest logit, lowest on ties. NaN never wins.
TokenId ArgMax(std::span<const float> logits);

}  // namespace kvfleet::backend
