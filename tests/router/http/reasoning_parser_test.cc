// A thinking model's <think> block apart from its answer (reasoning_parser.h), whole and
// streamed split at every point.
#include "router/http/reasoning_parser.h"

#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::router {

namespace {

ReasoningOut Split(bool starts_inside, const std::vector<std::string>& pieces) {
  ReasoningStream s(ReasoningParserKind::kThink, starts_inside);
  ReasoningOut all;
  for (const std::string& p : pieces) {
    ReasoningOut o = s.Push(p);
    all.reasoning += o.reasoning;
    all.content += o.content;
  }
  ReasoningOut o = s.Finish();
  all.reasoning += o.reasoning;
  all.content += o.content;
  return all;
}

void CheckEverySplit(bool starts_inside, const std::string& text, const std::string& reasoning,
                     const std::string& content) {
  CAPTURE(text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    ReasoningOut o = Split(starts_inside, {text.substr(0, cut), text.substr(cut)});
    CHECK(o.reasoning == reasoning);
    CHECK(o.content == content);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ReasoningOut o = Split(starts_inside, bytes);
  CHECK(o.reasoning == reasoning);
  CHECK(o.content == content);
}

}  // namespace

TEST_CASE("a <think> block at the start of the answer is reasoning; the text after it is content") {
  CheckEverySplit(false, "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.", "\nThe user wants 2+2.\n", "It is 4.");
  CheckEverySplit(false, "\n<think>a < b</think>x", "a < b", "x");
  // No block: all content, even a later <think>.
  CheckEverySplit(false, "It is 4. <think>no</think>", "", "It is 4. <think>no</think>");
  CheckEverySplit(false, "<thin", "", "<thin");
}

TEST_CASE("a prompt that opens <think> makes the answer start inside the block") {
  CheckEverySplit(true, "The user wants 2+2.\n</think>\n\nIt is 4.", "The user wants 2+2.\n", "It is 4.");
  // Cut off while thinking (max_tokens): all of it is reasoning.
  CheckEverySplit(true, "still thinking </thi", "still thinking </thi", "");
  CHECK(PromptOpensThink("<|im_start|>assistant\n<think>\n"));
  CHECK_FALSE(PromptOpensThink("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  CHECK_FALSE(PromptOpensThink("<|im_start|>assistant\n"));
}

TEST_CASE("the reasoning parser is detected from the template and named by vLLM's names") {
  CHECK(DetectReasoningParser("{%- if '</think>' in content %}") == ReasoningParserKind::kThink);
  CHECK(DetectReasoningParser("{{ message.content }}") == ReasoningParserKind::kNone);
  CHECK(*ReasoningParserFromName("qwen3") == ReasoningParserKind::kThink);
  CHECK(*ReasoningParserFromName("deepseek_r1") == ReasoningParserKind::kThink);
  CHECK_FALSE(ReasoningParserFromName("granite").ok());
  ReasoningStream off(ReasoningParserKind::kNone, false);
  CHECK(off.Push("<think>x</think>").content == "<think>x</think>");
}

}  // namespace kvfleet::router
