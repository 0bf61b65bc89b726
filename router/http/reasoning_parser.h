// A thinking model's reasoning apart from its answer: the text inside <think>...</think>
// (Qwen3, DeepSeek-R1 and QwQ write it so) goes to `reasoning_content`, the rest to
// `content`, as vLLM's reasoning parsers return it.
//
// The block may open in the prompt: a template that ends its generation prompt with
// "<think>" (Qwen3's thinking variants, DeepSeek-R1) makes the answer start inside it, so
// the stream starts in reasoning when `starts_inside` is set. Otherwise a "<think>" at the
// very start of the answer (whitespace aside) opens it; an answer that starts with anything
// else has no reasoning. Text after "</think>" is content, its leading newlines dropped.
// A tail that may still become a tag is held back.
//
// Thread safety: a ReasoningStream belongs to one choice of one request.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvfleet::router {

enum class ReasoningParserKind : uint8_t { kNone, kThink };

// "none", or "qwen3" / "deepseek_r1" (vLLM's names; both are <think> blocks).
Result<ReasoningParserKind> ReasoningParserFromName(std::string_view name);
// kThink when the chat template writes <think> blocks.
ReasoningParserKind DetectReasoningParser(std::string_view chat_template);
// True when the rendered prompt's end is inside an open <think> block.
bool PromptOpensThink(std::string_view prompt_tail);

struct ReasoningOut {
  std::string reasoning;
  std::string content;
};

class ReasoningStream {
 public:
  ReasoningStream(ReasoningParserKind kind, bool starts_inside);
  ReasoningOut Push(std::string_view text);
  ReasoningOut Finish();

 private:
  enum class State : uint8_t { kStart, kReasoning, kAfterThink, kContent };
  void Run(ReasoningOut* out, bool final);

  State state_;
  std::string buf_;
};

}  // namespace kvfleet::router
