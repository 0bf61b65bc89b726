#include "schema/sampling.h"

#include <string>

namespace kvfleet {

namespace {

namespace config = sampling::config;

Status Bad(std::string* field, const char* name, std::string message) {
  if (field) *field = name;
  return InvalidArgument("'" + std::string(name) + "' " + std::move(message));
}

// NaN fails every comparison, so it is never within bounds.
bool Within(float v, double lo, double hi) { return v >= lo && v <= hi; }

std::string Between(double lo, double hi) { return "must be between " + NumberText(lo) + " and " + NumberText(hi); }

Status ValidateLogitBias(const SamplingParams& p, std::string* field) {
  const auto& bias = p.logit_bias;
  if (bias.size() > config::kMaxLogitBias) {
    return Bad(field, "logit_bias", "may hold at most " + std::to_string(config::kMaxLogitBias) + " tokens");
  }
  for (size_t i = 0; i < bias.size(); ++i) {
    const auto [token, value] = bias[i];
    if (!Within(value, -config::kMaxLogitBiasValue, config::kMaxLogitBiasValue)) {
      return Bad(field, "logit_bias",
                 "values must be numbers between " + NumberText(-config::kMaxLogitBiasValue) + " and " +
                     NumberText(config::kMaxLogitBiasValue) + " (token " + std::to_string(token) + ")");
    }
    // At most 300 entries: quadratic is cheaper than a set's allocations.
    for (size_t j = 0; j < i; ++j) {
      if (bias[j].first == token) return Bad(field, "logit_bias", "names token " + std::to_string(token) + " twice");
    }
  }
  return Status::Ok();
}

}  // namespace

Status ValidateSampling(const SamplingParams& p, std::string* field) {
  if (!Within(p.temperature, 0, config::kMaxTemperature)) {
    return Bad(field, "temperature", Between(0, config::kMaxTemperature));
  }
  if (!Within(p.top_p, 0, 1)) return Bad(field, "top_p", Between(0, 1));
  if (p.top_p == 0.0f) return Bad(field, "top_p", "must be greater than 0");
  if (p.top_k < 0 || p.top_k > config::kMaxTopK) return Bad(field, "top_k", Between(0, config::kMaxTopK) + " (0: off)");
  if (p.max_tokens == 0) return Bad(field, "max_tokens", "must be at least 1");
  if (p.stop_token_ids.size() > config::kMaxStopTokenIds) {
    return Bad(field, "stop_token_ids", "may hold at most " + std::to_string(config::kMaxStopTokenIds) + " ids");
  }
  if (p.n == 0) return Bad(field, "n", "must be at least 1");
  if (!Within(p.presence_penalty, -config::kMaxPenalty, config::kMaxPenalty)) {
    return Bad(field, "presence_penalty", Between(-config::kMaxPenalty, config::kMaxPenalty));
  }
  if (!Within(p.frequency_penalty, -config::kMaxPenalty, config::kMaxPenalty)) {
    return Bad(field, "frequency_penalty", Between(-config::kMaxPenalty, config::kMaxPenalty));
  }
  if (!Within(p.repetition_penalty, 0, config::kMaxRepetitionPenalty)) {
    return Bad(field, "repetition_penalty", Between(0, config::kMaxRepetitionPenalty));
  }
  if (p.repetition_penalty == 0.0f) return Bad(field, "repetition_penalty", "must be greater than 0");
  if (!Within(p.min_p, 0, 1)) return Bad(field, "min_p", Between(0, 1));
  KVF_RETURN_IF_ERROR(ValidateLogitBias(p, field));
  if (p.logprobs < -1 || p.logprobs > config::kMaxTopLogprobs) {
    return Bad(field, "logprobs", "must be -1 (none) or between 0 and " + std::to_string(config::kMaxTopLogprobs));
  }
  if (p.prompt_logprobs && p.logprobs < 0) return Bad(field, "prompt_logprobs", "needs 'logprobs' of 0 or more");
  if (p.structured.spec.size() > config::kMaxStructuredSpecBytes) {
    return Bad(field, "structured", "spec must be at most " + std::to_string(config::kMaxStructuredSpecBytes) + " bytes");
  }
  if (p.structured.kind > StructuredOutput::Kind::kEbnf) return Bad(field, "structured", "has an unknown kind");
  const bool needs_spec = p.structured.kind != StructuredOutput::Kind::kNone &&
                          p.structured.kind != StructuredOutput::Kind::kJsonObject;
  if (needs_spec == p.structured.spec.empty()) {
    return Bad(field, "structured", needs_spec ? "needs a spec for its kind" : "takes no spec for its kind");
  }
  return Status::Ok();
}

}  // namespace kvfleet
