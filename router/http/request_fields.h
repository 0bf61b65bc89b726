// One rule for the top-level fields of a /v1/completions or /v1/chat/completions body: a
// table of every field OpenAI defines for them, kvfleet's extensions and the vLLM extras
// kvfleet knows, each either honoured or refused with a 400 whose param names it. A field in
// no row is unknown: a 400 naming it, as OpenAI answers, unless the router runs with
// --allow-unknown-fields (then it is admitted, logged once per name at debug and counted).
//
// Rows (docs/DESIGN.md, "Request fields", lists them for users):
//   1. kParsed: ParseCompletionRequest (openai.cc) reads it and serves it. A value out of
//      bounds is a 400 naming the field: the sampling fields' bounds are schema/sampling.h's;
//      the few values kvfleet does not serve are refused there too (best_of other than n,
//      a non-empty suffix).
//   2. kHonoured: read here (the chat template's fields) or a hint with no effect on the
//      output (prompt_cache_key, safety_identifier).
//   3. kRefused: not built; only null and the values that ask for nothing (`admitted`, e.g.
//      tool_choice "none", response_format {"type":"text"}) pass.
//
// Thread safety: the table is immutable; CheckRequestFields is thread-safe when
// FieldRule::on_unknown is.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "router/http/codec.h"

namespace kvfleet::router {

enum class FieldSupport : uint8_t { kParsed, kHonoured, kRefused };
enum class FieldOrigin : uint8_t { kOpenAi, kVllm, kKvfleet };

// Which endpoints define a field (a bit set).
inline constexpr uint8_t kChatField = 1;
inline constexpr uint8_t kCompletionsField = 2;
inline constexpr uint8_t kBothFields = kChatField | kCompletionsField;

struct RequestField {
  std::string_view name;
  uint8_t endpoints;
  FieldOrigin origin;
  FieldSupport support;
  // kRefused: a JSON array of the values that ask for nothing and pass (null always does).
  std::string_view admitted;
};

// Every row, in the order docs/DESIGN.md lists them.
// A field's error in ParseCompletionRequest's form: InvalidArgument "param\x1fmessage",
// which the API answers as a 400 naming `param`.
Status FieldError(std::string message, std::string_view param);

std::span<const RequestField> RequestFields();
// The row of `name` on that endpoint; nullptr: unknown there.
const RequestField* FindRequestField(std::string_view name, bool chat);

struct FieldRule {
  bool allow_unknown = false;  // --allow-unknown-fields
  // Each admitted unknown field's name (allow_unknown only), for the log and the metric.
  std::function<void(std::string_view name)> on_unknown;
};

// Checks every top-level field of `body` (an object) and of its stream_options against the
// table; reads the chat template's fields into *chat_template (chat only). InvalidArgument in
// ParseCompletionRequest's form (param, '\x1f', message) naming the first offending field.
Status ApplyFieldRule(const nlohmann::json& body, bool chat, const FieldRule& rule,
                      ChatTemplateOptions* chat_template);

}  // namespace kvfleet::router
