// schema/sampling.h: the one sampling parameter type's bounds, which the router (a 400 naming
// the field) and the worker (invalidRequest) both check with ValidateSampling.
#include "schema/sampling.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

namespace kvfleet {
namespace {

// The message of ValidateSampling(p), and the field it names in *field.
std::string Refusal(const SamplingParams& p, std::string* field) {
  const Status s = ValidateSampling(p, field);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  return s.message();
}

TEST_CASE("the defaults ask for nothing and pass; each bound's edge passes") {
  const SamplingParams defaults;
  CHECK(ValidateSampling(defaults).ok());
  CHECK_FALSE(defaults.penalized());
  CHECK(ValidateSampling({.temperature = 0.0f}).ok());
  CHECK(ValidateSampling({.temperature = sampling::config::kMaxTemperature}).ok());
  CHECK(ValidateSampling({.top_p = 1e-6f}).ok());
  CHECK(ValidateSampling({.top_k = sampling::config::kMaxTopK}).ok());
  CHECK(ValidateSampling({.presence_penalty = -2.0f, .frequency_penalty = 2.0f}).ok());
  CHECK(ValidateSampling({.repetition_penalty = 100.0f, .min_p = 1.0f}).ok());
  CHECK(ValidateSampling({.logprobs = 20, .prompt_logprobs = true}).ok());
  std::vector<std::pair<TokenId, float>> full(sampling::config::kMaxLogitBias);
  for (size_t i = 0; i < full.size(); ++i) full[i] = {static_cast<TokenId>(i), i % 2 ? 100.0f : -100.0f};
  CHECK(ValidateSampling({.logit_bias = full}).ok());
  CHECK(SamplingParams{.logit_bias = full}.penalized());
  CHECK(ValidateSampling({.stop_token_ids = std::vector<TokenId>(sampling::config::kMaxStopTokenIds, 7)}).ok());
}

TEST_CASE("a value out of bounds is refused in the router's words, naming its field") {
  std::string field;
  CHECK(Refusal({.temperature = 2.5f}, &field) == "'temperature' must be between 0 and 2");
  CHECK(field == "temperature");
  CHECK(Refusal({.temperature = -0.1f}, &field) == "'temperature' must be between 0 and 2");
  CHECK(Refusal({.temperature = NAN}, &field) == "'temperature' must be between 0 and 2");
  CHECK(Refusal({.temperature = INFINITY}, &field) == "'temperature' must be between 0 and 2");
  CHECK(Refusal({.top_p = 1.5f}, &field) == "'top_p' must be between 0 and 1");
  CHECK(Refusal({.top_p = 0.0f}, &field) == "'top_p' must be greater than 0");
  CHECK(field == "top_p");
  CHECK(Refusal({.top_k = -1}, &field).find("'top_k' must be between 0 and 1048576") == 0);
  CHECK(Refusal({.max_tokens = 0}, &field) == "'max_tokens' must be at least 1");
  CHECK(Refusal({.n = 0}, &field) == "'n' must be at least 1");
  CHECK(Refusal({.stop_token_ids = std::vector<TokenId>(257, 1)}, &field) ==
        "'stop_token_ids' may hold at most 256 ids");
  CHECK(Refusal({.presence_penalty = -2.5f}, &field) == "'presence_penalty' must be between -2 and 2");
  CHECK(Refusal({.frequency_penalty = 2.5f}, &field) == "'frequency_penalty' must be between -2 and 2");
  CHECK(field == "frequency_penalty");
  CHECK(Refusal({.repetition_penalty = 0.0f}, &field) == "'repetition_penalty' must be greater than 0");
  CHECK(Refusal({.repetition_penalty = -1.0f}, &field) == "'repetition_penalty' must be between 0 and 100");
  CHECK(Refusal({.repetition_penalty = 101.0f}, &field) == "'repetition_penalty' must be between 0 and 100");
  CHECK(Refusal({.min_p = 1.5f}, &field) == "'min_p' must be between 0 and 1");
  CHECK(Refusal({.logprobs = 21}, &field) == "'logprobs' must be -1 (none) or between 0 and 20");
  CHECK(Refusal({.logprobs = -2}, &field) == "'logprobs' must be -1 (none) or between 0 and 20");
  CHECK(Refusal({.prompt_logprobs = true}, &field).find("needs 'logprobs'") != std::string::npos);
  CHECK(field == "prompt_logprobs");
  // Without a place for the field, the message alone.
  CHECK(ValidateSampling({.min_p = -1.0f}).message() == "'min_p' must be between 0 and 1");
}

TEST_CASE("logit_bias: at most 300 distinct tokens, each bias within [-100, 100]") {
  std::string field;
  CHECK(Refusal({.logit_bias = {{5, 101.0f}}}, &field) ==
        "'logit_bias' values must be numbers between -100 and 100 (token 5)");
  CHECK(field == "logit_bias");
  CHECK(Refusal({.logit_bias = {{5, NAN}}}, &field).find("(token 5)") != std::string::npos);
  CHECK(Refusal({.logit_bias = {{3, 1.0f}, {4, 0.0f}, {3, 2.0f}}}, &field) == "'logit_bias' names token 3 twice");
  std::vector<std::pair<TokenId, float>> many(sampling::config::kMaxLogitBias + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = {static_cast<TokenId>(i), 1.0f};
  CHECK(Refusal({.logit_bias = many}, &field) == "'logit_bias' may hold at most 300 tokens");
}

TEST_CASE("the first field out of bounds is the one named") {
  std::string field;
  Refusal({.temperature = 3.0f, .min_p = 2.0f}, &field);
  CHECK(field == "temperature");
  Refusal({.presence_penalty = 3.0f, .min_p = 2.0f}, &field);
  CHECK(field == "presence_penalty");
}

}  // namespace

TEST_CASE("a structured-output constraint needs a spec for its kind, at most 256 KiB") {
  SamplingParams p;
  std::string field;
  p.structured = {StructuredOutput::Kind::kJsonObject, ""};
  CHECK(ValidateSampling(p).ok());
  p.structured = {StructuredOutput::Kind::kRegex, "[a-z]+"};
  CHECK(ValidateSampling(p).ok());
  p.structured = {StructuredOutput::Kind::kRegex, ""};
  CHECK(Refusal(p, &field).find("needs a spec") != std::string::npos);
  CHECK(field == "structured");
  p.structured = {StructuredOutput::Kind::kJsonObject, "{}"};
  CHECK(Refusal(p, &field).find("takes no spec") != std::string::npos);
  p.structured = {StructuredOutput::Kind::kEbnf, std::string(sampling::config::kMaxStructuredSpecBytes, 'a')};
  CHECK(ValidateSampling(p).ok());
  p.structured.spec += 'a';
  CHECK(Refusal(p, &field).find("at most") != std::string::npos);
  p.structured = {static_cast<StructuredOutput::Kind>(9), "x"};
  CHECK(Refusal(p, &field).find("unknown kind") != std::string::npos);
}

}  // namespace kvfleet
