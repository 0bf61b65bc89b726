// A chat's function tools: validation, tool_choice, the template's `tools` variable, and the
// rendered tools as ordinary prompt tokens (block hashes) (chat_tools.h).
#include "router/http/chat_tools.h"

#include <doctest/doctest.h>

#include "common/block_hash.h"
#include "router/http/codec.h"
#include "router/http/openai.h"

namespace kvfleet::router {

namespace {
using ojson = nlohmann::ordered_json;

constexpr std::string_view kWeather =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather now",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";

std::string Chat(std::string_view extra, std::string_view user = "weather in Paris?") {
  return R"({"model":"m","messages":[{"role":"user","content":")" + std::string(user) + "\"}]" +
         std::string(extra) + "}";
}

ApiError ParseError(const std::string& body, const RequestLimits& limits = {}) {
  auto r = ParseCompletionRequest(body, true, limits);
  REQUIRE_FALSE(r.ok());
  return ErrorFromStatus(r.status());
}
}  // namespace

TEST_CASE("function tools parse with tool_choice auto by default, keys in the client's order") {
  auto r = ParseCompletionRequest(Chat(R"(,"tools":[)" + std::string(kWeather) + "]"), true);
  REQUIRE(r.ok());
  REQUIRE(r->tools.tools);
  CHECK(r->tools.choice == ToolChoice::kAuto);
  CHECK(r->tools.parse_calls());
  CHECK(r->tools.parallel);
  CHECK(r->chat_template.tools == r->tools.tools);
  // The template's tojson writes the tool as the client ordered it (type before function).
  CHECK((*r->tools.tools)[0].dump() == ojson::parse(kWeather).dump());
  CHECK((*r->tools.tools)[0].begin().key() == "type");

  auto none = ParseCompletionRequest(Chat(R"(,"tools":[)" + std::string(kWeather) + R"(],"tool_choice":"none",)"
                                          R"("parallel_tool_calls":false)"),
                                     true);
  REQUIRE(none.ok());
  CHECK(none->tools.choice == ToolChoice::kNone);
  CHECK(none->chat_template.tools);  // still rendered, as vLLM does
  CHECK_FALSE(none->tools.parse_calls());
  CHECK_FALSE(none->tools.parallel);
  auto empty = ParseCompletionRequest(Chat(R"(,"tools":[],"tool_choice":"auto")"), true);
  REQUIRE(empty.ok());
  CHECK_FALSE(empty->tools.tools);
  CHECK_FALSE(empty->tools.parse_calls());
}

TEST_CASE("a malformed tool is a 400 naming its field") {
  CHECK(ParseError(Chat(R"(,"tools":{})")).param == "tools");
  CHECK(ParseError(Chat(R"(,"tools":[{"type":"retrieval"}])")).param == "tools[0].type");
  CHECK(ParseError(Chat(R"(,"tools":[{"type":"function"}])")).param == "tools[0].function");
  CHECK(ParseError(Chat(R"(,"tools":[{"type":"function","function":{"name":"get weather"}}])")).param ==
        "tools[0].function.name");
  CHECK(ParseError(Chat(R"(,"tools":[{"type":"function","function":{"name":")" + std::string(65, 'a') + "\"}}]")).param ==
        "tools[0].function.name");
  CHECK(ParseError(Chat(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])")).param ==
        "tools[0].function.parameters");
  ApiError array_schema =
      ParseError(Chat(R"(,"tools":[)" + std::string(kWeather) +
                      R"(,{"type":"function","function":{"name":"g","parameters":{"type":"array"}}}])"));
  CHECK(array_schema.param == "tools[1].function.parameters");
  CHECK(array_schema.message.find("JSON Schema object") != std::string::npos);
  CHECK(ParseError(Chat(R"(,"tools":[)" + std::string(kWeather) + "," + std::string(kWeather) + "]")).param ==
        "tools[1].function.name");
  CHECK(ParseError(Chat(R"(,"tools":[)" + std::string(kWeather) + R"(],"tool_choice":"sometimes")")).param ==
        "tool_choice");
  CHECK(ParseError(Chat(R"(,"tools":[)" + std::string(kWeather) + R"(],"parallel_tool_calls":1)")).param ==
        "parallel_tool_calls");
  CHECK(ParseError(Chat(R"(,"tools":[)" + std::string(kWeather) +
                        R"(],"tool_choice":{"type":"function","function":{"name":"other"}})"))
            .param == "tool_choice");
  CHECK(ParseError(Chat(R"(,"tool_choice":"required")")).param == "tool_choice");  // nothing to call
}

