// Tool calls out of model text (tool_parsers.h): each format whole, and streamed split at
// every point and a byte at a time, which must give the same calls and content.
#include "router/http/tool_parsers.h"

#include <algorithm>
#include <cctype>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "router/http/chat_output.h"

namespace kvfleet::router {

namespace {

std::function<std::string()> Counter() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call_" + std::to_string((*n)++); };
}

// The stream's deltas joined into whole calls, checking OpenAI's streaming shape on the way.
ParsedToolCalls Joined(ToolParserKind kind, const std::vector<std::string>& pieces, uint32_t max_calls = UINT32_MAX) {
  ToolCallStream stream(kind, max_calls, Counter());
  ParsedToolCalls out;
  auto take = [&](ToolStreamOut o) {
    out.content += o.content;
    for (ToolCallDelta& d : o.calls) {
      if (d.first) {
        CHECK(d.index == out.calls.size());  // indices count up from 0
        CHECK(d.arguments.empty());          // the header carries no arguments
        out.calls.push_back(ParsedToolCall{d.id, d.name, ""});
      } else {
        REQUIRE(!out.calls.empty());
        CHECK(d.index == out.calls.size() - 1);  // fragments belong to the latest call
        CHECK(d.name.empty());
        out.calls.back().arguments += d.arguments;
      }
    }
  };
  for (const std::string& p : pieces) take(stream.Push(p));
  take(stream.Finish());
  return out;
}

void CheckSame(const ParsedToolCalls& got, const ParsedToolCalls& want) {
  CHECK(got.content == want.content);
  REQUIRE(got.calls.size() == want.calls.size());
  for (size_t i = 0; i < got.calls.size(); ++i) {
    CHECK(got.calls[i].name == want.calls[i].name);
    CHECK(nlohmann::json::parse(got.calls[i].arguments) == nlohmann::json::parse(want.calls[i].arguments));
  }
}

// Whole, at every split into two pieces, and a byte at a time: one answer.
void CheckEverySplit(ToolParserKind kind, const std::string& text, const ParsedToolCalls& want) {
  CAPTURE(text);
  ParsedToolCalls whole = ParseToolCalls(kind, text, UINT32_MAX, Counter());
  CheckSame(whole, want);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    CAPTURE(cut);
    CheckSame(Joined(kind, {text.substr(0, cut), text.substr(cut)}), want);
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  CheckSame(Joined(kind, bytes), want);
}

ParsedToolCall Call(std::string name, std::string args) { return ParsedToolCall{"", std::move(name), std::move(args)}; }

}  // namespace

TEST_CASE("hermes: <tool_call> blocks become calls, the text before them content") {
  CheckEverySplit(ToolParserKind::kHermes,
                  "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                  "\"days\": [1, 2], \"note\": \"a } in \\\"text\\\"\"}}\n</tool_call>\n<tool_call>\n"
                  "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
                  {"Let me look.\n",
                   {Call("get_weather", R"({"city": "Paris", "days": [1, 2], "note": "a } in \"text\""})"),
                    Call("now", "{}")}});
  // No call: all content, a marker's prefix at the end included.
  CheckEverySplit(ToolParserKind::kHermes, "just text <tool_", {"just text <tool_", {}});
  // Arguments given as a JSON string are decoded; a call without arguments gets {}.
  CheckEverySplit(ToolParserKind::kHermes,
                  "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
                  "<tool_call>{\"name\": \"g\"}</tool_call>",
                  {"", {Call("f", R"({"a": 1})"), Call("g", "{}")}});
}

TEST_CASE("llama3_json: a JSON call is the whole answer, after an optional <|python_tag|>; ';' separates calls") {
  CheckEverySplit(ToolParserKind::kLlama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                  {"", {Call("get_weather", R"({"city": "Paris"})")}});
  CheckEverySplit(ToolParserKind::kLlama3Json,
                  "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}",
                  {"", {Call("a", R"({"x": 1})"), Call("b", "{}")}});
  // Text first: no call, whatever follows.
  CheckEverySplit(ToolParserKind::kLlama3Json, "Sure: {\"name\": \"a\", \"parameters\": {}}",
                  {"Sure: {\"name\": \"a\", \"parameters\": {}}", {}});
}

