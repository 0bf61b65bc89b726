#include "worker/engine/request.h"

#include <cmath>
#include <string>

namespace kvfleet::engine {

namespace config {
// Retention priorities are TensorRT-LLM's 0..100 scale.
constexpr uint8_t kMaxRetentionPriority = 100;
}  // namespace config

uint8_t Retention::PriorityAt(uint32_t position, uint32_t prompt_len, uint8_t default_priority) const {
  if (position >= prompt_len && decode_priority) return *decode_priority;
  for (const RetentionRange& r : ranges) {
    if (position >= r.start && (!r.end || position < *r.end)) return r.priority;
  }
  return default_priority;
}

Status ValidateRequest(const GenerateRequest& request, const EngineLimits& limits) {
  const SamplingOptions& s = request.sampling;
  if (request.prompt.empty()) return InvalidArgument("the prompt is empty");
  if (!std::isfinite(s.temperature) || s.temperature < 0.0f) {
    return InvalidArgument("temperature must be a finite number >= 0, got " + std::to_string(s.temperature));
  }
  if (!std::isfinite(s.top_p) || s.top_p <= 0.0f || s.top_p > 1.0f) {
    return InvalidArgument("top_p must be in (0, 1], got " + std::to_string(s.top_p));
  }
  if (s.top_k < 0) return InvalidArgument("top_k must be >= 0 (0 = off), got " + std::to_string(s.top_k));
  if (s.max_tokens == 0) return InvalidArgument("max_tokens must be >= 1");
  if (!request.lora.empty()) return NotFound("unknown lora '" + request.lora + "': this worker serves none");
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
  }
  for (const RetentionRange& r : request.retention.ranges) {
    if (r.priority > config::kMaxRetentionPriority) {
      return InvalidArgument("retention priority must be 0..100, got " + std::to_string(r.priority));
    }
    if (r.end && *r.end <= r.start) return InvalidArgument("a retention range ends before it starts");
  }
  if (request.retention.decode_priority && *request.retention.decode_priority > config::kMaxRetentionPriority) {
    return InvalidArgument("decode retention priority must be 0..100");
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