TEST_CASE("a forced call carries its schema, and names tool_choice as the field that set it") {
  const std::string required = Chat(R"(,"tools":[)" + std::string(kWeather) + R"(],"tool_choice":"required")");
  RequestLimits on;
  auto r = ParseCompletionRequest(required, true, on);
  REQUIRE(r.ok());
  CHECK(r->tools.forced());
  CHECK(r->structured_field == "tool_choice");
  const ojson schema = ojson::parse(ForcedCallSchema(r->tools));
  CHECK(schema["type"] == "array");
  CHECK(schema["items"]["anyOf"][0]["properties"]["name"]["enum"][0] == "get_weather");
  CHECK(schema["items"]["anyOf"][0]["properties"]["parameters"]["required"][0] == "city");
  CHECK_FALSE(schema.contains("maxItems"));
  auto named = ParseCompletionRequest(Chat(R"(,"tools":[)" + std::string(kWeather) +
                                           R"(],"parallel_tool_calls":false,)"
                                           R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})"),
                                      true, on);
  REQUIRE(named.ok());
  CHECK(named->tools.choice == ToolChoice::kNamed);
  CHECK(ojson::parse(ForcedCallSchema(named->tools))["properties"]["city"]["type"] == "string");
}

TEST_CASE("the Responses API's flat function tools become the chat shape") {
  auto flat = ValidateTools(ojson::parse(R"([{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}])"),
                            "tools", true);
  REQUIRE(flat.ok());
  CHECK((*flat)[0]["function"]["name"] == "f");
  CHECK((*flat)[0]["function"]["strict"] == true);
  auto bad = ValidateTools(ojson::parse(R"([{"type":"function","name":"f","parameters":[]}])"), "tools", true);
  REQUIRE_FALSE(bad.ok());
  CHECK(ErrorFromStatus(bad.status()).param == "tools[0].parameters");
}

TEST_CASE("rendered tools are prompt tokens like any other: the same tools and a different last message share "
          "their leading blocks' hashes") {
  auto codec = MakeByteCodec();
  const std::string tools = R"(,"tools":[)" + std::string(kWeather) + "]";
  auto a = ParseCompletionRequest(Chat(tools, "weather in Paris?"), true);
  auto b = ParseCompletionRequest(Chat(tools, "and in Rome, tomorrow?"), true);
  auto bare = ParseCompletionRequest(Chat("", "weather in Paris?"), true);
  REQUIRE((a.ok() && b.ok() && bare.ok()));
  auto ta = codec->EncodeChat(a->messages, a->chat_template);
  auto tb = codec->EncodeChat(b->messages, b->chat_template);
  auto tbare = codec->EncodeChat(bare->messages, bare->chat_template);
  REQUIRE((ta.ok() && tb.ok() && tbare.ok()));
  CHECK(ta->size() > tbare->size() + 100);  // the tools were rendered
  const BlockHasher hasher(16, HashNamespace{"m", "", ""});
  const auto ha = hasher.HashAll(*ta), hb = hasher.HashAll(*tb), hbare = hasher.HashAll(*tbare);
  // Every full block of the tools prefix ("<|tools|>\n[...]\n<|user|>\n") is shared.
  const size_t prefix_blocks = (std::string("<|tools|>\n").size() + ojson::parse("[" + std::string(kWeather) + "]").dump().size() +
                                std::string("\n<|user|>\n").size()) / 16;
  REQUIRE(prefix_blocks >= 8);
  REQUIRE((ha.size() > prefix_blocks && hb.size() > prefix_blocks));
  for (size_t i = 0; i < prefix_blocks; ++i) CHECK(ha[i] == hb[i]);
  CHECK(ha[prefix_blocks] != hb[prefix_blocks]);  // the user messages differ from there
  CHECK(ha[0] != hbare[0]);                      // and a chat without the tools shares nothing
}

}  // namespace kvfleet::router