TEST_CASE("mistral: [TOOL_CALLS] then a JSON array of calls") {
  CheckEverySplit(ToolParserKind::kMistral,
                  "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                  "{\"name\": \"now\", \"arguments\": {}}]",
                  {"", {Call("get_weather", R"({"city": "Paris"})"), Call("now", "{}")}});
  CheckEverySplit(ToolParserKind::kMistral, "no calls [TOOL", {"no calls [TOOL", {}});
}

TEST_CASE("mistral v11+: [TOOL_CALLS]name[ARGS]{...} per call, with or without the model's [CALL_ID]") {
  // Arguments are the object as written; text before the first call is content.
  CheckEverySplit(ToolParserKind::kMistral,
                  "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Pa}ris\", \"d\": [1, {\"x\": \"\\\"\"}]}"
                  "[TOOL_CALLS]now[ARGS]{}",
                  {"Checking.",
                   {Call("get_weather", R"({"city": "Pa}ris", "d": [1, {"x": "\""}]})"), Call("now", "{}")}});
  CheckEverySplit(ToolParserKind::kMistral, "[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{\"city\": \"Paris\"}",
                  {"", {Call("get_weather", R"({"city": "Paris"})")}});
  // A decoder that hid [ARGS]: the name runs up to the '{' (vLLM's reading too).
  CheckEverySplit(ToolParserKind::kMistral, "[TOOL_CALLS]add{\"a\": 1}", {"", {Call("add", R"({"a": 1})")}});
  // The JSON form is still read when '[' or '{' follows the marker.
  CheckEverySplit(ToolParserKind::kMistral, "[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
                  {"", {Call("f", R"({"a": 1})")}});
  // Byte for byte: the streamed fragments are the arguments as the model wrote them.
  const std::string args = "{\"n\": 1.50, \"s\": \"\\u00e9\"}";
  ParsedToolCalls whole = ParseToolCalls(ToolParserKind::kMistral, "[TOOL_CALLS]f[ARGS]" + args);
  REQUIRE(whole.calls.size() == 1);
  CHECK(whole.calls[0].arguments == args);
  // The header goes out once the name has ended, the arguments as they come.
  ToolCallStream stream(ToolParserKind::kMistral, UINT32_MAX, Counter());
  CHECK(stream.Push("[TOOL_CALLS]get_wea").calls.empty());
  ToolStreamOut a = stream.Push("ther[ARGS]{\"ci");
  REQUIRE(a.calls.size() == 2);
  CHECK((a.calls[0].first && a.calls[0].name == "get_weather"));
  CHECK(a.calls[1].arguments == "{\"ci");
  // parallel_tool_calls false: the second call is dropped with its text.
  ParsedToolCalls one = ParseToolCalls(ToolParserKind::kMistral, "[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{\"x\": 1}",
                                       1, Counter());
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0].name == "a");
  CHECK(one.content.empty());
}

TEST_CASE("mistral v11+: a name that is no name, a cut call or bad arguments leave the answer as content") {
  const std::vector<std::string> texts = {
      "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS]f[ARGS]{\"a\": ", "[TOOL_CALLS]f[ARGS]{\"a\" 1}",
      "[TOOL_CALLS]f[ARGS]", "[TOOL_CALLS]f[CALL_ID]x y[ARGS]{}", "[TOOL_CALLS]f[OTHER]{}",
      "[TOOL_CALLS]" + std::string(65, 'n') + "[ARGS]{}",
      "[TOOL_CALLS]f[ARGS]" + std::string(300, ' ')};
  for (const std::string& text : texts) {
    CAPTURE(text);
    ParsedToolCalls whole = ParseToolCalls(ToolParserKind::kMistral, text);
    CHECK(whole.calls.empty());
    CHECK(whole.content == text);
  }
  // Streamed, text that never became a call goes out as it was.
  ParsedToolCalls streamed = Joined(ToolParserKind::kMistral, {"x [TOOL_CALLS]na", "me[AR"});
  CHECK(streamed.calls.empty());
  CHECK(streamed.content == "x [TOOL_CALLS]name[AR");
}

TEST_CASE("a malformed or cut-off call leaves the whole answer as content in a whole response") {
  const std::string cut = "ok <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": ";
  ParsedToolCalls whole = ParseToolCalls(ToolParserKind::kHermes, cut);
  CHECK(whole.calls.empty());
  CHECK(whole.content == cut);
  ParsedToolCalls bad = ParseToolCalls(ToolParserKind::kHermes, "<tool_call>{\"arguments\": {}}</tool_call>");
  CHECK(bad.calls.empty());
  CHECK(bad.content == "<tool_call>{\"arguments\": {}}</tool_call>");
  ParsedToolCalls garbage = ParseToolCalls(ToolParserKind::kHermes, "<tool_call>not json</tool_call> after");
  CHECK(garbage.calls.empty());
  CHECK(garbage.content == "<tool_call>not json</tool_call> after");
  // Streamed, a call whose name never came goes out as the text it was.
  ParsedToolCalls streamed = Joined(ToolParserKind::kHermes, {"a <tool_call>{\"na"});
  CHECK(streamed.calls.empty());
  CHECK(streamed.content == "a <tool_call>{\"na");
}

