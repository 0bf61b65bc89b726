#include "router/http/chat_output.h"

#include <nlohmann/json.hpp>

namespace kvfleet::router {

ChatOutputStream::ChatOutputStream(const ChatOutputSetup& setup)
    : setup_(setup),
      reasoning_(setup.reasoning, setup.starts_inside_think),
      tools_(setup.tools, setup.max_calls, setup.new_id()) {
  if (setup.forced_call()) forced_.emplace(setup.forced, setup.forced_name, setup.max_calls, setup.new_id());
}

void ChatOutputStream::Take(ReasoningOut r, bool final, ChatOutputDelta* out) {
  out->reasoning = std::move(r.reasoning);
  ToolStreamOut t = forced_ ? forced_->Push(r.content) : tools_.Push(r.content);
  out->content = std::move(t.content);
  out->calls = std::move(t.calls);
  if (final) {
    ToolStreamOut rest = forced_ ? forced_->Finish() : tools_.Finish();
    out->content += rest.content;
    for (ToolCallDelta& d : rest.calls) out->calls.push_back(std::move(d));
  }
}

ChatOutputDelta ChatOutputStream::Push(std::string_view text) {
  ChatOutputDelta out;
  Take(reasoning_.Push(text), false, &out);
  return out;
}

ChatOutputDelta ChatOutputStream::Finish() {
  ChatOutputDelta out;
  Take(reasoning_.Finish(), true, &out);
  return out;
}

ChatOutput ParseChatOutput(const ChatOutputSetup& setup, std::string_view text) {
  ChatOutput out;
  ReasoningStream reasoning(setup.reasoning, setup.starts_inside_think);
  ReasoningOut a = reasoning.Push(text);
  ReasoningOut b = reasoning.Finish();
  if (setup.reasoning != ReasoningParserKind::kNone) out.reasoning = a.reasoning + b.reasoning;
  if (setup.forced_call()) {
    out.calls =
        ParseForcedCalls(setup.forced, setup.forced_name, setup.max_calls, a.content + b.content, setup.new_id());
    if (out.calls.empty()) out.content = a.content + b.content;
    return out;
  }
  ParsedToolCalls calls = ParseToolCalls(setup.tools, a.content + b.content, setup.max_calls, setup.new_id());
  out.content = std::move(calls.content);
  out.calls = std::move(calls.calls);
  return out;
}

}  // namespace kvfleet::router
