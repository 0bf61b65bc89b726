// vLLM's tokenizer endpoints and /version, as the router serves them with each model's codec:
//   POST /tokenize    {"model","prompt", add_special_tokens=true, return_token_strs=false}
//                  or {"model","messages", add_generation_prompt=true, continue_final_message=false,
//                      add_special_tokens=false, return_token_strs=false, chat_template_kwargs,
//                      tools, tool_choice, parallel_tool_calls}  (rendered as a chat completion's)
//                  -> {"count","max_model_len","tokens"[,"token_strs"]}
//   POST /detokenize  {"model","tokens"} -> {"prompt"}
//   GET  /version     {"version","git_sha"}
// Unknown fields follow the completions' rule (request_fields.h): 400 naming the field
// unless --allow-unknown-fields.
//
// Thread safety: pure functions over values; the lookup must be thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "router/http/codec.h"
#include "router/http/openai.h"

namespace kvfleet::router {

// A model these endpoints may serve: its codec and context length.
struct TokenizerModel {
  const TextCodec* codec = nullptr;
  uint32_t max_model_len = 0;
};
// The model of that name, or none (404 model_not_found).
using TokenizerModelLookup = std::function<std::optional<TokenizerModel>(const std::string& model)>;

// A response body, or the error to answer instead.
struct TokenizeAnswer {
  std::optional<ApiError> error;
  std::string body;
};

TokenizeAnswer Tokenize(std::string_view body, const TokenizerModelLookup& lookup, const FieldRule& rule);
TokenizeAnswer Detokenize(std::string_view body, const TokenizerModelLookup& lookup, const FieldRule& rule);
std::string VersionJson();

}  // namespace kvfleet::router
