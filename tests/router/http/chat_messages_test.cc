// A chat's messages as SDKs send them, normalised for the chat template (chat_messages.h).
#include "router/http/chat_messages.h"

#include <doctest/doctest.h>

#include "router/http/openai.h"

namespace kvfleet::router {

namespace {
using ojson = nlohmann::ordered_json;

ojson Normalized(std::string_view messages) {
  ojson m = ojson::parse(messages);
  Status s = NormalizeChatMessages(&m);
  REQUIRE_MESSAGE(s.ok(), s.message());
  return m;
}

ApiError Refused(std::string_view messages) {
  ojson m = ojson::parse(messages);
  Status s = NormalizeChatMessages(&m);
  REQUIRE_FALSE(s.ok());
  return ErrorFromStatus(s);
}
}  // namespace

TEST_CASE("text content parts are joined with newlines before the template sees them (vLLM's rule)") {
  ojson m = Normalized(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
    {"role":"system","content":[]},{"role":"user","content":"plain"}])");
  CHECK(m[0]["content"] == "a\nb");
  CHECK(m[1]["content"] == "");
  CHECK(m[2]["content"] == "plain");
}

TEST_CASE("a non-text content part is a 400 naming its type and place") {
  ApiError e = Refused(R"([{"role":"user","content":"x"},
    {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}])");
  CHECK(e.param == "messages");
  CHECK(e.message.find("messages[1].content[1]") != std::string::npos);
  CHECK(e.message.find("'image_url'") != std::string::npos);
  CHECK(Refused(R"([{"role":"user","content":[{"text":"a"}]}])").message.find("'type'") != std::string::npos);
  CHECK(Refused(R"([{"role":"user","content":[{"type":"text","text":5}]}])").message.find("'text'") !=
        std::string::npos);
  CHECK(Refused(R"([{"role":"user","content":[{"type":"text","text":"a"}, 3]}])").message.find("content[1]") !=
        std::string::npos);
}

TEST_CASE("an assistant message with tool_calls and null content passes; its arguments become a mapping") {
  ojson m = Normalized(R"([{"role":"user","content":"weather?"},
    {"role":"assistant","content":null,"tool_calls":[
      {"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}},
      {"id":"call_2","type":"function","function":{"name":"now","arguments":""}}]},
    {"role":"tool","tool_call_id":"call_1","name":"get_weather","content":[{"type":"text","text":"20C"}]}])");
  CHECK(m[1]["content"] == "");
  const ojson& args = m[1]["tool_calls"][0]["function"]["arguments"];
  REQUIRE(args.is_object());
  CHECK(args.dump() == R"({"city":"Paris","unit":"c"})");  // the model's key order, for tojson
  CHECK(m[1]["tool_calls"][1]["function"]["arguments"] == ojson::object());
  CHECK(m[2]["tool_call_id"] == "call_1");
  CHECK(m[2]["name"] == "get_weather");
  CHECK(m[2]["content"] == "20C");
}

TEST_CASE("malformed tool calls and tool messages are 400s naming the path") {
  CHECK(Refused(R"([{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{oops"}}]}])")
            .message.find("messages[0].tool_calls[0].function.arguments") != std::string::npos);
  CHECK(Refused(R"([{"role":"assistant","tool_calls":[{"id":"c","type":"code","function":{"name":"f"}}]}])")
            .message.find(".type") != std::string::npos);
  CHECK(Refused(R"([{"role":"assistant","tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}])")
            .message.find(".function.name") != std::string::npos);
  CHECK(Refused(R"([{"role":"assistant","tool_calls":{}}])").message.find("tool_calls must be an array") !=
        std::string::npos);
  CHECK(Refused(R"([{"role":"tool","content":"20C"}])").message.find("tool_call_id") != std::string::npos);
  CHECK(Refused(R"([{"role":"user","content":"x","tool_calls":[]}])").message.find("only assistant") !=
        std::string::npos);
  CHECK(Refused(R"([{"role":"user","content":"x","name":7}])").message.find(".name") != std::string::npos);
  CHECK(Refused(R"([{"role":"user"}])").message.find("needs 'content'") != std::string::npos);
  // Arguments nested past the body's depth bound are refused, not parsed recursively.
  std::string deep(200, '[');
  CHECK(Refused(R"([{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":")" + deep +
                R"("}}]}])")
            .message.find("not valid JSON") != std::string::npos);
}

TEST_CASE("a chat request's messages are normalised by ParseCompletionRequest") {
  auto r = ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
      true);
  REQUIRE(r.ok());
  CHECK(r->messages[0]["content"] == "a\nb");
}

}  // namespace kvfleet::router
