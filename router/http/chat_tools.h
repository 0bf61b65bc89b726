// A chat request's function tools: `tools` (OpenAI's function tools, checked and kept in the
// client's key order for the template's `tools` variable), `tool_choice` and
// `parallel_tool_calls`, and the JSON schema a constrained decoder enforces for the tool
// choices that force a call.
//
//   - tool_choice "none": the tools are still rendered (vLLM's default), no call is parsed.
//   - "auto" (the default with tools): the model's calls are parsed out of its text
//     (tool_parsers.h).
//   - "required" and {"type":"function","function":{"name":...}} force a call, which only
//     constrained decoding can promise: SamplingParams::structured is set to
//     ForcedCallSchema's schema (routed only to workers that enforce it; chat_output.h
//     returns the JSON as tool_calls) (vLLM's: named -> the function's parameters; required -> an
//     array of {name, parameters}, one item when parallel_tool_calls is false).
//   - parallel_tool_calls false: at most one call is returned (the first the model wrote).
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvfleet::router {

namespace config {
// OpenAI's bound on tools per request.
inline constexpr size_t kMaxTools = 128;
// OpenAI's rule for a function name: ^[a-zA-Z0-9_-]{1,64}$.
inline constexpr size_t kMaxToolNameBytes = 64;
}  // namespace config

enum class ToolChoice : uint8_t { kNone, kAuto, kRequired, kNamed };

struct ChatTools {
  // The validated tools array ({"type":"function","function":{name, description?,
  // parameters?, strict?}}), keys in the client's order; null: no tools.
  std::shared_ptr<const nlohmann::ordered_json> tools;
  ToolChoice choice = ToolChoice::kNone;  // kAuto when tools are given without a choice
  std::string named;                      // kNamed: the function's name
  bool parallel = true;                   // parallel_tool_calls

  // The model's text is parsed for calls (tool_choice auto).
  bool parse_calls() const { return tools != nullptr && choice == ToolChoice::kAuto; }
  // A call is forced (required, named): the output is ForcedCallSchema's JSON.
  bool forced() const { return tools != nullptr && (choice == ToolChoice::kRequired || choice == ToolChoice::kNamed); }
};

// True for a name OpenAI accepts for a function.
bool IsValidToolName(std::string_view name);

// Checks one tools array (`at`: its field name, e.g. "tools"); each tool's errors name
// `at[i].function.<field>`. `flat` reads the Responses API's shape ({"type":"function",
// "name", "description", "parameters", "strict"}) and returns the chat shape.
Result<nlohmann::ordered_json> ValidateTools(const nlohmann::ordered_json& tools, std::string_view at, bool flat);

// Reads tools, tool_choice and parallel_tool_calls of a chat body. `ordered_tools`: the
// body's tools with their keys in order (the parser sorts them in `body`), or null when
// the body has none. Errors in ParseCompletionRequest's form, naming the field.
Status ParseChatTools(const nlohmann::json& body, const nlohmann::ordered_json* ordered_tools, ChatTools* out);

// The JSON schema (text) that forces the call of tools.choice: the named function's
// parameters, or an array of {"name", "parameters"} over every tool. REQUIRES: tools.forced().
std::string ForcedCallSchema(const ChatTools& tools);

}  // namespace kvfleet::router
