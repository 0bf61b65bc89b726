// Parsing OpenAI request bodies: every check that earns a 400, and the stop matcher.
#include "router/http/openai.h"

#include <cstdint>
#include <cstdio>

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
  CHECK(r->sampling.top_k == 40);
  CHECK(*r->sampling.seed == 7);
  CHECK(r->stop.size() == 2);
  CHECK(r->include_usage);
  CHECK(r->sampling.ignore_eos);
  CHECK(*r->routing == Policy::kRoundRobin);
  REQUIRE(r->retention.ranges.size() == 1);
  CHECK(*r->retention.ranges[0].end == 64);
  CHECK(r->retention.ranges[0].priority == 90);
  CHECK(*r->retention.decode_priority == 10);
}

TEST_CASE("n is 1 to max_n; best_of is refused with a 400 naming it unless it equals n") {
  for (bool chat : {false, true}) {
    CAPTURE(chat);
    const std::string head = chat ? R"({"model":"m","messages":[{"role":"user","content":"x"}])"
                                  : R"({"model":"m","prompt":"x")";
    auto one = ParseCompletionRequest(head + "}", chat);
    REQUIRE(one.ok());
    CHECK(one->sampling.n == 1);
    auto three = ParseCompletionRequest(head + (chat ? R"(,"n":3})" : R"(,"n":3,"best_of":3})"), chat);
    REQUIRE(three.ok());
    CHECK(three->sampling.n == 3);
    auto sixteen = ParseCompletionRequest(head + (chat ? R"(,"n":16})" : R"(,"n":16,"best_of":null})"), chat);
    REQUIRE(sixteen.ok());
    CHECK(sixteen->sampling.n == 16);
    // best_of is a completions field: on a chat it is refused whatever its value.
    if (chat) CHECK(ParseError(head + R"(,"n":3,"best_of":3})", chat).param == "best_of");
    ApiError best_of = ParseError(head + R"(,"n":2,"best_of":4})", chat);
    CHECK(best_of.param == "best_of");
    if (!chat) CHECK(best_of.message.find("must equal 'n'") != std::string::npos);
    CHECK(ParseError(head + R"(,"best_of":2})", chat).param == "best_of");  // n defaults to 1
    CHECK(ParseError(head + R"(,"n":2,"best_of":"2"})", chat).param == "best_of");
  }
  RequestLimits limits;
  limits.max_n = 4;
  CHECK_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":"x","n":5})", false, limits).ok());
  CHECK(ParseCompletionRequest(R"({"model":"m","prompt":"x","n":4})", false, limits).ok());
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
  CHECK(ParseError(R"({"model":"m","prompt":"x","n":0})").param == "n");
  CHECK(ParseError(R"({"model":"m","prompt":"x","n":17})").param == "n");  // RequestLimits::max_n
  CHECK(ParseError(R"({"model":"m","prompt":"x","n":2.5})").param == "n");
  CHECK(ParseError(R"({"model":"m","prompt":"x","stop":[1]})").param == "stop");
  CHECK(ParseError(R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})").param == "stop");
  CHECK(ParseError(R"({"model":"m","prompt":"x","logprobs":21})").param == "logprobs");
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

TEST_CASE("stop_token_ids: an array of non-negative ids on completions and chat; anything else is a 400 naming it") {
  auto c = ParseCompletionRequest(R"({"model":"m","prompt":"x","stop_token_ids":[128009, 0]})", false);
  REQUIRE(c.ok());
  CHECK(c->sampling.stop_token_ids == std::vector<TokenId>{128009, 0});
  auto chat = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":"hi"}],"stop_token_ids":[128009]})", true);
  REQUIRE(chat.ok());
  CHECK(chat->sampling.stop_token_ids == std::vector<TokenId>{128009});
  auto none = ParseCompletionRequest(R"({"model":"m","prompt":"x","stop_token_ids":null})", false);
  REQUIRE(none.ok());
  CHECK(none->sampling.stop_token_ids.empty());

  for (const char* bad : {R"("stop_token_ids":5)", R"("stop_token_ids":[-1])", R"("stop_token_ids":[1.5])",
                          R"("stop_token_ids":["2"])", R"("stop_token_ids":[4294967296])",
                          R"("stop_token_ids":{"a":1})"}) {
    ApiError e = ParseError(std::string(R"({"model":"m","prompt":"x",)") + bad + "}");
    CHECK_MESSAGE(e.status == 400, bad);
    CHECK_MESSAGE(e.param == "stop_token_ids", bad);
  }
  std::string many = "[";
  for (int i = 0; i <= 256; ++i) many += (i ? "," : "") + std::to_string(i);
  ApiError e = ParseError(std::string(R"({"model":"m","prompt":"x","stop_token_ids":)") + many + "]}");
  CHECK(e.param == "stop_token_ids");
  CHECK(e.message.find("at most 256") != std::string::npos);
}

