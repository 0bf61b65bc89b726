// A chat's messages as OpenAI SDKs send them, made into what chat templates read: the one
// check and normalisation every /v1/chat/completions (and /tokenize chat, and /v1/responses)
// request's messages pass before the template renders them. vLLM's rules
// (vllm/entrypoints/chat_utils.py), for templates that read `content` as a string, which
// every template kvfleet's model layouts carry does:
//   1. Text content parts ([{"type":"text","text":...}, ...]) become one string, the parts'
//      texts joined with "\n". Any other part type is a 400 naming it (text only).
//   2. A null or absent content (assistant messages only) becomes "".
//   3. An assistant's `tool_calls` are checked ({id, type "function", function{name,
//      arguments}}) and each `arguments` string is parsed into the JSON value it holds
//      (an empty one into {}), keys in their order: Transformers' templates write the
//      arguments with `tojson` and expect a mapping (Llama 3.1, Qwen2.5; Qwen3 takes both).
//   4. `name` (a string) and a tool message's `tool_call_id` (a string, required) pass to
//      the template as sent.
//
// Thread safety: pure functions over values.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvfleet::router {

namespace config {
// Tool calls in one assistant message; agents send a handful.
inline constexpr size_t kMaxToolCallsPerMessage = 128;
}  // namespace config

// Checks and normalises `messages` in place (the rules above). InvalidArgument in
// ParseCompletionRequest's form (param '\x1f' message); the param is "messages" and the
// message names the path, e.g. "messages[2].content[1]".
Status NormalizeChatMessages(nlohmann::ordered_json* messages);

// A JSON text parsed with its objects' keys in order: InvalidArgument when it is not one
// JSON value, or nests deeper than the request bodies may (json_body.h).
Result<nlohmann::ordered_json> ParseOrderedJson(std::string_view text);

}  // namespace kvfleet::router
