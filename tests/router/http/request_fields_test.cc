// The rule for request fields (router/http/request_fields.h): every field OpenAI defines has a
// row, refused fields pass only with values that ask for nothing, unknown fields are a 400
// naming them unless admitted.
#include "router/http/request_fields.h"

#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "router/http/openai.h"

namespace kvfleet::router {

using nlohmann::json;

namespace {

ApiError Refusal(const json& body, bool chat, const FieldRule& rule = {}) {
  ChatTemplateOptions options;
  Status s = ApplyFieldRule(body, chat, rule, &options);
  REQUIRE_FALSE(s.ok());
  return ErrorFromStatus(s);
}

bool Passes(const json& body, bool chat, ChatTemplateOptions* options = nullptr) {
  ChatTemplateOptions scratch;
  return ApplyFieldRule(body, chat, FieldRule{}, options ? options : &scratch).ok();
}

}  // namespace

TEST_CASE("every field of OpenAI's chat and completions references has a row on its endpoint") {
  // OpenAI API reference, "Create chat completion" and "Create completion" request bodies.
  const std::vector<std::string> chat = {
      "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
      "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
      "presence_penalty", "prompt_cache_key", "prompt_cache_retention", "reasoning_effort", "response_format",
      "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
      "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options"};
  const std::vector<std::string> completions = {
      "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
      "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user"};
  for (const auto& f : chat) {
    CAPTURE(f);
    const RequestField* row = FindRequestField(f, true);
    REQUIRE(row != nullptr);
    CHECK(row->origin == FieldOrigin::kOpenAi);
  }
  for (const auto& f : completions) {
    CAPTURE(f);
    REQUIRE(FindRequestField(f, false) != nullptr);
  }
  // One row per name.
  std::set<std::string_view> names;
  for (const RequestField& f : RequestFields()) CHECK(names.insert(f.name).second);
}

TEST_CASE("an unknown field is a 400 naming it; --allow-unknown-fields admits it and reports its name") {
  const json body = {{"model", "m"}, {"prompt", "x"}, {"mirostat_tau", 5}};
  ApiError e = Refusal(body, false);
  CHECK(e.status == 400);
  CHECK(e.param == "mirostat_tau");
  CHECK(e.message.find("mirostat_tau") != std::string::npos);
  CHECK(e.message.find("--allow-unknown-fields") != std::string::npos);
  std::vector<std::string> seen;
  FieldRule admit{true, [&](std::string_view name) { seen.emplace_back(name); }};
  ChatTemplateOptions options;
  CHECK(ApplyFieldRule(body, false, admit, &options).ok());
  CHECK(seen == std::vector<std::string>{"mirostat_tau"});
  // Through the parser too: the field is refused before any other check, and admitted.
  auto parsed = ParseCompletionRequest(body.dump(), false);
  REQUIRE_FALSE(parsed.ok());
  CHECK(ErrorFromStatus(parsed.status()).param == "mirostat_tau");
  RequestLimits limits;
  limits.fields.allow_unknown = true;
  CHECK(ParseCompletionRequest(body.dump(), false, limits).ok());
}

TEST_CASE("a field of the other endpoint is refused by name, even with unknown fields admitted") {
  ApiError e = Refusal({{"model", "m"}, {"prompt", "x"}, {"tools", json::array()}}, false, FieldRule{true, {}});
  CHECK(e.param == "tools");
  CHECK(e.message.find("/v1/completions") != std::string::npos);
  CHECK(Refusal({{"model", "m"}, {"messages", json::array()}, {"suffix", "z"}}, true).param == "suffix");
}

TEST_CASE("each refused field passes null and its admitted values, and is a 400 naming it for anything else") {
  int refused = 0;
  for (const RequestField& f : RequestFields()) {
    if (f.support != FieldSupport::kRefused) continue;
    ++refused;
    CAPTURE(f.name);
    const bool chat = (f.endpoints & kChatField) != 0;
    json body = {{"model", "m"}};
    body[std::string(f.name)] = nullptr;
    CHECK(Passes(body, chat));
    for (const json& admitted : json::parse(f.admitted.empty() ? std::string_view("[]") : f.admitted)) {
      body[std::string(f.name)] = admitted;
      CHECK(Passes(body, chat));
    }
    for (const json& asks : {json("json_object"), json{{"type", "json_schema"}}, json::array({1}), json(0.5)}) {
      body[std::string(f.name)] = asks;
      ApiError e = Refusal(body, chat);
      CHECK(e.status == 400);
      CHECK(e.param == f.name);
    }
  }
  CHECK(refused > 10);
}

TEST_CASE("response_format and tool_choice pass only when they ask for nothing the workers cannot do") {
  const json base = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto with = [&](const char* name, json value) {
    json b = base;
    b[name] = std::move(value);
    return b;
  };
  // response_format, tools, tool_choice: parsed (structured_output_test.cc, chat_tools_test.cc).
  CHECK(Passes(with("response_format", {{"type", "json_object"}}), true));
  CHECK(Passes(with("tool_choice", "required"), true));
  CHECK(Passes(with("tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}), true));
  CHECK(Passes(with("min_tokens", 0), true));
  CHECK(Refusal(with("min_tokens", 4), true).param == "min_tokens");
  // Built: parsed (and range-checked) by ParseCompletionRequest, so the rule passes them.
  CHECK(Passes(with("min_p", 0.05), true));
  CHECK(Passes(with("repetition_penalty", 1.1), true));
}

TEST_CASE("stream_options' fields follow the rule, named with their prefix") {
  const json base = {{"model", "m"}, {"prompt", "x"}, {"stream", true}};
  json b = base;
  b["stream_options"] = {{"include_usage", true}, {"include_obfuscation", false}};
  CHECK(Passes(b, false));
  b["stream_options"] = {{"include_obfuscation", true}};
  CHECK(Refusal(b, false).param == "stream_options.include_obfuscation");
  b["stream_options"] = {{"chunk_size", 3}};
  CHECK(Refusal(b, false).param == "stream_options.chunk_size");
}

TEST_CASE("the chat template's fields are read: add_generation_prompt, continue_final_message, kwargs") {
  const json base = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  ChatTemplateOptions o;
  REQUIRE(Passes(base, true, &o));
  CHECK(o.add_generation_prompt);
  CHECK_FALSE(o.continue_final_message);
  CHECK(o.kwargs_json.empty());

  json b = base;
  b["continue_final_message"] = true;
  b["chat_template_kwargs"] = {{"enable_thinking", false}};
  o = {};
  REQUIRE(Passes(b, true, &o));
  CHECK(o.continue_final_message);
  CHECK_FALSE(o.add_generation_prompt);
  CHECK(json::parse(o.kwargs_json) == json{{"enable_thinking", false}});

  b["add_generation_prompt"] = true;
  CHECK(Refusal(b, true).param == "continue_final_message");
  b = base;
  b["chat_template_kwargs"] = "enable_thinking";
  CHECK(Refusal(b, true).param == "chat_template_kwargs");
  b["chat_template_kwargs"] = {{"messages", json::array()}};
  CHECK(Refusal(b, true).param == "chat_template_kwargs");
  b = base;
  b["add_generation_prompt"] = "yes";
  CHECK(Refusal(b, true).param == "add_generation_prompt");
  // The parser carries them into the request.
  b = base;
  b["add_generation_prompt"] = false;
  auto r = ParseCompletionRequest(b.dump(), true);
  REQUIRE(r.ok());
  CHECK_FALSE(r->chat_template.add_generation_prompt);
}

}  // namespace kvfleet::router
