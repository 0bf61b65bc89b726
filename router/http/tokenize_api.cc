#include "router/http/tokenize_api.h"

#include <array>

#include <nlohmann/json.hpp>

#include "common/build_info.h"
#include "router/http/chat_messages.h"
#include "router/http/chat_tools.h"
#include "router/http/json_body.h"

namespace kvfleet::router {

using nlohmann::json;

namespace {

// The largest id list /detokenize takes: a whole context of a large model.
constexpr size_t kMaxDetokenizeIds = size_t{1} << 20;

constexpr std::array<std::string_view, 4> kPromptFields = {"model", "prompt", "add_special_tokens",
                                                           "return_token_strs"};
// tools as a chat completion renders them; tool_choice and parallel_tool_calls are checked
// as it checks them (they do not change the prompt), so an agent's request counts as sent.
constexpr std::array<std::string_view, 10> kChatFields = {
    "model", "messages", "add_generation_prompt", "continue_final_message", "add_special_tokens",
    "return_token_strs", "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls"};
constexpr std::array<std::string_view, 2> kDetokenizeFields = {"model", "tokens"};

TokenizeAnswer Error(ApiError e) { return TokenizeAnswer{std::move(e), {}}; }

// The body as an object, every field known (or admitted by the rule), and its model.
std::optional<ApiError> AsObject(Result<json> parsed, json* out) {
  if (!parsed.ok()) return BadRequest(parsed.status().message());
  if (!parsed->is_object()) return BadRequest("the body must be a JSON object");
  *out = std::move(parsed).value();
  return std::nullopt;
}
std::optional<ApiError> Parse(std::string_view body, json* out) { return AsObject(ParseJsonBody(body), out); }
// The same, a chat's messages taken out in the client's key order (json sorts them).
std::optional<ApiError> Parse(std::string_view body, json* out, nlohmann::ordered_json* messages, bool* chat) {
  return AsObject(ParseJsonBody(body, OrderedMember{"messages", messages, chat}), out);
}

template <size_t N>
std::optional<ApiError> CheckBody(const json& body, const std::array<std::string_view, N>& known,
                                  const FieldRule& rule) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    bool found = false;
    for (std::string_view k : known) found |= k == it.key();
    if (found) continue;
    if (!rule.allow_unknown) {
      return BadRequest("Unrecognized request argument supplied: " + it.key() +
                            " (the router admits unknown fields with --allow-unknown-fields)",
                        it.key());
    }
    if (rule.on_unknown) rule.on_unknown(it.key());
  }
  auto model = body.find("model");
  if (model == body.end() || !model->is_string() || model->get_ref<const std::string&>().empty()) {
    return BadRequest("'model' is required and must be a non-empty string", "model");
  }
  return std::nullopt;
}

std::optional<ApiError> ReadBool(const json& j, const char* name, bool* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return BadRequest(std::string("'") + name + "' must be a boolean", name);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> FindModel(const json& j, const TokenizerModelLookup& lookup, TokenizerModel* out) {
  const std::string& name = j["model"].get_ref<const std::string&>();
  auto m = lookup(name);
  if (!m || m->codec == nullptr) {
    ApiError e = BadRequest("The model '" + name + "' does not exist.", "model");
    e.status = 404;
    e.code = "model_not_found";
    return e;
  }
  *out = *m;
  return std::nullopt;
}

// tools, tool_choice and parallel_tool_calls as a chat completion reads them (its 400s
// included); the tools go to the template in the client's key order.
std::optional<ApiError> ReadTools(const json& j, std::string_view body, ChatTemplateOptions* options) {
  nlohmann::ordered_json ordered;
  const bool has_tools = j.contains("tools") && !j["tools"].is_null();
  if (has_tools) {
    auto all = ParseOrderedJson(body);
    if (!all.ok() || !all->is_object()) return BadRequest(std::string(kJsonInvalid));
    ordered = std::move(all).value();
  }
  ChatTools tools;
  if (Status s = ParseChatTools(j, has_tools ? &ordered["tools"] : nullptr, &tools); !s.ok()) {
    return ErrorFromStatus(s);
  }
  options->tools = std::move(tools.tools);
  return std::nullopt;
}

}  // namespace

