#include "worker/engine/request.h"

#include <algorithm>
#include <string>

namespace kvfleet::engine {

uint8_t PreemptionPriority(const kv::KvCacheRetentionConfig& retention) {
  uint8_t p = retention.decode_priority;
  for (const kv::TokenRangeRetention& r : retention.token_ranges) p = std::max(p, r.priority);
  return p;
}

Status ValidateRequest(const GenerateRequest& request, const EngineLimits& limits) {
  const SamplingParams& s = request.sampling;
  if (request.prompt.empty()) return InvalidArgument("the prompt is empty");
  KVF_RETURN_IF_ERROR(ValidateSampling(s));
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