// The edges below pin what the parser did when it was nlohmann::json::parse alone; the
// simdjson front end must keep every one (same values, same 400s and messages).
namespace {
std::string Completion(std::string_view fields) { return std::string(R"({"model":"m","prompt":"x",)") + std::string(fields) + "}"; }
constexpr std::string_view kInvalidJson = "the body is not valid JSON";
}  // namespace

TEST_CASE("a duplicated key takes its last value, as nlohmann's object did") {
  auto r = ParseCompletionRequest(R"({"model":"a","prompt":"x","model":"b","max_tokens":"five","max_tokens":5})", false);
  REQUIRE(r.ok());
  CHECK(r->model == "b");
  CHECK(*r->max_tokens == 5);
  CHECK(ParseError(R"({"model":"m","prompt":"x","max_tokens":5,"max_tokens":"five"})").param == "max_tokens");
  auto chat = ParseCompletionRequest(R"({"model":"m","messages":[{"role":"wizard","role":"user","content":"hi"}]})", true);
  REQUIRE(chat.ok());
  CHECK(chat->messages.dump() == R"([{"role":"user","content":"hi"}])");  // the key where it first came
}

TEST_CASE("integers past int64 and uint64 are numbers, not integers, and are refused where an integer is due") {
  CHECK(*ParseCompletionRequest(Completion(R"("seed":18446744073709551615)"), false)->sampling.seed == UINT64_MAX);
  CHECK(*ParseCompletionRequest(Completion(R"("seed":-1)"), false)->sampling.seed == UINT64_MAX);
  CHECK(*ParseCompletionRequest(Completion(R"("seed":-9223372036854775808)"), false)->sampling.seed == 0x8000000000000000ull);
  for (const char* big : {"18446744073709551616", "-9223372036854775809", "123456789012345678901234567890"}) {
    CAPTURE(big);
    ApiError seed = ParseError(Completion(std::string(R"("seed":)") + big));
    CHECK(seed.param == "seed");
    CHECK(seed.message == "'seed' must be an integer");
    CHECK(ParseError(Completion(std::string(R"("max_tokens":)") + big)).message == "'max_tokens' must be an integer");
    CHECK(ParseError(Completion(std::string(R"("top_k":)") + big)).param == "top_k");
    CHECK(ParseError(std::string(R"({"model":"m","prompt":[)") + big + "]}").param == "prompt");
    // An unknown field admitted by --allow-unknown-fields may hold any number JSON allows.
    RequestLimits admit;
    admit.fields.allow_unknown = true;
    CHECK(ParseCompletionRequest(Completion(std::string(R"("x_extra":{"n":)") + big + "}"), false, admit).ok());
  }
  CHECK(ParseError(Completion(R"("max_tokens":4294967296)")).message.find("must be between") != std::string::npos);
  // Bounds read as the client would write them.
  CHECK(ParseError(Completion(R"("max_tokens":-1)")).message.find("must be between 0 and ") != std::string::npos);
  CHECK(ParseError(Completion(R"("top_p":1.5)")).message == "'top_p' must be between 0 and 1");
  CHECK(ParseError(Completion(R"("presence_penalty":-2.5)")).message == "'presence_penalty' must be between -2 and 2");
}

TEST_CASE("numbers beyond double's range are malformed JSON; below it they are zero") {
  for (const char* inf : {"1e400", "-1e400", "1.7976931348623159e308"}) {
    CAPTURE(inf);
    ApiError e = ParseError(Completion(std::string(R"("metadata":)") + inf));
    CHECK(e.message == kInvalidJson);
    CHECK(e.param.empty());
    CHECK(e.status == 400);
  }
  auto tiny = ParseCompletionRequest(Completion(R"("temperature":1e-400)"), false);
  REQUIRE(tiny.ok());
  CHECK(tiny->sampling.temperature == 0.0f);
}