TokenizeAnswer Tokenize(std::string_view body, const TokenizerModelLookup& lookup, const FieldRule& rule) {
  json j;
  nlohmann::ordered_json messages;
  // The chat form is the one with messages (vLLM tells them apart the same way).
  bool chat = false;
  if (auto e = Parse(body, &j, &messages, &chat)) return Error(*e);
  if (auto e = chat ? CheckBody(j, kChatFields, rule) : CheckBody(j, kPromptFields, rule)) return Error(*e);
  bool add_special_tokens = !chat;  // vLLM's defaults: a chat template writes its own BOS
  bool return_token_strs = false;
  if (auto e = ReadBool(j, "add_special_tokens", &add_special_tokens)) return Error(*e);
  if (auto e = ReadBool(j, "return_token_strs", &return_token_strs)) return Error(*e);
  TokenizerModel model;
  if (auto e = FindModel(j, lookup, &model)) return Error(*e);

  Result<std::vector<TokenId>> tokens = std::vector<TokenId>{};
  if (chat) {
    if (Status s = NormalizeChatMessages(&messages); !s.ok()) return Error(ErrorFromStatus(s));
    ChatTemplateOptions options;
    // The completions' reading of the template fields, their checks included.
    if (Status s = ApplyFieldRule(j, true, FieldRule{true, {}}, &options); !s.ok()) return Error(ErrorFromStatus(s));
    if (auto e = ReadTools(j, body, &options)) return Error(*e);
    options.add_special_tokens = add_special_tokens;
    tokens = model.codec->EncodeChat(messages, options);
    if (!tokens.ok()) {
      const bool server = tokens.status().code() == StatusCode::kFailedPrecondition ||
                          tokens.status().code() == StatusCode::kUnimplemented;
      ApiError e = BadRequest(tokens.status().message(), "messages");
      if (server) {
        e.status = 500;
        e.type = "server_error";
        e.code = "chat_template_missing";
      }
      return Error(e);
    }
  } else {
    auto prompt = j.find("prompt");
    if (prompt == j.end() || !prompt->is_string()) return Error(BadRequest("'prompt' must be a string", "prompt"));
    const std::string& text = prompt->get_ref<const std::string&>();
    tokens = add_special_tokens ? model.codec->EncodePrompt(text) : model.codec->EncodeText(text);
    if (!tokens.ok()) return Error(BadRequest(tokens.status().message(), "prompt"));
  }
  json out = {{"count", tokens->size()}, {"max_model_len", model.max_model_len}, {"tokens", *tokens}};
  if (return_token_strs) {
    json strs = json::array();
    for (TokenId id : *tokens) strs.push_back(model.codec->TokenString(id));
    out["token_strs"] = std::move(strs);
  }
  return TokenizeAnswer{std::nullopt, out.dump(-1, ' ', false, json::error_handler_t::replace)};
}

TokenizeAnswer Detokenize(std::string_view body, const TokenizerModelLookup& lookup, const FieldRule& rule) {
  json j;
  if (auto e = Parse(body, &j)) return Error(*e);
  if (auto e = CheckBody(j, kDetokenizeFields, rule)) return Error(*e);
  TokenizerModel model;
  if (auto e = FindModel(j, lookup, &model)) return Error(*e);
  auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array()) {
    return Error(BadRequest("'tokens' is required and must be an array of token ids", "tokens"));
  }
  if (tokens->size() > kMaxDetokenizeIds) {
    return Error(BadRequest("'tokens' may hold at most " + std::to_string(kMaxDetokenizeIds) + " ids", "tokens"));
  }
  std::vector<TokenId> ids;
  ids.reserve(tokens->size());
  const size_t vocab = model.codec->vocab_size();
  for (const json& t : *tokens) {
    if (!t.is_number_unsigned() || t.get<uint64_t>() > 0xffffffffull) {
      return Error(BadRequest("'tokens' must be an array of non-negative integer token ids", "tokens"));
    }
    const uint64_t id = t.get<uint64_t>();
    if (vocab > 0 && id >= vocab) {
      return Error(BadRequest("token id " + std::to_string(id) + " is out of the model's vocabulary (" +
                                  std::to_string(vocab) + " ids)",
                              "tokens"));
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  json out = {{"prompt", model.codec->Decode(ids)}};
  return TokenizeAnswer{std::nullopt, out.dump(-1, ' ', false, json::error_handler_t::replace)};
}

std::string VersionJson() {
  const BuildInfo& b = GetBuildInfo();
  return json{{"version", std::string(b.version)}, {"git_sha", std::string(b.git_sha)}}.dump();
}

}  // namespace kvfleet::router
