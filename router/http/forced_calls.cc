#include "router/http/forced_calls.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace kvfleet::router {

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t FirstNonSpace(std::string_view s) {
  size_t at = 0;
  while (at < s.size() && IsSpace(s[at])) ++at;
  return at;
}

}  // namespace

ForcedCallStream::ForcedCallStream(ToolChoice choice, std::string name, uint32_t max_calls,
                                   std::function<std::string()> new_id)
    : name_(std::move(name)), max_calls_(max_calls), new_id_(std::move(new_id)) {
  if (choice == ToolChoice::kRequired) required_.emplace(ToolCallStream::ForcedArray(max_calls, new_id_));
}

uint32_t ForcedCallStream::calls() const {
  if (required_) return std::min(required_->calls(), max_calls_);  // it counts dropped ones too
  return header_sent_ ? 1 : 0;
}

ToolStreamOut ForcedCallStream::Push(std::string_view text) {
  if (required_) return required_->Push(text);
  ToolStreamOut out;
  PushNamed(text, &out);
  return out;
}

ToolStreamOut ForcedCallStream::Finish() {
  if (required_) return required_->Finish();
  ToolStreamOut out;
  // Before the object: the whitespace that was all of it. After it: dropped. Inside it (cut
  // off): what went out stands.
  if (state_ == State::kStart) out.content = std::move(held_);
  held_.clear();
  return out;
}

void ForcedCallStream::PushNamed(std::string_view text, ToolStreamOut* out) {
  while (!text.empty()) {
    switch (state_) {
      case State::kStart: {
        const size_t at = FirstNonSpace(text);
        held_.append(text.substr(0, at));
        text.remove_prefix(at);
        if (text.empty()) return;
        if (text[0] != '{') {  // not the grammar's object: all of it is content
          state_ = State::kText;
          out->content += held_;
          held_.clear();
          break;
        }
        held_.clear();  // whitespace before the arguments is no part of them
        out->calls.push_back(ToolCallDelta{0, new_id_(), name_, "", true});
        header_sent_ = true;
        state_ = State::kArgs;
        break;
      }
      case State::kArgs: {
        size_t end = 0;
        bool closed = false;
        while (end < text.size() && !closed) closed = scan_.Push(text[end++]);
        out->calls.push_back(ToolCallDelta{0, "", "", std::string(text.substr(0, end)), false});
        text.remove_prefix(end);
        if (closed) state_ = State::kAfter;
        break;
      }
      case State::kAfter: {
        // Whitespace after the object is dropped; anything else is content from here on.
        const size_t at = FirstNonSpace(text);
        held_.append(text.substr(0, at));
        text.remove_prefix(at);
        if (text.empty()) return;
        out->content += held_;
        held_.clear();
        state_ = State::kText;
        break;
      }
      case State::kText:
        out->content.append(text);
        return;
    }
  }
}

std::vector<ParsedToolCall> ParseForcedCalls(ToolChoice choice, const std::string& name, uint32_t max_calls,
                                             std::string_view text, std::function<std::string()> new_id) {
  // The grammar's JSON, or no call: named, an object; required, an array of objects with a
  // string name.
  const auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {};
  if (choice == ToolChoice::kNamed && !j.is_object()) return {};
  if (choice == ToolChoice::kRequired) {
    if (!j.is_array()) return {};
    for (const auto& item : j) {
      auto n = item.is_object() ? item.find("name") : item.end();
      if (n == item.end() || !n->is_string()) return {};
    }
  }
  // The calls as the stream gives them, so a whole answer's arguments are its stream's bytes.
  ForcedCallStream stream(choice, name, max_calls, std::move(new_id));
  ToolStreamOut a = stream.Push(text);
  ToolStreamOut b = stream.Finish();
  std::vector<ParsedToolCall> calls;
  for (ToolStreamOut* part : {&a, &b}) {
    for (ToolCallDelta& d : part->calls) {
      if (d.first) calls.push_back(ParsedToolCall{std::move(d.id), std::move(d.name), ""});
      else if (!calls.empty()) calls.back().arguments += d.arguments;
    }
  }
  return calls;
}

}  // namespace kvfleet::router
