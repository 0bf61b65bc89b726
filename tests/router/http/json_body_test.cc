// ParseJsonBody against its definition (the depth check, then nlohmann::json::parse), and
// DumpJson against nlohmann's dump, on hand-picked edges and on random mutations.
#include "router/http/json_body.h"
#include "tests/router/http/json_same.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::router {

namespace {

using nlohmann::json;

// What ParseCompletionRequest did before simdjson: the character loop the depth check was.
bool ReferenceDepthWithin(std::string_view s, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

Result<json> Reference(std::string_view body) {
  if (!ReferenceDepthWithin(body, config::kMaxJsonBodyDepth)) return InvalidArgument(std::string(kJsonTooDeep));
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(std::string(kJsonInvalid));
  return j;
}

using testing::SameJson;

void CheckLikeReference(std::string_view body) {
  CAPTURE(body);
  Result<json> got = ParseJsonBody(body);
  Result<json> want = Reference(body);
  REQUIRE(got.ok() == want.ok());
  if (!want.ok()) {
    CHECK(got.status().message() == want.status().message());
    return;
  }
  CHECK(SameJson(*got, *want));
  CHECK(DumpJson(*got) == want->dump());
}

}  // namespace

TEST_CASE("ParseJsonBody gives nlohmann's value and verdict at every edge") {
  const std::vector<std::string> bodies = {
      R"({"a":1,"a":"two","b":{"x":1,"x":[2]}})",
      R"({"n":[0,-0,-0.0,0.0,1,-1,9223372036854775807,9223372036854775808,18446744073709551615]})",
      R"({"n":[18446744073709551616,-9223372036854775808,-9223372036854775809,1e308,1e-400,4.9e-324]})",
      R"({"n":1e400})", R"({"n":-1e400})", R"({"n":01})", R"({"n":1.})", R"({"n":-})", R"({"n":.5})", R"({"n":+1})",
      R"({"n":1e})", R"({"n":-0e5})", R"({"n":-01})", R"({"n":1E+2})", R"({"n":123456789012345678901234567890.5})",
      R"({"s":"\u0000\ud83d\ude00\u00e9\"\\\/\b\f\n\r\t"})", R"({"s":"\ud800"})", R"({"s":"\udc00"})",
      R"({"s":"\ud800\u0041"})", R"({"s":"\uD83D\uDE00"})", R"({"s":"\u00"})", R"({"s":"\x"})", R"({"s":"a)",
      "{\"s\":\"\xff\"}", "{\"s\":\"\xc0\xaf\"}", "{\"s\":\"\xed\xa0\x80\"}", "{\"s\":\"\xef\xbf\xbf\"}",
      "{\"s\":\"\x7f\"}", "{\"s\":\"\x01\"}", "{\"s\":\"\xf0\x9f\x98\"}", "{\"s\":1}\xff",
      "", " ", "[1]", "\"x\"", "1", "-0", "null", "true", "false", "nul", "tru", "{}", "[]", "{} ", " {}x", "{}{}",
      "{},", "{\"a\":1,}", "[1,]", "{\"a\"}", "{\"a\":}", "{a:1}", "{'a':1}", "\xef\xbb\xbf{}", "\xef\xbb\xbf",
      " \xef\xbb\xbf{}", "\xef\xbb{}", std::string("{}\0x", 4), std::string("\0{}", 3),
      std::string("{\"a\":\"x\0\"}", 10), std::string("{\"a\":1\0}", 8), std::string("[1]\0[[[[", 8),
      std::string(64, '[') + std::string(64, ']'), std::string(65, '[') + std::string(65, ']'),
      std::string(65, '[') + "1", "[\"" + std::string(100, '[') + "\"]", "{\"a\":\"\\\\\"," + std::string(70, '{'),
      "{\"a\":-0," + std::string(70, '[') + std::string(70, ']') + "}", "{\"a\":\"-0\",\"b\":-0.5,\"c\":[-0]}",
  };
  for (const std::string& body : bodies) CheckLikeReference(body);
}

TEST_CASE("ParseJsonBody matches nlohmann on random mutations of request bodies") {
  const std::vector<std::string> seeds = {
      R"({"model":"m","prompt":"hello \"world\"\n\u00e9","max_tokens":16,"temperature":0.5,"stop":["a"]})",
      R"({"model":"m","prompt":[1,2,3,4294967295],"seed":-1,"kv_retention":{"token_ranges":[{"start":0}]}})",
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"n":1e0})",
  };
  const std::vector<std::string> pieces = {
      "{", "}", "[", "]", "\"", "\\", ",", ":", "-0", "0", "1e400", "18446744073709551616", "\\u", "d800", "\\ud83d",
      "\xff", "\xc3\xa9", "\xef\xbb\xbf", std::string(1, '\0'), " ", "\n", "null", "true", "1.5", "-", "e", "\x01"};
  std::mt19937 rng(11);
  for (int i = 0; i < 4000; ++i) {
    std::string body = seeds[rng() % seeds.size()];
    for (int edits = 1 + rng() % 3; edits > 0; --edits) {
      size_t at = rng() % (body.size() + 1);
      switch (rng() % 3) {
        case 0: body.insert(at, pieces[rng() % pieces.size()]); break;
        case 1: body.erase(at, 1 + rng() % 3); break;
        default: body.replace(at, 1, pieces[rng() % pieces.size()]); break;
      }
    }
    CheckLikeReference(body);
  }
}

