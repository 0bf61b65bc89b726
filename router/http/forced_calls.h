// The calls of a forced answer (tool_choice "required" or a named function), decoded under
// ForcedCallSchema's grammar (chat_tools.h), so the text is JSON whose shape is known:
//   - named: the whole text is the function's arguments (an object);
//   - required: an array of {"name", "parameters"}, one item per call.
// ForcedCallStream streams them as OpenAI does and as the auto path does (tool_parsers.h): a
// call's first delta carries its index, id and name with empty arguments (named: as soon as
// the object opens; required: once its name has been read), then argument fragments as the
// model writes them. Arguments are the text the model wrote for the value, byte for byte, so
// the fragments join to the whole answer's arguments (ParseForcedCalls is the same machine fed
// at once). A text that is not the grammar's JSON (cut off at max_tokens) is content in a
// whole answer; in a stream what went out stands.
//
// Bounded: every byte is scanned once; nothing is held back but whitespace around the JSON
// and, in a required call, what ToolCallStream holds (a call's text up to its name).
//
// Thread safety: a ForcedCallStream belongs to one choice of one request.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/http/chat_tools.h"
#include "router/http/json_scan.h"
#include "router/http/tool_parsers.h"

namespace kvfleet::router {

class ForcedCallStream {
 public:
  // REQUIRES: choice is kRequired or kNamed (then `name` is the function's).
  ForcedCallStream(ToolChoice choice, std::string name, uint32_t max_calls,
                   std::function<std::string()> new_id = NewToolCallId);
  ToolStreamOut Push(std::string_view text);
  ToolStreamOut Finish();
  uint32_t calls() const;  // calls whose header went out

 private:
  // Named: before the object (whitespace), inside it, after it, or not a call at all.
  enum class State : uint8_t { kStart, kArgs, kAfter, kText };
  void PushNamed(std::string_view text, ToolStreamOut* out);

  std::string name_;
  uint32_t max_calls_;
  std::function<std::string()> new_id_;
  std::optional<ToolCallStream> required_;  // required: the array's calls
  State state_ = State::kStart;
  std::string held_;  // named: whitespace not yet known to be content
  JsonEndScanner scan_;
  bool header_sent_ = false;
};

// The whole answer's calls; empty when the text is not the grammar's JSON (it is then content).
std::vector<ParsedToolCall> ParseForcedCalls(ToolChoice choice, const std::string& name, uint32_t max_calls,
                                             std::string_view text,
                                             std::function<std::string()> new_id = NewToolCallId);

}  // namespace kvfleet::router
