// JSON Schema specs against an independent reference (tests/grammar/json_reference.h):
// (a) generated instances and their mutations are accepted iff the reference finds them
// valid, fed byte by byte and as random multi-byte token splits; (b) every text a random
// walk over the allowed tokens ends with is valid; masks equal brute force on the way.
#include <set>

#include "tests/grammar/grammar_test_util.h"
#include "tests/grammar/json_reference.h"

namespace kvfleet::grammar {
namespace {

using testing::Json;
using testing::Reference;

// The texts the grammar is exact on: JSON without whitespace outside strings, escapes as
// serializers write them, no exponent, no duplicate keys, no integer beyond 15 digits.
// Others are skipped (the grammar documents that it generates only this form).
bool Comparable(const std::string& text) {
  bool in_string = false;
  int digits = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\' && i + 1 < text.size()) {
        char e = text[++i];
        if (e == '/') return false;
        if (e == 'u') {
          std::string hex = text.substr(i + 1, 4);
          if (hex.size() < 4 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
            if (hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) return false;
            continue;  // not JSON: both sides reject it
          }
          long v = std::strtol(hex.c_str(), nullptr, 16);
          if (v >= 0x20 || v == '\b' || v == '\t' || v == '\n' || v == '\f' || v == '\r') return false;
        }
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') return false;
    if ((c == 'e' || c == 'E') && i > 0 && std::isdigit(static_cast<unsigned char>(text[i - 1]))) return false;
    digits = std::isdigit(static_cast<unsigned char>(c)) ? digits + 1 : 0;
    if (digits > 15) return false;
  }
  // Duplicate keys: nlohmann keeps one, the grammar sees two.
  std::vector<std::set<std::string>> keys;
  bool dup = false;
  auto parsed = Json::parse(text, [&](int, Json::parse_event_t event, Json& value) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(value.get<std::string>()).second) dup = true;
    return true;
  }, /*allow_exceptions=*/false);
  return !dup;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Every node's JSON pointer.
void Pointers(const Json& j, const std::string& at, std::vector<std::string>* out) {
  out->push_back(at);
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      std::string seg;
      for (char c : k) seg += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
      Pointers(v, at + "/" + seg, out);
    }
  }
  if (j.is_array()) for (size_t i = 0; i < j.size(); ++i) Pointers(j[i], at + "/" + std::to_string(i), out);
}

Json MutateValue(Json j, std::mt19937* rng) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(*rng); };
  std::vector<std::string> ptrs;
  Pointers(j, "", &ptrs);
  std::string at = ptrs[pick(ptrs.size())];
  Json& node = at.empty() ? j : j[Json::json_pointer(at)];
  static const Json kValues[] = {nullptr, true, 1, -5, 2.5, 0, "x", "", Json::array(), Json::object(), 1000000,
                                 "abc-12", Json::array({1, "a"}), Json::object({{"k", 1}})};
  switch (pick(4)) {
    case 0: node = kValues[pick(std::size(kValues))]; break;
    case 1:
      if (node.is_object() && !node.empty()) node.erase(std::next(node.begin(), static_cast<long>(pick(node.size()))).key());
      else node = kValues[pick(std::size(kValues))];
      break;
    case 2:
      if (node.is_object()) node["extra" + std::to_string(pick(3))] = kValues[pick(std::size(kValues))];
      else if (node.is_array()) node.push_back(kValues[pick(std::size(kValues))]);
      break;
    default:
      if (node.is_array() && !node.empty()) node.erase(node.size() - 1);
      else if (node.is_string()) node = node.get<std::string>() + "\xC3\xA9";
      else if (node.is_number_integer()) node = node.get<int64_t>() + static_cast<int64_t>(pick(5)) - 2;
      break;
  }
  return j;
}

std::string MutateBytes(std::string s, std::mt19937* rng) {
  static const std::string kAlphabet = "{}[]\",:0123456789-.eE+tfnul a\\";
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(*rng); };
  size_t pos = pick(s.size() + 1);
  char c = kAlphabet[pick(kAlphabet.size())];
  switch (pick(3)) {
    case 0: s.insert(s.begin() + static_cast<long>(pos), c); break;
    case 1: if (pos < s.size()) s.erase(pos, 1); break;
    default: if (pos < s.size()) s[pos] = c; break;
  }
  return s;
}

