#include "router/http/reasoning_parser.h"

#include <algorithm>

namespace kvfleet::router {

namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t PartialTail(std::string_view s, std::string_view tag) {
  for (size_t len = std::min(s.size(), tag.size() - 1); len > 0; --len) {
    if (s.substr(s.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

}  // namespace

Result<ReasoningParserKind> ReasoningParserFromName(std::string_view name) {
  if (name == "none") return ReasoningParserKind::kNone;
  if (name == "qwen3" || name == "deepseek_r1") return ReasoningParserKind::kThink;
  return InvalidArgument("unknown reasoning parser '" + std::string(name) + "' (none, qwen3 or deepseek_r1)");
}

ReasoningParserKind DetectReasoningParser(std::string_view chat_template) {
  return chat_template.find(kClose) != std::string_view::npos ? ReasoningParserKind::kThink
                                                              : ReasoningParserKind::kNone;
}

bool PromptOpensThink(std::string_view tail) {
  while (!tail.empty() && IsSpace(tail.back())) tail.remove_suffix(1);
  return tail.size() >= kOpen.size() && tail.substr(tail.size() - kOpen.size()) == kOpen;
}

ReasoningStream::ReasoningStream(ReasoningParserKind kind, bool starts_inside)
    : state_(kind == ReasoningParserKind::kNone ? State::kContent
                                                : (starts_inside ? State::kReasoning : State::kStart)) {}

ReasoningOut ReasoningStream::Push(std::string_view text) {
  ReasoningOut out;
  if (state_ == State::kContent) {
    out.content.assign(text);
    return out;
  }
  buf_.append(text);
  Run(&out, false);
  return out;
}

ReasoningOut ReasoningStream::Finish() {
  ReasoningOut out;
  Run(&out, true);
  return out;
}

void ReasoningStream::Run(ReasoningOut* out, bool final) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        size_t at = 0;
        while (at < buf_.size() && IsSpace(buf_[at])) ++at;
        std::string_view rest = std::string_view(buf_).substr(at);
        if (rest.substr(0, kOpen.size()) == kOpen) {
          buf_.erase(0, at + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (!final && rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return;  // may open yet
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = buf_.find(kClose);
        if (close != std::string::npos) {
          out->reasoning.append(buf_, 0, close);
          buf_.erase(0, close + kClose.size());
          state_ = State::kAfterThink;
          continue;
        }
        const size_t hold = final ? 0 : PartialTail(buf_, kClose);
        out->reasoning.append(buf_, 0, buf_.size() - hold);
        buf_.erase(0, buf_.size() - hold);
        return;
      }
      case State::kAfterThink: {
        size_t at = 0;
        while (at < buf_.size() && IsSpace(buf_[at])) ++at;
        if (at == buf_.size() && !final) {
          buf_.clear();
          return;
        }
        buf_.erase(0, at);
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out->content += buf_;
        buf_.clear();
        return;
    }
  }
}

}  // namespace kvfleet::router
