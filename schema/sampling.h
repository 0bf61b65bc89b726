// The one generation-and-sampling parameter type of a request, its bounds, and the one
// check of them. The router's parser fills a SamplingParams from an OpenAI body
// (router/http/openai.h), Contract 3 carries it (schema/requests.h: Generate.sampling), the
// engine keeps it unchanged for the request's life (worker/engine/request.h), and the
// backends read it where they fill their per-batch arrays (worker/backend/backend.h:
// SequenceStep::sampling). Both sides call ValidateSampling: the router answers a failure with
// a 400 naming the field, the worker with invalidRequest.
//
// A new sampling field: a member here (default: off), its bound in ValidateSampling, its
// capnp field (worker.capnp, appended) and codec lines (requests.cc), the parser's line
// (openai.cc), and its use where the backends read it.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"

namespace kvfleet {

namespace sampling::config {
// OpenAI's bound on temperature; 0 is greedy.
constexpr float kMaxTemperature = 2.0f;
// Beyond every vocabulary; a larger top_k is a mistake, not a use.
constexpr int32_t kMaxTopK = 1 << 20;
// OpenAI's bound on presence_penalty and frequency_penalty: [-kMaxPenalty, kMaxPenalty].
constexpr float kMaxPenalty = 2.0f;
// repetition_penalty is in (0, kMaxRepetitionPenalty]: 100 already pins a seen token's logit
// near 0 (HF/vLLM divide positive logits by it).
constexpr float kMaxRepetitionPenalty = 100.0f;
// OpenAI's bounds on logit_bias: at most this many tokens, each bias in [-100, 100].
constexpr size_t kMaxLogitBias = 300;
constexpr float kMaxLogitBiasValue = 100.0f;
// OpenAI's bound on top_logprobs (and the completions API's logprobs); the sampling kernel's
// output rows have this many slots (kernels::kMaxTopLogprobs, asserted equal).
constexpr int32_t kMaxTopLogprobs = 20;
// Every generated token is compared with each stop id: a model needs a handful (its
// end-of-turn ids), so a longer list is a mistake, not a use.
constexpr size_t kMaxStopTokenIds = 256;
// A structured-output spec (JSON schema, regex, choices, grammar): agents' tool schemas run
// to tens of KiB; a grammar engine compiles the spec per request, so its size bounds that work.
constexpr size_t kMaxStructuredSpecBytes = 256 * 1024;
}  // namespace sampling::config

// A constraint on the generated text (vLLM's structured outputs). The router parses it from
// response_format, guided_* and structured_outputs; a worker that decodes under constraints
// enforces it (router/http/structured_output.h says when the router sends one).
struct StructuredOutput {
  enum class Kind : uint8_t { kNone, kJsonSchema, kJsonObject, kRegex, kChoice, kEbnf };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema's JSON text; kRegex: the pattern; kChoice: a JSON array of
  // strings; kEbnf: the grammar; kNone, kJsonObject: empty. At most kMaxStructuredSpecBytes.
  std::string spec;
  bool operator==(const StructuredOutput&) const = default;
};

// How to generate one request's tokens. Every field's default asks for nothing (OpenAI's
// defaults); the logit processing order is schema/README.md's (Contract 3, `sampling`).
struct SamplingParams {
  float temperature = 1.0f;           // [0, kMaxTemperature]; 0: greedy
  float top_p = 1.0f;                 // (0, 1]; 1: off
  int32_t top_k = 0;                  // [0, kMaxTopK]; 0: off
  std::optional<uint64_t> seed = {};  // none: the worker derives one from the request
  uint32_t max_tokens = 16;           // generated tokens per sequence, >= 1
  // End a sequence (finish "stop"), besides the model's eos ids; at most kMaxStopTokenIds.
  std::vector<TokenId> stop_token_ids = {};
  bool ignore_eos = false;  // true: the model's eos ids do not end a sequence
  // Sequences sampled from the prompt (OpenAI's n), >= 1; they share its prefill, and sequence
  // i samples with seed + i.
  uint32_t n = 1;
  float presence_penalty = 0.0f;    // [-2, 2]; minus this once for a token generated at least once
  float frequency_penalty = 0.0f;   // [-2, 2]; minus this times the token's count among generated ones
  float repetition_penalty = 1.0f;  // (0, 100]; HF/vLLM, over prompt + generated tokens; 1: off
  float min_p = 0.0f;               // [0, 1]; keep tokens of probability >= min_p times the top one
  // (token, bias in [-100, 100]) added to the raw logit; distinct tokens, at most kMaxLogitBias.
  std::vector<std::pair<TokenId, float>> logit_bias = {};
  int32_t logprobs = -1;  // -1: none; 0..kMaxTopLogprobs: the sampled token's and this many top entries
  // Also every prompt token's logprob; needs logprobs >= 0. The worker prefills such a
  // request without reusing cached blocks (it needs every prompt position's logits).
  bool prompt_logprobs = false;
  StructuredOutput structured = {};  // none: unconstrained

  // True when a logit is adjusted before sampling: a bias or a penalty.
  bool penalized() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || !logit_bias.empty();
  }
};

// OK, or InvalidArgument for the first field outside its bound, worded for a client
// ("'top_p' must be between 0 and 1"); *field, when given, gets that field's name (the
// router's 400 names it as `param`). Token ids are not checked against a vocabulary: only
// the worker knows its own.
Status ValidateSampling(const SamplingParams& p, std::string* field = nullptr);

}  // namespace kvfleet
