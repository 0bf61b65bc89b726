#include "worker/engine/request.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kvfleet::engine {

uint8_t PreemptionPriority(const kv::KvCacheRetentionConfig& retention) {
  uint8_t p = retention.decode_priority;
  for (const kv::TokenRangeRetention& r : retention.token_ranges) p = std::max(p, r.priority);
  return p;
}

backend::SamplingParams BackendSampling(const SamplingOptions& s, uint64_t seed) {
  backend::SamplingParams p;
  p.temperature = s.temperature;
  p.top_p = s.top_p;
  p.top_k = s.top_k;
  p.seed = seed;
  p.presence_penalty = s.presence_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.repetition_penalty = s.repetition_penalty;
  p.min_p = s.min_p;
  p.logit_bias = s.logit_bias;
  p.logprobs = s.logprobs;
  p.prompt_logprobs = s.prompt_logprobs;
  return p;
}

Status ValidateRequest(const GenerateRequest& request, const EngineLimits& limits) {
  const SamplingOptions& s = request.sampling;
  if (request.prompt.empty()) return InvalidArgument("the prompt is empty");
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return InvalidArgument("temperature must be a finite number >= 0, got " + NumberText(s.temperature));
  }
  if (!std::isfinite(s.top_p) || s.top_p <= 0.0f || s.top_p > 1.0f) {
    return InvalidArgument("top_p must be in (0, 1], got " + NumberText(s.top_p));
  }
  if (s.top_k < 0) return InvalidArgument("top_k must be >= 0 (0 = off), got " + std::to_string(s.top_k));
  if (s.max_tokens == 0) return InvalidArgument("max_tokens must be >= 1");
  if (s.n == 0) return InvalidArgument("n must be >= 1");
  KVF_RETURN_IF_ERROR(backend::ValidateSamplingParams(BackendSampling(s, 0)));
  if (limits.vocab_size > 0) {
    for (TokenId t : request.prompt) {
      if (t >= limits.vocab_size) {
        return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary of " +
                               std::to_string(limits.vocab_size));
      }
    }
    for (TokenId t : s.stop_token_ids) {
      if (t >= limits.vocab_size) return InvalidArgument("stop token id " + std::to_string(t) + " is outside the vocabulary");
    }
    for (const auto& [t, bias] : s.logit_bias) {
      if (t >= limits.vocab_size) return InvalidArgument("logit_bias token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  Status retention = request.retention.Validate();
  if (!retention.ok()) return InvalidArgument("retention: " + retention.message());
  if (request.prompt.size() > limits.max_prompt) {
    return OutOfRange("the prompt has " + std::to_string(request.prompt.size()) +
                      " tokens; this worker's windowed KV pool holds a prompt of at most " +
                      std::to_string(limits.max_prompt));
  }
  // At least one token must be generated within the context.
  if (request.prompt.size() >= limits.max_context) {
    return OutOfRange("the prompt has " + std::to_string(request.prompt.size()) +
                      " tokens; this worker's context limit is " + std::to_string(limits.max_context) +
                      " (prompt + at least one generated token)");
  }
  return Status::Ok();
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "?";
}

}  // namespace kvfleet::engine