TEST_CASE("-0 is the integer 0 but not an unsigned token id; -0.0 is not an integer") {
  auto r = ParseCompletionRequest(Completion(R"("top_k":-0,"seed":-0,"temperature":-0)"), false);
  REQUIRE(r.ok());
  CHECK(r->sampling.top_k == 0);
  CHECK(*r->sampling.seed == 0);
  CHECK(ParseError(Completion(R"("max_tokens":-0)")).message.find("0 only with echo") != std::string::npos);
  CHECK(ParseError(Completion(R"("top_k":-0.0)")).message == "'top_k' must be an integer");
  CHECK(ParseError(R"({"model":"m","prompt":[1,-0]})").param == "prompt");
  CHECK(ParseCompletionRequest(R"({"model":"m","prompt":[0]})", false)->prompt_tokens == std::vector<TokenId>{0});
  auto chat = ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":"hi","n":-0,"x":-0.0}]})", true);
  REQUIRE(chat.ok());
  CHECK(chat->messages.dump() == R"([{"role":"user","content":"hi","n":0,"x":-0.0}])");
}

TEST_CASE("token-id prompts take only unsigned 32-bit integers") {
  CHECK(ParseCompletionRequest(R"({"model":"m","prompt":[4294967295]})", false)->prompt_tokens ==
        std::vector<TokenId>{static_cast<TokenId>(4294967295u)});
  for (const char* bad : {"4294967296", "-1", "1.0", "1e2", "18446744073709551615", "\"1\"", "null", "[1]"}) {
    CAPTURE(bad);
    CHECK(ParseError(std::string(R"({"model":"m","prompt":[1,)") + bad + "]}").param == "prompt");
  }
  CHECK(ParseError(R"({"model":"m","prompt":[1,1e400]})").message == kInvalidJson);
  CHECK(ParseError(R"({"model":"m","prompt":[1,2,]})").message == kInvalidJson);
}

TEST_CASE("strings must be valid UTF-8, and escapes decode as JSON defines them") {
  for (const char* bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80", "a\x01z", "a\tz"}) {
    CAPTURE(std::string_view(bad));
    CHECK(ParseError(std::string(R"({"model":"m","prompt":")") + bad + "\"}").message == kInvalidJson);
  }
  CHECK(ParseError("{\"model\":\"m\",\"prompt\":\"x\"\xff}").message == kInvalidJson);
  auto nul = ParseCompletionRequest(R"({"model":"m","prompt":"a\u0000b"})", false);
  REQUIRE(nul.ok());
  CHECK(*nul->prompt_text == std::string("a\0b", 3));
  auto pair = ParseCompletionRequest(R"({"model":"m","prompt":"\ud83d\ude00\u00e9\"\\\/\b\f\n\r\t"})", false);
  REQUIRE(pair.ok());
  CHECK(*pair->prompt_text == "\xf0\x9f\x98\x80\xc3\xa9\"\\/\b\f\n\r\t");
  for (const char* lone : {R"(\ud800)", R"(\udc00)", R"(\ud800\u0041)", R"(\ud800x)", R"(\ude00\ud83d)", R"(\u12)",
                           R"(\x41)"}) {
    CAPTURE(lone);
    CHECK(ParseError(std::string(R"({"model":"m","prompt":")") + lone + "\"}").message == kInvalidJson);
  }
}

TEST_CASE("the body is one JSON object and nothing more") {
  for (const char* not_object : {"[1]", "\"x\"", "1", "null", "true", " [] "}) {
    CAPTURE(not_object);
    CHECK(ParseError(not_object).message == "the body must be a JSON object");
  }
  for (std::string bad : {std::string(), std::string(" \n\t"), std::string(R"({"model":"m","prompt":"x"} x)"),
                          std::string(R"({"model":"m","prompt":"x"}{})"), std::string(R"({"model":"m","prompt":"x"},)"),
                          std::string(R"({"model":"m","prompt":"x")"), std::string("\0", 1),
                          std::string(R"({'model':'m'})"), std::string("\xef\xbb\xbf"), std::string(" \xef\xbb\xbf{}")}) {
    CAPTURE(bad);
    ApiError e = ParseError(bad);
    CHECK(e.message == kInvalidJson);
    CHECK(e.status == 400);
  }
  CHECK(ParseCompletionRequest(" \r\n{\"model\":\"m\",\"prompt\":\"x\"}\n\t ", false).ok());
  // nlohmann ends the input at a NUL byte outside strings (one inside a string is malformed).
  CHECK(ParseCompletionRequest(std::string(R"({"model":"m","prompt":"x"} )") + '\0' + "garbage", false).ok());
  CHECK(ParseError(std::string(R"({"model":"m","prompt":"x)") + '\0' + "\"}").message == kInvalidJson);
  CHECK(ParseError(std::string(R"({"model":"m","prompt":)") + '\0' + "\"x\"}").message == kInvalidJson);
  CHECK(ParseError(std::string("{}") + '\0' + std::string(80, '[')).message == "the JSON body is nested too deeply");
  // nlohmann skips a UTF-8 byte order mark at the very start.
  CHECK(ParseCompletionRequest("\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"x\"}", false).ok());
}

