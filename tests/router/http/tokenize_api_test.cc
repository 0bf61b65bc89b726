// /tokenize, /detokenize and /version (router/http/tokenize_api.h) over the byte codec, whose
// ids are the text's bytes, so every expected id list is the text itself.
#include "router/http/tokenize_api.h"

#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "common/build_info.h"

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
  CHECK(Err(Tokenize(R"({"model":"m","messages":[],"tools":[{"type":"function"}]})", m.lookup, {})).param ==
        "tools");
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

TEST_CASE("/version reports the build's version and commit") {
  json v = json::parse(VersionJson());
  CHECK(v["version"] == std::string(GetBuildInfo().version));
  CHECK(v["git_sha"] == std::string(GetBuildInfo().git_sha));
  CHECK_FALSE(GetBuildInfo().version.empty());
  CHECK(GetBuildInfo().version != "unknown");
}

}  // namespace kvfleet::router
