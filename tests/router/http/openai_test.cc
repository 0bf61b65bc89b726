// Parsing OpenAI request bodies: every check that earns a 400, and the stop matcher.
#include "router/http/openai.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace kvfleet::router {

namespace {
ApiError ParseError(std::string_view body, bool chat = false) {
  auto r = ParseCompletionRequest(body, chat);
  REQUIRE_FALSE(r.ok());
  return ErrorFromStatus(r.status());
}
}  // namespace

TEST_CASE("a completion request with every supported field parses") {
  auto r = ParseCompletionRequest(R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,
    "top_k":40,"seed":7,"stop":["\n","END"],"stream":true,"stream_options":{"include_usage":true},"user":"u",
    "cache_salt":"s","ignore_eos":true,"routing":"round_robin",
    "kv_retention":{"token_ranges":[{"start":0,"end":64,"priority":90,"duration_ms":1000}],"decode_priority":10}})",
                                  false);
  REQUIRE(r.ok());
  CHECK(r->model == "m");
  CHECK(*r->prompt_text == "hi");
  CHECK(*r->max_tokens == 5);
  CHECK(r->top_k == 40);
  CHECK(*r->seed == 7);
  CHECK(r->stop.size() == 2);
  CHECK(r->include_usage);
  CHECK(r->ignore_eos);
  CHECK(*r->routing == Policy::kRoundRobin);
  REQUIRE(r->retention.ranges.size() == 1);
  CHECK(*r->retention.ranges[0].end == 64);
  CHECK(r->retention.ranges[0].priority == 90);
  CHECK(*r->retention.decode_priority == 10);
}

TEST_CASE("token-id prompts and chat messages parse") {
  auto ids = ParseCompletionRequest(R"({"model":"m","prompt":[1,2,3]})", false);
  REQUIRE(ids.ok());
  CHECK(ids->prompt_tokens == std::vector<TokenId>{1, 2, 3});
  auto nested = ParseCompletionRequest(R"({"model":"m","prompt":[[4,5]]})", false);
  REQUIRE(nested.ok());
  CHECK(nested->prompt_tokens.size() == 2);
  auto chat = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":9})",
      true);
  REQUIRE(chat.ok());
  CHECK(*chat->max_tokens == 9);
}

TEST_CASE("malformed and unsupported requests are 400s naming the parameter") {
  CHECK(ParseError("{not json").message.find("not valid JSON") != std::string::npos);
  CHECK(ParseError("[1]").status == 400);
  CHECK(ParseError(std::string(100, '[') + std::string(100, ']')).message.find("nested") != std::string::npos);
  CHECK(ParseError(R"({"prompt":"x"})").param == "model");
  CHECK(ParseError(R"({"model":"m"})").param == "prompt");
  CHECK(ParseError(R"({"model":"m","prompt":{}})").param == "prompt");
  CHECK(ParseError(R"({"model":"m","prompt":[-1]})").param == "prompt");
  CHECK(ParseError(R"({"model":"m","prompt":"x","max_tokens":"5"})").param == "max_tokens");
  CHECK(ParseError(R"({"model":"m","prompt":"x","max_tokens":0})").param == "max_tokens");
  CHECK(ParseError(R"({"model":"m","prompt":"x","temperature":3})").param == "temperature");
  CHECK(ParseError(R"({"model":"m","prompt":"x","n":2})").param == "n");
  CHECK(ParseError(R"({"model":"m","prompt":"x","stop":[1]})").param == "stop");
  CHECK(ParseError(R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})").param == "stop");
  CHECK(ParseError(R"({"model":"m","prompt":"x","logprobs":3})").param == "logprobs");
  CHECK(ParseError(R"({"model":"m","prompt":"x","stream":"yes"})").param == "stream");
  CHECK(ParseError(R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})").param ==
        "stream_options");
  CHECK(ParseError(R"({"model":"m","prompt":"x","routing":"random"})").param == "routing");
  CHECK(ParseError(R"({"model":"m","prompt":"x","kv_retention":{"token_ranges":[{"start":5,"end":2}]}})").param ==
        "kv_retention");
  CHECK(ParseError(R"({"model":"m","prompt":"x","kv_retention":{"decode_priority":101}})").status == 400);
  CHECK(ParseError(R"({"model":"m","messages":[]})", true).param == "messages");
  CHECK(ParseError(R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", true).param == "messages");
  CHECK(ParseError(R"({"model":"m","messages":[{"role":"user","content":5}]})", true).param == "messages");
}

TEST_CASE("error objects have OpenAI's shape") {
  ApiError e = BadRequest("bad", "prompt");
  auto j = nlohmann::json::parse(e.ToJson());
  CHECK(j["error"]["message"] == "bad");
  CHECK(j["error"]["type"] == "invalid_request_error");
  CHECK(j["error"]["param"] == "prompt");
  CHECK(j["error"]["code"].is_null());
}

TEST_CASE("stop strings are found across token boundaries and never leak") {
  StopMatcher m({"END", "\n\n"});
  bool stopped = false;
  std::string out;
  for (std::string piece : {"hel", "lo E", "N", "D and more"}) {
    out += m.Push(piece, &stopped);
    if (stopped) break;
  }
  CHECK(stopped);
  CHECK(out == "hello ");
  StopMatcher none({"xyz"});
  out = none.Push("abcx", &stopped);
  CHECK_FALSE(stopped);
  CHECK(out == "abc");  // "x" may begin "xyz"
  out += none.Push("y!", &stopped);
  CHECK(out == "abcxy!");
  CHECK(none.Flush().empty());
  StopMatcher tail({"xyz"});
  CHECK(tail.Push("ax", &stopped) == "a");
  CHECK(tail.Flush() == "x");
}

}  // namespace kvfleet::router