TEST_CASE("nesting deeper than 64 is refused before parsing, counted outside strings only") {
  auto nested = [](int depth) {
    return Completion(R"("x_extra":)" + std::string(depth - 1, '[') + std::string(depth - 1, ']'));
  };
  RequestLimits admit;  // x_extra is no field of /v1/completions
  admit.fields.allow_unknown = true;
  CHECK(ParseCompletionRequest(nested(64), false, admit).ok());
  CHECK(ParseError(nested(65)).message == "the JSON body is nested too deeply");
  // Unclosed or otherwise broken, deep input is still "too deep", as the depth check runs first.
  CHECK(ParseError(std::string(100, '[')).message == "the JSON body is nested too deeply");
  CHECK(ParseError(R"({"model":"m" "prompt":)" + std::string(80, '{')).message == "the JSON body is nested too deeply");
  CHECK(ParseError(R"({"model":"m","prompt":[1,-0],"x":)" + std::string(70, '[')).message ==
        "the JSON body is nested too deeply");
  CHECK(ParseError(R"({"model":"m" "prompt":)" + std::string(40, '{')).message == kInvalidJson);
  auto brackets = ParseCompletionRequest(R"({"model":"m","prompt":")" + std::string(200, '[') + R"(\"{{"})", false);
  REQUIRE(brackets.ok());
  CHECK(brackets->prompt_text->size() == 203);
}

TEST_CASE("a 1 MB prompt comes through byte for byte") {
  std::string prompt;
  for (int i = 0; prompt.size() < (1 << 20); ++i) prompt += "token " + std::to_string(i) + " \xc3\xa9 ";
  auto r = ParseCompletionRequest(R"({"model":"m","prompt":")" + prompt + "\"}", false);
  REQUIRE(r.ok());
  CHECK(*r->prompt_text == prompt);
  std::string escaped;
  for (int i = 0; escaped.size() < (1 << 20); ++i) escaped += "line\\n\\\"q\\\"\\u00e9 ";
  auto e = ParseCompletionRequest(R"({"model":"m","prompt":")" + escaped + "\"}", false);
  REQUIRE(e.ok());
  CHECK(e->prompt_text->find("line\n\"q\"\xc3\xa9 ") == 0);
}

TEST_CASE("a chat's messages keep every value as parsed: the client's key order, escapes and numbers survive a dump") {
  auto r = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":"a\"b\\c\n\u0001\u001f\u007f\u00e9\ud83d\ude00 \/",)"
      R"("name":"x","z":1.5,"a":[1,-2,true,null,1e2,0.1,1E-7,18446744073709551615,-9223372036854775808,{}],"e":[]},)"
      R"({"role":"assistant","content":null},{"role":"system","content":[{"type":"text","text":"t","x":{"b":1,"a":2}}]}]})",
      true);
  REQUIRE(r.ok());
  CHECK(r->messages.dump() ==
        "[{\"role\":\"user\",\"content\":\"a\\\"b\\\\c\\n\\u0001\\u001f\x7f\xc3\xa9\xf0\x9f\x98\x80 /\","
        "\"name\":\"x\",\"z\":1.5,\"a\":[1,-2,true,null,100.0,0.1,1e-07,18446744073709551615,-9223372036854775808,{}],"
        "\"e\":[]},{\"role\":\"assistant\",\"content\":\"\"},"  // null and text parts normalised (chat_messages.h)
        "{\"role\":\"system\",\"content\":\"t\"}]");
  std::string control;
  for (int c = 0; c < 0x20; ++c) {
    char esc[8];
    std::snprintf(esc, sizeof(esc), "\\u%04x", c);
    control += esc;
  }
  auto all = ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":")" + control + "\"}]}", true);
  REQUIRE(all.ok());
  CHECK(all->messages.dump() ==
        "[{\"role\":\"user\",\"content\":\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e"
        "\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d"
        "\\u001e\\u001f\"}]");
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