// Runs (a) and (b) for one schema; returns how many texts were compared.
void CheckSchema(const std::string& schema, bool strict = true, int instances = 60, int walks = 16) {
  CAPTURE(schema);
  const Vocabulary bytes = testing::ByteVocab(), multi = testing::MultiVocab();
  auto g_bytes = testing::MustCompile({Kind::kJsonSchema, schema, strict}, bytes);
  auto g_multi = testing::MustCompile({Kind::kJsonSchema, schema, strict}, multi);
  Reference ref(Json::parse(schema), strict);
  std::mt19937 rng(12345);
  int compared = 0, valid = 0;
  auto compare = [&](const std::string& text) {
    if (!Comparable(text)) return;
    CAPTURE(text);
    auto parsed = Json::parse(text, nullptr, false);
    bool expect = !parsed.is_discarded() && ref.Valid(parsed);
    CHECK(testing::MatchBytes(g_bytes, text) == expect);
    CHECK(testing::MatchTokens(g_multi, multi, text, &rng) == expect);
    ++compared;
    valid += expect;
  };
  for (int i = 0; i < instances; ++i) {
    Json x = ref.Generate(&rng);
    std::string text = Dump(x);
    compare(text);
    compare(Dump(MutateValue(x, &rng)));
    compare(MutateBytes(text, &rng));
    compare(MutateBytes(MutateBytes(text, &rng), &rng));
  }
  CHECK(compared > instances * 2);
  CHECK(valid > instances / 2);
  // (b): random walks end in valid JSON; masks equal brute force along the way.
  int ended = 0;
  for (int w = 0; w < walks; ++w) {
    bool terminated = false;
    std::string out = testing::RandomWalk(g_multi, multi, &rng, 200, &terminated);
    // Numbers beyond double or int64 range are valid JSON the reference cannot read.
    if (!terminated || !Comparable(out)) continue;
    ++ended;
    CAPTURE(out);
    auto parsed = Json::parse(out, nullptr, false);
    REQUIRE_FALSE(parsed.is_discarded());
    CHECK(ref.Valid(parsed));
  }
  CHECK(ended > 0);
}

TEST_CASE("objects: required, optional, nested, enum, const, nullable, additionalProperties false") {
  CheckSchema(R"({"type":"object","properties":{
      "name":{"type":"string","minLength":1,"maxLength":4},
      "age":{"type":"integer","minimum":0,"maximum":150},
      "tags":{"type":"array","items":{"enum":["a","b",1,null]}},
      "kind":{"const":"x"},
      "nick":{"type":["string","null"],"maxLength":2},
      "ok":{"type":"boolean"},
      "inner":{"type":"object","properties":{"v":{"type":"number"}},"required":["v"]}
    },"required":["name","age"],"additionalProperties":false})");
  CheckSchema(R"({"type":"object","properties":{"a":{"type":"null"},"b":{"type":"integer"},"c":{"type":"boolean"}}})");
  CheckSchema(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
}

TEST_CASE("additionalProperties true, a schema, and absent when not strict; keys never repeat a declared name") {
  CheckSchema(R"({"type":"object","properties":{"a":{"type":"integer"},"ab":{"type":"string"}},"additionalProperties":true})");
  CheckSchema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"integer"}})");
  CheckSchema(R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})", /*strict=*/false);
  auto g = testing::MustCompile({Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true})"},
                                testing::ByteVocab());
  CHECK(testing::MatchBytes(g, R"({"a":1,"b":"x"})"));
  CHECK_FALSE(testing::MatchBytes(g, R"({"a":1,"a":2})"));
  CHECK_FALSE(testing::MatchBytes(g, R"({"b":1,"a":2})"));  // declared properties come first
}

TEST_CASE("arrays: items, prefixItems, minItems and maxItems") {
  CheckSchema(R"({"type":"array","items":{"type":"integer","minimum":-3,"maximum":3},"minItems":1,"maxItems":4})");
  CheckSchema(R"({"type":"array","prefixItems":[{"type":"string","maxLength":2},{"type":"boolean"}],"items":{"type":"null"},"minItems":1})");
  CheckSchema(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"integer"}]})");  // strict: no more items
  CheckSchema(R"({"type":"array","prefixItems":[{"type":"integer"}]})", /*strict=*/false);
  CheckSchema(R"({"type":"array","items":{"type":"array","items":{"type":"boolean"},"maxItems":2}})");
}

TEST_CASE("anyOf, oneOf (as anyOf), allOf of one, type arrays, untyped schemas") {
  CheckSchema(R"({"anyOf":[{"type":"integer","maximum":5},{"type":"string","maxLength":1},{"type":"object","properties":{"k":{"type":"boolean"}},"required":["k"]}]})");
  CheckSchema(R"({"oneOf":[{"type":"integer"},{"type":"null"}]})");
  CheckSchema(R"({"allOf":[{"type":"array","items":{"type":"string","maxLength":3},"maxItems":3}]})");
  CheckSchema(R"({"type":["integer","boolean","null"]})");
  CheckSchema(R"({"properties":{"a":{"type":"integer"}},"required":["a"]})");  // any type; objects need "a"
}

