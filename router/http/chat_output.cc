#include "router/http/chat_output.h"

#include <nlohmann/json.hpp>

namespace kvfleet::router {

ChatOutputStream::ChatOutputStream(const ChatOutputSetup& setup)
    : setup_(setup), reasoning_(setup.reasoning, setup.starts_inside_think), tools_(setup.tools, setup.max_calls) {}

std::vector<ParsedToolCall> ParseForcedCalls(const ChatOutputSetup& setup, std::string_view text,
                                             std::function<std::string()> new_id) {
  std::vector<ParsedToolCall> calls;
  const auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return calls;
  if (setup.forced == ToolChoice::kNamed) {
    if (j.is_object()) calls.push_back({new_id(), setup.forced_name, j.dump()});
    return calls;
  }
  if (!j.is_array()) return calls;
  for (const auto& item : j) {
    if (calls.size() >= setup.max_calls) break;
    auto name = item.is_object() ? item.find("name") : item.end();
    if (name == item.end() || !name->is_string()) return {};
    auto params = item.find("parameters");
    calls.push_back({new_id(), name->get<std::string>(), params != item.end() ? params->dump() : std::string("{}")});
  }
  return calls;
}

void ChatOutputStream::Take(ReasoningOut r, bool final, ChatOutputDelta* out) {
  out->reasoning = std::move(r.reasoning);
  if (setup_.forced_call()) {
    forced_text_ += r.content;
    if (!final) return;
    std::vector<ParsedToolCall> calls = ParseForcedCalls(setup_, forced_text_);
    if (calls.empty()) out->content = std::move(forced_text_);
    for (ParsedToolCall& c : calls) {
      out->calls.push_back(ToolCallDelta{forced_calls_, c.id, c.name, "", true});
      out->calls.push_back(ToolCallDelta{forced_calls_++, "", "", std::move(c.arguments), false});
    }
    return;
  }
  ToolStreamOut t = tools_.Push(r.content);
  out->content = std::move(t.content);
  out->calls = std::move(t.calls);
  if (final) {
    ToolStreamOut rest = tools_.Finish();
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
    out.calls = ParseForcedCalls(setup, a.content + b.content);
    if (out.calls.empty()) out.content = a.content + b.content;
    return out;
  }
  ParsedToolCalls calls = ParseToolCalls(setup.tools, a.content + b.content, setup.max_calls);
  out.content = std::move(calls.content);
  out.calls = std::move(calls.calls);
  return out;
}

}  // namespace kvfleet::router