TEST_CASE("parallel_tool_calls false: calls after the first are dropped with their text") {
  const std::string two = "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>\n"
                          "<tool_call>{\"name\": \"b\", \"arguments\": {\"y\": 2}}</tool_call>";
  ParsedToolCalls one = ParseToolCalls(ToolParserKind::kHermes, two, 1, Counter());
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0].name == "a");
  CHECK(one.content.empty());
  for (size_t cut = 0; cut <= two.size(); ++cut) {
    ParsedToolCalls s = Joined(ToolParserKind::kHermes, {two.substr(0, cut), two.substr(cut)}, 1);
    REQUIRE(s.calls.size() == 1);
    CHECK(s.calls[0].arguments == R"({"x": 1})");
    CHECK(s.content.empty());
  }
}

TEST_CASE("streamed arguments go out as they are written, not only when the call ends") {
  ToolCallStream stream(ToolParserKind::kHermes, UINT32_MAX, Counter());
  ToolStreamOut a = stream.Push("<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Pa");
  REQUIRE(a.calls.size() == 2);
  CHECK(a.calls[0].first);
  CHECK(a.calls[0].id == "call_0");
  CHECK(a.calls[0].name == "f");
  CHECK(a.calls[1].arguments == "{\"city\": \"Pa");
  ToolStreamOut b = stream.Push("ris\"}}</tool_call>");
  REQUIRE(b.calls.size() == 1);
  CHECK(b.calls[0].arguments == "ris\"}");
  CHECK(stream.calls() == 1);
}

TEST_CASE("the parser is detected from the chat template's markers, and named by vLLM's names") {
  CHECK(DetectToolParser("{{- '<tool_call>\\n' }}") == ToolParserKind::kHermes);
  CHECK(DetectToolParser("[TOOL_CALLS] ") == ToolParserKind::kMistral);
  CHECK(DetectToolParser("{{- '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}") == ToolParserKind::kMistral);
  CHECK(ToolParserSpecialTokens(ToolParserKind::kMistral) ==
        std::vector<std::string_view>{"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"});
  CHECK(ToolParserSpecialTokens(ToolParserKind::kHermes).empty());
  CHECK(DetectToolParser("<|python_tag|>") == ToolParserKind::kLlama3Json);
  CHECK(DetectToolParser("{{ message.content }}") == ToolParserKind::kNone);
  CHECK(*ToolParserFromName("hermes") == ToolParserKind::kHermes);
  CHECK_FALSE(ToolParserFromName("pythonic").ok());
  CHECK(NewToolCallId().size() == 29);
  CHECK(NewToolCallId() != NewToolCallId());
}

TEST_CASE("a mistral model's calls get ids of 9 letters and digits, the only ones its templates take back") {
  auto nine = [](const std::string& id) {
    return id.size() == 9 && std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(c) != 0; });
  };
  CHECK(nine(NewMistralToolCallId()));
  CHECK(NewMistralToolCallId() != NewMistralToolCallId());
  ChatOutputSetup setup;
  setup.tools = ToolParserKind::kMistral;
  setup.mistral_ids = true;
  ChatOutput whole = ParseChatOutput(setup, "[TOOL_CALLS]f[ARGS]{}");
  REQUIRE(whole.calls.size() == 1);
  CHECK(nine(whole.calls[0].id));
  ChatOutputStream stream(setup);
  ChatOutputDelta d = stream.Push("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}]");
  REQUIRE(!d.calls.empty());
  CHECK(nine(d.calls[0].id));
  // Forced calls too: the template is the same.
  ChatOutputSetup forced;
  forced.forced = ToolChoice::kNamed;
  forced.forced_name = "f";
  forced.mistral_ids = true;
  ChatOutput named = ParseChatOutput(forced, "{}");
  REQUIRE(named.calls.size() == 1);
  CHECK(nine(named.calls[0].id));
  forced.mistral_ids = false;
  CHECK(ParseChatOutput(forced, "{}").calls[0].id.rfind("call_", 0) == 0);
}

}  // namespace kvfleet::router