TEST_CASE("$ref and $defs, including recursion") {
  CheckSchema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
      "$ref":"#/$defs/node"})");
  CheckSchema(R"({"type":"object","properties":{"p":{"$ref":"#/definitions/point"},"q":{"$ref":"#/definitions/point"}},
      "definitions":{"point":{"type":"array","prefixItems":[{"type":"number"},{"type":"number"}],"minItems":2}}})");
}

TEST_CASE("string patterns, anchored and not") {
  CheckSchema(R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[a-z]+-\\d{2}$"},
      "any":{"type":"string","pattern":"ab+c"},"alt":{"type":"string","pattern":"^abc|-1$"}},"required":["id","any"]})", true, 60, 40);
}

TEST_CASE("integer bounds are exact on every integer in a window") {
  auto bytes = testing::ByteVocab();
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> cases = {
      {R"({"type":"integer","minimum":0})", {0, INT64_MAX}},
      {R"({"type":"integer","minimum":-7,"maximum":123})", {-7, 123}},
      {R"({"type":"integer","exclusiveMinimum":-100,"exclusiveMaximum":-9})", {-99, -10}},
      {R"({"type":"integer","minimum":37,"maximum":1004})", {37, 1004}},
      {R"({"type":"integer","maximum":-250})", {INT64_MIN, -250}},
      {R"({"type":"integer","minimum":1.5,"maximum":99.5})", {2, 99}},
      {R"({"type":"integer","minimum":999,"maximum":999})", {999, 999}},
      {R"({"type":"integer","minimum":-1000000000000,"maximum":100000000000})", {-1000000000000, 100000000000}},
  };
  for (const auto& [schema, range] : cases) {
    CAPTURE(schema);
    auto g = testing::MustCompile({Kind::kJsonSchema, schema}, bytes);
    for (int64_t v = -1200; v <= 1200; ++v) {
      CAPTURE(v);
      CHECK(testing::MatchBytes(g, std::to_string(v)) == (v >= range.first && v <= range.second));
    }
    std::vector<int64_t> edges;
    if (range.first != INT64_MIN) edges.insert(edges.end(), {range.first, range.first - 1});
    if (range.second != INT64_MAX) edges.insert(edges.end(), {range.second, range.second + 1});
    for (int64_t v : edges) CHECK(testing::MatchBytes(g, std::to_string(v)) == (v >= range.first && v <= range.second));
    CHECK_FALSE(testing::MatchBytes(g, "01"));
    CHECK_FALSE(testing::MatchBytes(g, "1.0"));
    CHECK_FALSE(testing::MatchBytes(g, "-0"));
  }
  auto any = testing::MustCompile({Kind::kJsonSchema, R"({"type":"integer"})"}, bytes);
  CHECK(testing::MatchBytes(any, "0"));
  CHECK(testing::MatchBytes(any, "-7"));
  CHECK_FALSE(testing::MatchBytes(any, "-0"));
  auto number = testing::MustCompile({Kind::kJsonSchema, R"({"type":"number"})"}, bytes);
  CHECK(testing::MatchBytes(number, "-0.5"));
  CHECK(testing::MatchBytes(number, "-0"));  // JSON's number grammar: -0 is a number
}

TEST_CASE("number bounds are exact on decimals; non-integer bounds are refused by name") {
  auto bytes = testing::ByteVocab();
  auto g = testing::MustCompile({Kind::kJsonSchema, R"({"type":"number","minimum":-2,"exclusiveMaximum":3})"}, bytes);
  for (int i = -5; i <= 5; ++i) {
    for (const char* frac : {"", ".0", ".5", ".25", ".00", ".01", ".99", ".000001"}) {
      for (bool negative : {false, true}) {
        if (negative != (i < 0) && i != 0) continue;
        std::string text = (negative ? "-" : "") + std::to_string(std::abs(i)) + frac;
        double v = std::stod(text);
        CAPTURE(text);
        CHECK(testing::MatchBytes(g, text) == (v >= -2 && v < 3));
      }
    }
  }
  CHECK(testing::MatchBytes(g, "-0"));
  CHECK(testing::MatchBytes(g, "2.999"));
  CHECK_FALSE(testing::MatchBytes(g, "3"));
  CHECK_FALSE(testing::MatchBytes(g, "-2.0001"));
  Status st = Validate({Kind::kJsonSchema, R"({"type":"number","minimum":0.5})"});
  CHECK(st.message().find("'minimum'") != std::string::npos);
}

