// Structured-output request fields parsed into SamplingParams::structured and checked by the
// grammar engine before routing (structured_output.h).
#include "router/http/structured_output.h"

#include <doctest/doctest.h>

#include "router/http/openai.h"

namespace kvfleet::router {

namespace {
using Kind = StructuredOutput::Kind;

RequestLimits On() { return RequestLimits{}; }

std::string Chat(std::string_view extra) {
  return R"({"model":"m","messages":[{"role":"user","content":"hi"}])" + std::string(extra) + "}";
}

StructuredOutput Parsed(const std::string& body, bool chat = true) {
  auto r = ParseCompletionRequest(body, chat, On());
  REQUIRE_MESSAGE(r.ok(), r.status().message());
  return r->sampling.structured;
}

ApiError Refused(const std::string& body, const RequestLimits& limits = On(), bool chat = true) {
  auto r = ParseCompletionRequest(body, chat, limits);
  REQUIRE_FALSE(r.ok());
  return ErrorFromStatus(r.status());
}
}  // namespace

TEST_CASE("each constraint field parses into its kind, a schema keeping the client's key order") {
  CHECK(Parsed(Chat(R"(,"response_format":{"type":"text"})")).kind == Kind::kNone);
  CHECK(Parsed(Chat(R"(,"response_format":{"type":"json_object"})")) == StructuredOutput{Kind::kJsonObject, ""});
  CHECK(Parsed(Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"w","strict":true,)"
                    R"("schema":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}}}}})")) ==
        StructuredOutput{Kind::kJsonSchema, R"({"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}}})"});
  CHECK(Parsed(Chat(R"(,"guided_json":{"type":"object"})")) == StructuredOutput{Kind::kJsonSchema, R"({"type":"object"})"});
  CHECK(Parsed(Chat(R"(,"guided_json":"{\"type\":\"object\"}")")) ==
        StructuredOutput{Kind::kJsonSchema, R"({"type":"object"})"});
  CHECK(Parsed(Chat(R"(,"guided_regex":"[0-9]+")")) == StructuredOutput{Kind::kRegex, "[0-9]+"});
  CHECK(Parsed(Chat(R"(,"guided_choice":["yes","no"])")) == StructuredOutput{Kind::kChoice, R"(["yes","no"])"});
  CHECK(Parsed(Chat(R"(,"guided_grammar":"root ::= \"a\"")")) == StructuredOutput{Kind::kEbnf, "root ::= \"a\""});
  CHECK(Parsed(Chat(R"(,"structured_outputs":{"choice":["a"]})")) == StructuredOutput{Kind::kChoice, R"(["a"])"});
  CHECK(Parsed(Chat(R"(,"structured_outputs":{"json_object":true})")).kind == Kind::kJsonObject);
  // guided_* are completions fields too.
  CHECK(Parsed(R"({"model":"m","prompt":"x","guided_regex":"a|b"})", false).kind == Kind::kRegex);
}

TEST_CASE("malformed constraints and two at once are 400s naming the field") {
  CHECK(Refused(Chat(R"(,"response_format":{"type":"xml"})")).param == "response_format.type");
  CHECK(Refused(Chat(R"(,"response_format":{"type":"json_schema"})")).param == "response_format.json_schema");
  CHECK(Refused(Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"w","schema":[]}})")).param ==
        "response_format.json_schema.schema");
  CHECK(Refused(Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{}}})")).param ==
        "response_format.json_schema.name");
  CHECK(Refused(Chat(R"(,"guided_json":"{oops")")).param == "guided_json");
  CHECK(Refused(Chat(R"(,"guided_json":5)")).param == "guided_json");
  CHECK(Refused(Chat(R"(,"guided_regex":"")")).param == "guided_regex");
  CHECK(Refused(Chat(R"(,"guided_choice":[])")).param == "guided_choice");
  CHECK(Refused(Chat(R"(,"guided_choice":["a",1])")).param == "guided_choice");
  CHECK(Refused(Chat(R"(,"structured_outputs":{"structural_tag":"x"})")).param == "structured_outputs.structural_tag");
  CHECK(Refused(Chat(R"(,"structured_outputs":{"regex":"a","choice":["b"]})")).param == "structured_outputs.choice");
  ApiError two = Refused(Chat(R"(,"response_format":{"type":"json_object"},"guided_regex":"a")"));
  CHECK(two.param == "guided_regex");
  CHECK(two.message.find("one constraint") != std::string::npos);
  std::string big(sampling::config::kMaxStructuredSpecBytes + 1, 'a');
  CHECK(Refused(Chat(R"(,"guided_regex":")" + big + "\"")).param == "guided_regex");
}

TEST_CASE("a constraint names the field that set it, for routing's 400 when no worker can enforce it") {
  for (auto [body, field] : {std::pair{R"(,"response_format":{"type":"json_object"})", "response_format"},
                             std::pair{R"(,"guided_choice":["a","b"])", "guided_choice"},
                             std::pair{R"(,"structured_outputs":{"regex":"a"})", "structured_outputs.regex"}}) {
    CAPTURE(body);
    auto r = ParseCompletionRequest(Chat(body), true);
    REQUIRE_MESSAGE(r.ok(), r.status().message());
    CHECK(r->structured_field == field);
  }
  auto plain = ParseCompletionRequest(Chat(R"(,"response_format":{"type":"text"})"), true);
  REQUIRE(plain.ok());
  CHECK(plain->structured_field.empty());
}

TEST_CASE("a schema or pattern the grammar engine refuses is a 400 naming the field and the keyword") {
  ApiError e = Refused(Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"w",)"
                            R"("schema":{"type":"object","patternProperties":{"^a":{"type":"string"}}}}})"));
  CHECK(e.status == 400);
  CHECK(e.param == "response_format");
  CHECK(e.message.find("patternProperties") != std::string::npos);
  e = Refused(Chat(R"(,"guided_regex":"(a")"));
  CHECK(e.param == "guided_regex");
  e = Refused(Chat(R"(,"guided_grammar":"root ::= undefined_rule")"));
  CHECK(e.param == "guided_grammar");
  // Beyond grammar::Limits: refused, bounded (a nested bound multiplies the states).
  e = Refused(Chat(R"(,"guided_json":{"type":"array","minItems":5000,"items":{"type":"string","minLength":5000}})"));
  CHECK(e.param == "guided_json");
  CHECK(e.message.find("too large") != std::string::npos);
}

}  // namespace kvfleet::router
