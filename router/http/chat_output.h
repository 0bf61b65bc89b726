// One chat choice's generated text split into what OpenAI's chat answer carries apart:
// reasoning (reasoning_parser.h), content, and tool calls (tool_parsers.h). The reasoning
// is taken out first; calls are parsed out of the rest. Streamed, each delta says what
// goes out now; whole, ParseChatOutput gives the answer's message fields (a malformed or
// cut-off call leaves its text as content, vLLM's rule).
//
// A forced call (tool_choice "required" or named) is decoded under ForcedCallSchema's
// grammar (chat_tools.h), so the whole text is the call(s) as JSON, streamed as calls by
// ForcedCallStream (forced_calls.h). A text the grammar did not finish (max_tokens) is not
// JSON: a whole answer gives it as content.
//
// Thread safety: a ChatOutputStream belongs to one choice of one request.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "router/http/chat_tools.h"
#include "router/http/forced_calls.h"
#include "router/http/reasoning_parser.h"
#include "router/http/tool_parsers.h"

namespace kvfleet::router {

// How a request's chat output is parsed: settled per request from the model's template,
// the router's --tool-call-parser / --reasoning-parser and the request's tools and kwargs.
struct ChatOutputSetup {
  ToolParserKind tools = ToolParserKind::kNone;  // kNone: no call is parsed
  uint32_t max_calls = UINT32_MAX;               // parallel_tool_calls false: 1
  ReasoningParserKind reasoning = ReasoningParserKind::kNone;
  bool starts_inside_think = false;              // the prompt ends inside <think>
  ToolChoice forced = ToolChoice::kNone;         // kRequired, kNamed: a forced call (above)
  std::string forced_name;                       // kNamed: the function
  bool mistral_ids = false;                      // call ids of 9 letters and digits (tool_parsers.h)

  bool forced_call() const { return forced == ToolChoice::kRequired || forced == ToolChoice::kNamed; }
  std::function<std::string()> new_id() const { return mistral_ids ? NewMistralToolCallId : NewToolCallId; }
  bool active() const {
    return tools != ToolParserKind::kNone || reasoning != ReasoningParserKind::kNone || forced_call();
  }
};

struct ChatOutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class ChatOutputStream {
 public:
  explicit ChatOutputStream(const ChatOutputSetup& setup);
  ChatOutputDelta Push(std::string_view text);
  ChatOutputDelta Finish();
  bool called() const { return tools_.calls() > 0 || (forced_ && forced_->calls() > 0); }

 private:
  void Take(ReasoningOut r, bool final, ChatOutputDelta* out);
  ChatOutputSetup setup_;
  ReasoningStream reasoning_;
  ToolCallStream tools_;
  std::optional<ForcedCallStream> forced_;  // a forced call's
};

struct ChatOutput {
  std::optional<std::string> reasoning;  // set when a reasoning parser ran
  std::string content;
  std::vector<ParsedToolCall> calls;
};
ChatOutput ParseChatOutput(const ChatOutputSetup& setup, std::string_view text);

}  // namespace kvfleet::router
