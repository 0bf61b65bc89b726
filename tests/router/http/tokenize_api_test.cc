// /tokenize, /detokenize and /version (router/http/tokenize_api.h) over the byte codec, whose
// ids are the text's bytes, so every expected id list is the text itself.
#include "router/http/tokenize_api.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "common/build_info.h"
#include "tests/common/http/test_client.h"
#include "tests/router/fake_worker.h"
#include "tests/router/http/api_router.h"

namespace kvfleet::router {

using nlohmann::json;

namespace {

struct Models {
  std::unique_ptr<TextCodec> codec = MakeByteCodec();
  TokenizerModelLookup lookup = [this](const std::string& name) -> std::optional<TokenizerModel> {
    if (name != "m") return std::nullopt;
    return TokenizerModel{codec.get(), 4096};
  };
};

std::vector<TokenId> Bytes(std::string_view s) {
  return std::vector<TokenId>(reinterpret_cast<const unsigned char*>(s.data()),
                              reinterpret_cast<const unsigned char*>(s.data()) + s.size());
}

json Ok(const TokenizeAnswer& a) {
  REQUIRE_FALSE(a.error.has_value());
  return json::parse(a.body);
}

ApiError Err(const TokenizeAnswer& a) {
  REQUIRE(a.error.has_value());
  return *a.error;
}

}  // namespace

TEST_CASE("/tokenize of a prompt gives vLLM's count, max_model_len and tokens; /detokenize gives it back") {
  Models m;
  json t = Ok(Tokenize(R"({"model":"m","prompt":"héllo"})", m.lookup, {}));
  CHECK(t["tokens"].get<std::vector<TokenId>>() == Bytes("héllo"));
  CHECK(t["count"] == 6);
  CHECK(t["max_model_len"] == 4096);
  CHECK_FALSE(t.contains("token_strs"));
  json d = Ok(Detokenize(json{{"model", "m"}, {"tokens", t["tokens"]}}.dump(), m.lookup, {}));
  CHECK(d == json{{"prompt", "héllo"}});
  json strs = Ok(Tokenize(R"({"model":"m","prompt":"ab","return_token_strs":true})", m.lookup, {}));
  CHECK(strs["token_strs"] == json::array({"a", "b"}));
}

TEST_CASE("/tokenize of messages renders the chat template with the request's options") {
  Models m;
  const std::string messages = R"([{"role":"user","content":"hi"},{"role":"assistant","content":"Sure"}])";
  auto render = [&](const std::string& extra) {
    json t = Ok(Tokenize(R"({"model":"m","messages":)" + messages + extra + "}", m.lookup, {}));
    std::vector<TokenId> ids = t["tokens"];
    CHECK(t["count"] == ids.size());
    return std::string(ids.begin(), ids.end());
  };
  CHECK(render("") == "<|user|>\nhi\n<|assistant|>\nSure\n<|assistant|>\n");
  CHECK(render(R"(,"add_generation_prompt":false)") == "<|user|>\nhi\n<|assistant|>\nSure\n");
  CHECK(render(R"(,"continue_final_message":true,"add_generation_prompt":false)") ==
        "<|user|>\nhi\n<|assistant|>\nSure");
  ApiError both = Err(Tokenize(R"({"model":"m","messages":)" + messages +
                                   R"(,"continue_final_message":true,"add_generation_prompt":true})",
                               m.lookup, {}));
  CHECK(both.param == "continue_final_message");
}

TEST_CASE("/tokenize and /detokenize refuse bad input with a 400 naming the field, an unknown model with 404") {
  Models m;
  CHECK(Err(Tokenize(R"({"model":"m","prompt":"x","truncate":3})", m.lookup, {})).param == "truncate");
  CHECK_FALSE(Tokenize(R"({"model":"m","prompt":"x","truncate":3})", m.lookup, FieldRule{true, {}}).error);
  CHECK(Err(Tokenize(R"({"model":"m","prompt":"x","add_special_tokens":1})", m.lookup, {})).param ==
        "add_special_tokens");
  CHECK(Err(Tokenize(R"({"model":"m","prompt":[1,2]})", m.lookup, {})).param == "prompt");
  CHECK(Err(Tokenize(R"({"model":"m","messages":[{"role":"wizard","content":"x"}]})", m.lookup, {})).param ==
        "messages");
  CHECK(Err(Tokenize(R"({"prompt":"x"})", m.lookup, {})).param == "model");
  ApiError unknown = Err(Tokenize(R"({"model":"other","prompt":"x"})", m.lookup, {}));
  CHECK(unknown.status == 404);
  CHECK(unknown.code == "model_not_found");
  CHECK(Err(Detokenize(R"({"model":"m","tokens":[1,-2]})", m.lookup, {})).param == "tokens");
  CHECK(Err(Detokenize(R"({"model":"m","tokens":"ab"})", m.lookup, {})).param == "tokens");
  CHECK(Err(Detokenize(R"({"model":"m"})", m.lookup, {})).param == "tokens");
  CHECK(Err(Detokenize(R"({"model":"m","tokens":[1],"skip":true})", m.lookup, {})).param == "skip");
  CHECK(Err(Detokenize("[1]", m.lookup, {})).status == 400);
}

TEST_CASE("/tokenize renders tools as a chat completion does, and refuses bad ones with its 400s") {
  Models m;
  const std::string messages = R"("messages":[{"role":"user","content":"hi"}])";
  // The client's key order, as the template's tools variable gets it.
  const std::string tool = R"({"type":"function","function":{"name":"f","parameters":{"type":"object","b":1,"a":2}}})";
  json t = Ok(Tokenize(R"({"model":"m",)" + messages + R"(,"tools":[)" + tool + R"(],"tool_choice":"required",)"
                       R"("parallel_tool_calls":false})", m.lookup, {}));
  std::vector<TokenId> ids = t["tokens"];
  CHECK(std::string(ids.begin(), ids.end()) == "<|tools|>\n[" + tool + "]\n<|user|>\nhi\n<|assistant|>\n");
  auto param = [&](const std::string& extra) {
    return Err(Tokenize(R"({"model":"m",)" + messages + extra + "}", m.lookup, {})).param;
  };
  CHECK(param(R"(,"tools":[{"type":"function"}])") == "tools[0].function");
  CHECK(param(R"(,"tools":{})") == "tools");
  CHECK(param(R"(,"tools":[)" + tool + R"(],"tool_choice":"sometimes")") == "tool_choice");
  CHECK(param(R"(,"tool_choice":"required")") == "tool_choice");  // nothing to call
  CHECK(param(R"(,"tools":[)" + tool + R"(],"parallel_tool_calls":1)") == "parallel_tool_calls");
}

TEST_CASE("/tokenize of an agent's request counts the prompt_tokens its chat completion is charged") {
  testing::FakeWorker w("ok");
  testing::RouterUnderTest r({w.endpoint()});
  r.WaitRoutable(1);
  const std::string messages =
      R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",)"
      R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
      R"({"role":"tool","tool_call_id":"call_1","content":"20C"}])";
  const std::string fields = messages +
      R"(,"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],)"
      R"("tool_choice":"auto")";
  const json counted = json::parse(http::testing::BodyOf(r.Post("/tokenize", R"({"model":"m",)" + fields + "}")));
  const json chat =
      json::parse(http::testing::BodyOf(r.Post("/v1/chat/completions", R"({"model":"m",)" + fields + "}")));
  REQUIRE(chat.contains("usage"));
  CHECK(counted["count"] == chat["usage"]["prompt_tokens"]);
  CHECK(w.last_params().tokens.size() == counted["count"]);
  // Without the tools, fewer: they are rendered into the count.
  const json bare = json::parse(http::testing::BodyOf(r.Post("/tokenize", R"({"model":"m",)" + messages + "}")));
  CHECK(bare["count"].get<size_t>() + 100 < counted["count"].get<size_t>());
}

TEST_CASE("/version reports the build's version and commit") {
  json v = json::parse(VersionJson());
  CHECK(v["version"] == std::string(GetBuildInfo().version));
  CHECK(v["git_sha"] == std::string(GetBuildInfo().git_sha));
  CHECK_FALSE(GetBuildInfo().version.empty());
  CHECK(GetBuildInfo().version != "unknown");
}

}  // namespace kvfleet::router