TEST_CASE("formats: date, time, date-time, email, uuid, ipv4, ipv6; others are refused by name") {
  auto bytes = testing::ByteVocab();
  auto check = [&](const char* format, std::vector<const char*> good, std::vector<const char*> bad) {
    auto g = testing::MustCompile({Kind::kJsonSchema, std::string(R"({"type":"string","format":")") + format + "\"}"}, bytes);
    for (const char* s : good) CHECK_MESSAGE(testing::MatchBytes(g, "\"" + std::string(s) + "\""), format << " " << s);
    for (const char* s : bad) CHECK_FALSE_MESSAGE(testing::MatchBytes(g, "\"" + std::string(s) + "\""), format << " " << s);
  };
  check("date", {"2024-02-29", "1999-12-31"}, {"2024-13-01", "2024-1-01", "24-01-01", "2024-01-32"});
  check("time", {"23:59:60Z", "00:00:00.123+05:30", "12:00:00z"}, {"24:00:00Z", "12:00:00", "12:60:00Z"});
  check("date-time", {"2024-01-31T12:34:56Z", "2024-01-31t12:34:56.5-08:00"}, {"2024-01-31 12:34:56Z", "2024-01-31T12:34Z"});
  check("email", {"a@b.co", "first.last+tag@sub.example.org"}, {"a@b", "@b.co", "a..b@c.de", "a@-b.co"});
  check("uuid", {"123e4567-e89b-12d3-a456-426614174000"}, {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"});
  check("ipv4", {"0.0.0.0", "192.168.1.255"}, {"256.1.1.1", "01.1.1.1", "1.1.1"});
  check("ipv6", {"::", "::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "::ffff:192.0.2.1", "fe80::"},
        {"1:2:3:4:5:6:7:8:9", "2001:db8:::1", "1::2::3", "12345::", ":1:2:3:4:5:6:7"});
  Status st = Validate({Kind::kJsonSchema, R"({"type":"string","format":"uri"})"});
  CHECK(st.message().find("format 'uri' is not supported") != std::string::npos);
}

TEST_CASE("unsupported keywords are named with their JSON pointer; annotations are ignored") {
  auto error = [](const char* schema) {
    Status st = Validate({Kind::kJsonSchema, schema});
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == StatusCode::kInvalidArgument);
    return st.message();
  };
  CHECK(error(R"({"type":"object","properties":{"a":{"type":"string","contentEncoding":"base64"}}})")
            .find("unsupported keyword 'contentEncoding' at #/properties/a") != std::string::npos);
  CHECK(error(R"({"type":"array","items":{"type":"integer","multipleOf":3}})")
            .find("'multipleOf' at #/items") != std::string::npos);
  CHECK(error(R"({"type":"object","patternProperties":{"^x":{}}})").find("'patternProperties' at #") != std::string::npos);
  CHECK(error(R"({"type":"array","uniqueItems":true})").find("'uniqueItems'") != std::string::npos);
  CHECK(error(R"({"allOf":[{"type":"integer"},{"minimum":1}]})").find("'allOf'") != std::string::npos);
  CHECK(error(R"({"$ref":"http://example.com/s.json"})").find("'$ref'") != std::string::npos);
  CHECK(error(R"({"$ref":"#/$defs/missing"})").find("does not resolve") != std::string::npos);
  CHECK(error(R"({"type":"string","pattern":"(a)\\1"})").find("backreference") != std::string::npos);
  CHECK(error(R"({"type":"strin"})").find("unknown type 'strin'") != std::string::npos);
  CHECK(error(R"({"type":"object",)").find("not valid JSON") != std::string::npos);
  CHECK(error(R"({"type":"object","properties":{"a":{"$ref":"#/properties/a"}},"required":["a"]})").find("no finite string") != std::string::npos);
  CHECK(Validate({Kind::kJsonSchema, R"({"$schema":"https://json-schema.org/draft/2020-12/schema","title":"T",
      "description":"d","examples":[1],"default":1,"$comment":"c","x-vendor":{"a":1},"type":"integer"})"}).ok());
  CHECK(error(R"({"type":"string","nullable":true})").find("unsupported keyword 'nullable' at #") != std::string::npos);
}

TEST_CASE("schemas built to explode fail fast with 'grammar too large'") {
  auto error = [](const std::string& schema) {
    Status st = Validate({Kind::kJsonSchema, schema});
    REQUIRE_FALSE(st.ok());
    return st.message();
  };
  CHECK(error(R"({"type":"string","maxLength":100000})").find("grammar too large") != std::string::npos);
  CHECK(error(R"({"type":"array","items":{"type":"integer"},"minItems":100000})").find("grammar too large") != std::string::npos);
  // The subset construction's classic 2^20 blow-up, inside a pattern.
  CHECK(error(R"({"type":"string","pattern":"[ab]*a[ab]{20}"})").find("grammar too large") != std::string::npos);
  std::string deep = "{}";
  for (int i = 0; i < 200; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  CHECK(error(deep).find("nested deeper") != std::string::npos);
}

TEST_CASE("JsonSchemaToEbnf gives EBNF that compiles to the same language, under a rule prefix") {
  const char* schema = R"({"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer","minimum":1}},"required":["city"]})";
  auto ebnf = JsonSchemaToEbnf(schema, {true, "args-"});
  REQUIRE(ebnf.ok());
  CHECK(ebnf->find("args-root ::= ") == 0);
  std::string wrapped = "root ::= \"<call>\" args-root \"</call>\"\n" + *ebnf;
  auto g = testing::MustCompile({Kind::kEbnf, wrapped}, testing::ByteVocab());
  CHECK(testing::MatchBytes(g, R"(<call>{"city":"Paris","n":3}</call>)"));
  CHECK_FALSE(testing::MatchBytes(g, R"(<call>{"city":"Paris","n":0}</call>)"));
  CHECK_FALSE(testing::MatchBytes(g, R"(<call>{"n":3}</call>)"));
}

TEST_CASE("any_whitespace takes JSON's whitespace around structure; the default takes none") {
  const char* schema = R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer","minimum":0,"maximum":99}},
      "b":{"type":"object","properties":{"c":{"type":"boolean"}},"additionalProperties":{"type":"null"}},
      "d":{"type":"string","maxLength":3}},"required":["a"]})";
  const Vocabulary bytes = testing::ByteVocab(), multi = testing::MultiVocab();
  Spec spaced{Kind::kJsonSchema, schema};
  spaced.any_whitespace = true;
  auto g_spaced = testing::MustCompile(spaced, bytes);
  auto g_compact = testing::MustCompile({Kind::kJsonSchema, schema}, bytes);
  Reference ref(Json::parse(schema), true);
  std::mt19937 rng(5);
  for (int i = 0; i < 40; ++i) {
    Json x = ref.Generate(&rng);
    std::string pretty = x.dump(2), compact = Dump(x);
    CAPTURE(pretty);
    CHECK(testing::MatchBytes(g_spaced, pretty));
    CHECK(testing::MatchBytes(g_spaced, compact));
    CHECK(testing::MatchBytes(g_compact, pretty) == (pretty == compact));
  }
  CHECK(testing::MatchBytes(g_spaced, "{ \"a\" :\t[ 1 ,2\r\n] }"));
  CHECK_FALSE(testing::MatchBytes(g_spaced, "{\"a\":[1 2]}"));
  CHECK_FALSE(testing::MatchBytes(g_spaced, "{\"a\":[1]} "));  // none after the value
  auto g_multi = testing::MustCompile(spaced, multi);
  int ended = 0;
  for (int w = 0; w < 16; ++w) {
    bool terminated = false;
    std::string out = testing::RandomWalk(g_multi, multi, &rng, 200, &terminated);
    if (!terminated) continue;
    ++ended;
    CAPTURE(out);
    auto parsed = Json::parse(out, nullptr, false);
    REQUIRE_FALSE(parsed.is_discarded());
    CHECK(ref.Valid(parsed));
  }
  CHECK(ended > 0);
  Spec object{Kind::kJsonObject, ""};
  object.any_whitespace = true;
  CHECK(testing::MatchBytes(testing::MustCompile(object, bytes), "{\n  \"k\": [ {} ]\n}"));
}

TEST_CASE("json_object accepts any object, compact") {
  auto g = testing::MustCompile({Kind::kJsonObject, ""}, testing::ByteVocab());
  CHECK(testing::MatchBytes(g, R"({})"));
  CHECK(testing::MatchBytes(g, R"({"a":[1,{"b":null}],"c\"\u00e9":"x"})"));
  CHECK_FALSE(testing::MatchBytes(g, R"([1])"));
  CHECK_FALSE(testing::MatchBytes(g, R"({"a":1,})"));
  CHECK_FALSE(testing::MatchBytes(g, R"({"a": 1})"));  // compact: no whitespace
}

}  // namespace
}  // namespace kvfleet::grammar