TEST_CASE("JsonDepthWithin counts as the character loop did, escapes included") {
  std::mt19937 rng(5);
  const char alphabet[] = {'[', ']', '{', '}', '"', '\\', 'a', ' '};
  for (int i = 0; i < 20000; ++i) {
    std::string s(rng() % 40, ' ');
    for (char& c : s) c = alphabet[rng() % sizeof(alphabet)];
    for (int limit : {0, 1, 2, 4}) {
      CAPTURE(s);
      CAPTURE(limit);
      CHECK(JsonDepthWithin(s, limit) == ReferenceDepthWithin(s, limit));
    }
  }
}

TEST_CASE("DumpJson writes what nlohmann's dump writes") {
  std::string every_byte;
  for (int c = 1; c < 0x80; ++c) every_byte.push_back(static_cast<char>(c));
  every_byte += std::string("\0\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 10);
  const json values[] = {
      json(every_byte),
      json::parse(R"({"z":[1,-2,3.5,1e-7,1e21,-0.0,0.1,null,true,false,{},[],""],"a":{"b":"\u001f"},"":1})"),
      json(18446744073709551615ull),
      json(-9223372036854775807LL - 1),
      json(5e-324),
      json::array(),
      json::object(),
  };
  for (const json& v : values) CHECK(DumpJson(v) == v.dump());
}

TEST_CASE("a body past the pooled size parses with a parser of its own, same limits") {
  std::string big = "{\"p\":\"" + std::string(config::kMaxPooledBodyBytes, 'x') + "\"}";
  auto r = ParseJsonBody(big);
  REQUIRE(r.ok());
  CHECK((*r)["p"].get_ref<const std::string&>().size() == config::kMaxPooledBodyBytes);
  std::string deep = "{\"p\":\"" + std::string(config::kMaxPooledBodyBytes, 'x') + "\",\"q\":" + std::string(64, '[') +
                     std::string(64, ']') + "}";
  CHECK(ParseJsonBody(deep).status().message() == kJsonTooDeep);
  // The thread's pooled parser keeps its depth limit as it grows.
  std::string grown = "{\"p\":\"" + std::string(config::kMaxPooledBodyBytes / 2, 'x') + "\",\"q\":" +
                      std::string(64, '[') + std::string(64, ']') + "}";
  CHECK(ParseJsonBody(grown).status().message() == kJsonTooDeep);
  CheckLikeReference("{\"q\":" + std::string(63, '[') + std::string(63, ']') + ",\"p\":\"" +
                     std::string(config::kMaxPooledBodyBytes, 'y') + "\"}");
}

TEST_CASE("a token-id member comes out as ids, and only when it is a non-empty array of ids in [0, 2^32)") {
  std::vector<uint32_t> ids;
  bool taken = false;
  auto parse = [&](const std::string& body) { return ParseJsonBody(body, TokenIdMember{"prompt", &ids, &taken}); };

  SUBCASE("taken: the ids, and the key left out") {
    auto r = parse(R"({"model":"m","prompt":[0,1,4294967295],"max_tokens":3})");
    REQUIRE(r.ok());
    CHECK(taken);
    CHECK(ids == std::vector<uint32_t>{0, 1, 4294967295u});
    CHECK(*r == json::parse(R"({"model":"m","max_tokens":3})"));
  }
  SUBCASE("anything else: ParseJsonBody's value, nothing taken") {
    for (const char* prompt : {"[]", "[1,-1]", "[1,2.0]", "[1,4294967296]", "[1,18446744073709551615]", "[[1,2]]",
                               "[\"a\"]", "\"text\"", "null", "{}"}) {
      INFO(prompt);
      const std::string body = std::string(R"({"model":"m","prompt":)") + prompt + "}";
      auto r = parse(body);
      auto plain = ParseJsonBody(body);
      REQUIRE(r.ok() == plain.ok());
      CHECK_FALSE(taken);
      CHECK(ids.empty());
      if (r.ok()) CHECK(*r == *plain);
    }
  }
  SUBCASE("a repeated key: the last one counts, as in nlohmann") {
    auto r = parse(R"({"prompt":[1,2],"model":"m","prompt":"x"})");
    REQUIRE(r.ok());
    CHECK_FALSE(taken);
    CHECK((*r)["prompt"] == "x");
    r = parse(R"({"prompt":"x","model":"m","prompt":[3]})");
    REQUIRE(r.ok());
    CHECK(taken);
    CHECK(ids == std::vector<uint32_t>{3});
    CHECK_FALSE(r->contains("prompt"));
  }
  SUBCASE("bodies nlohmann parses itself keep the array in the value") {
    auto r = parse(R"({"model":"m","prompt":[1,2],"x":-0})");
    REQUIRE(r.ok());
    CHECK_FALSE(taken);
    CHECK((*r)["prompt"] == json::array({1, 2}));
  }
  SUBCASE("not an object, or invalid: as ParseJsonBody") {
    CHECK(parse("[1,2]").ok());  // a top-level array: nothing to take
    CHECK_FALSE(taken);
    CHECK(parse(R"({"prompt":[1,2)").status().message() == kJsonInvalid);
    CHECK_FALSE(taken);
  }
}

}  // namespace kvfleet::router
