// Parsing and formatting of the sampling controls and logprobs (router/http/openai.h):
// penalties, min_p, logit_bias, completions logprobs + echo, chat logprobs + top_logprobs.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "router/http/openai.h"

namespace kvfleet::router {
namespace {

using nlohmann::json;

ApiError Refusal(const std::string& fields, bool chat = false) {
  const std::string body = chat ? R"({"model":"m","messages":[{"role":"user","content":"hi"}],)" + fields + "}"
                                : R"({"model":"m","prompt":"x",)" + fields + "}";
  auto r = ParseCompletionRequest(body, chat);
  REQUIRE_MESSAGE(!r.ok(), fields);
  return ErrorFromStatus(r.status());
}

TEST_CASE("penalties, min_p, logit_bias and logprobs parse on completions and chat") {
  auto c = ParseCompletionRequest(R"({"model":"m","prompt":"x","presence_penalty":1.5,"frequency_penalty":-2,
    "repetition_penalty":1.1,"min_p":0.05,"logit_bias":{"50256":-100,"7":3.5},"logprobs":5,"echo":true,
    "max_tokens":0})",
                                  false);
  REQUIRE(c.ok());
  CHECK(c->sampling.presence_penalty == 1.5f);
  CHECK(c->sampling.frequency_penalty == -2.0f);
  CHECK(c->sampling.repetition_penalty == doctest::Approx(1.1));
  CHECK(c->sampling.min_p == doctest::Approx(0.05));
  CHECK(c->sampling.logit_bias.size() == 2);
  CHECK(c->sampling.logprobs == 5);
  CHECK(c->echo);
  CHECK(*c->max_tokens == 0u);
  auto chat = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":20})", true);
  REQUIRE(chat.ok());
  CHECK(chat->sampling.logprobs == 20);
  auto bare = ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true})",
                                     true);
  CHECK(bare->sampling.logprobs == 0);
  auto off = ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":false})",
                                    true);
  CHECK(off->sampling.logprobs == -1);
  auto defaults = ParseCompletionRequest(R"({"model":"m","prompt":"x"})", false);
  CHECK(defaults->sampling.repetition_penalty == 1.0f);
  CHECK(defaults->sampling.logprobs == -1);
  CHECK(defaults->sampling.logit_bias.empty());
}

TEST_CASE("bad sampling controls are 400s naming the field") {
  CHECK(Refusal(R"("presence_penalty":2.5)").param == "presence_penalty");
  CHECK(Refusal(R"("frequency_penalty":-3)").param == "frequency_penalty");
  CHECK(Refusal(R"("frequency_penalty":"1")").param == "frequency_penalty");
  CHECK(Refusal(R"("repetition_penalty":0)").param == "repetition_penalty");
  CHECK(Refusal(R"("repetition_penalty":-1)").param == "repetition_penalty");
  CHECK(Refusal(R"("min_p":1.5)").param == "min_p");
  CHECK(Refusal(R"("logit_bias":[1])").param == "logit_bias");
  CHECK(Refusal(R"("logit_bias":{"abc":1})").param == "logit_bias");
  CHECK(Refusal(R"("logit_bias":{"-1":1})").param == "logit_bias");
  CHECK(Refusal(R"("logit_bias":{"4294967296":1})").param == "logit_bias");
  CHECK(Refusal(R"("logit_bias":{"5":101})").param == "logit_bias");
  CHECK(Refusal(R"("logit_bias":{"5":"1"})").param == "logit_bias");
  // "1" and "01" are one token: refused here as the worker would (it refused it alone before).
  ApiError twice = Refusal(R"("logit_bias":{"1":1,"01":2})");
  CHECK(twice.param == "logit_bias");
  CHECK(twice.message == "'logit_bias' names token 1 twice");
  CHECK(Refusal(R"("repetition_penalty":100.5)").message == "'repetition_penalty' must be between 0 and 100");
  CHECK(Refusal(R"("temperature":1e300)").message == "'temperature' must be between 0 and 2");
  json many = json::object();
  for (int i = 0; i < 301; ++i) many[std::to_string(i)] = 1;
  CHECK(Refusal("\"logit_bias\":" + many.dump()).message.find("at most 300") != std::string::npos);
  CHECK(Refusal(R"("logprobs":21)").param == "logprobs");
  CHECK(Refusal(R"("logprobs":-1)").param == "logprobs");
  CHECK(Refusal(R"("logprobs":true)").param == "logprobs");
  CHECK(Refusal(R"("top_logprobs":2)").param == "top_logprobs");
  CHECK(Refusal(R"("max_tokens":0)").param == "max_tokens");
  CHECK(Refusal(R"("top_logprobs":3)", true).param == "top_logprobs");  // without logprobs: true
  CHECK(Refusal(R"("logprobs":true,"top_logprobs":21)", true).param == "top_logprobs");
  CHECK(Refusal(R"("logprobs":3)", true).param == "logprobs");
  CHECK(Refusal(R"("echo":true)", true).param == "echo");
  CHECK(Refusal(R"("max_completion_tokens":0)", true).param == "max_completion_tokens");
}

TEST_CASE("logprobs format in OpenAI's completions and chat shapes, whole and streamed") {
  ChoiceLogprobs lp;
  lp.text_offset = 4;
  lp.entries = {{"He", std::nullopt, {}}, {"llo", -0.25f, {{"llo", -0.25f}, {"y", -2.0f}}}, {"!", -3.0f, {{"?", -1.0f}}}};
  CompletionRequest completion;
  completion.model = "m";
  auto j = json::parse(FormatCompletion(completion, "cmpl-1", 1, "Hello!", "stop", {}, &lp));
  const json& l = j["choices"][0]["logprobs"];
  CHECK(l["tokens"] == json({"He", "llo", "!"}));
  CHECK(l["token_logprobs"] == json({nullptr, -0.25, -3.0}));
  CHECK(l["top_logprobs"] == json({nullptr, {{"llo", -0.25}, {"y", -2.0}}, {{"?", -1.0}, {"!", -3.0}}}));
  CHECK(l["text_offset"] == json({4, 6, 9}));
  CHECK(json::parse(FormatCompletion(completion, "cmpl-1", 1, "x", "stop", {}))["choices"][0]["logprobs"].is_null());

  CompletionRequest chat;
  chat.chat = true;
  chat.model = "m";
  lp.entries.erase(lp.entries.begin());
  std::string chunk = FormatChunk(chat, "chatcmpl-1", 1, "llo!", "", false, 0, &lp);
  REQUIRE(chunk.rfind("data: ", 0) == 0);
  auto c = json::parse(chunk.substr(6));
  const json& content = c["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == 2);
  CHECK(content[0] == json({{"token", "llo"},
                            {"logprob", -0.25},
                            {"bytes", {'l', 'l', 'o'}},
                            {"top_logprobs",
                             {{{"token", "llo"}, {"logprob", -0.25}, {"bytes", {'l', 'l', 'o'}}},
                              {{"token", "y"}, {"logprob", -2.0}, {"bytes", {'y'}}}}}}));
  CHECK(c["choices"][0]["logprobs"]["refusal"].is_null());
}

}  // namespace
}  // namespace kvfleet::router
