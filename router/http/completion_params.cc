#include "router/http/completion_params.h"

#include <algorithm>
#include <utility>

#include "router/http/api_errors.h"

namespace kvfleet::router {

namespace {

// The prompt's ids: the chat rendered, the text encoded, or the ids as sent.
std::optional<ApiError> Tokenize(CompletionRequest& req, const TextCodec& codec, std::vector<TokenId>* out) {
  if (req.chat) {
    auto t = codec.EncodeChat(req.messages, req.chat_template);
    if (!t.ok()) return ChatError(req.model, t.status());
    *out = std::move(t).value();
  } else if (req.prompt_text) {
    auto t = codec.EncodePrompt(*req.prompt_text);
    if (!t.ok()) return BadRequest(t.status().message(), "prompt");
    *out = std::move(t).value();
  } else {
    *out = std::move(req.prompt_tokens);
  }
  if (out->empty()) return BadRequest("the prompt is empty", "prompt");
  return std::nullopt;
}

ApiError ContextExceeded(uint32_t context, uint32_t prompt_tokens, uint32_t max_tokens) {
  return MakeError(400,
                   "This model's maximum context length is " + std::to_string(context) +
                       " tokens. However, you requested " + std::to_string(uint64_t{prompt_tokens} + max_tokens) +
                       " tokens (" + std::to_string(prompt_tokens) + " in the prompt, " + std::to_string(max_tokens) +
                       " for the completion).",
                   "invalid_request_error", "context_length_exceeded");
}

// The request's sampling value as the worker takes it, with the max_tokens the Api settled on
// (a copy: the response stream reads the request's logprobs and n).
SamplingParams SamplingOf(const CompletionRequest& req, uint32_t max_tokens) {
  SamplingParams s = req.sampling;
  s.max_tokens = max_tokens;
  return s;
}

}  // namespace

std::optional<ApiError> PrepareCompletion(CompletionRequest& req, const ServedModel& served, const TextCodec& codec,
                                          const CompletionDefaults& defaults, PreparedCompletion* out) {
  // Byte ids sent to a real model are garbage in, garbage out: refuse instead.
  if (codec.is_byte_codec() && served.fleet.needs_tokenizer && (req.chat || req.prompt_text)) {
    return MakeError(500,
                     "model '" + served.model +
                         "' runs on cpu/cuda workers, but this router has no tokenizer and cannot turn text "
                         "into its token ids: start the router with --tokenizer MODEL_DIR (or --tokenizer " +
                         served.model + "=MODEL_DIR; or send the prompt as token ids)",
                     "server_error", "tokenizer_missing");
  }
  GenerateParams& params = out->params;
  if (auto e = Tokenize(req, codec, &params.tokens)) return e;
  const auto prompt_tokens = static_cast<uint32_t>(params.tokens.size());
  const uint32_t context = served.fleet.max_context;
  uint32_t max_tokens = req.max_tokens.value_or(req.chat ? defaults.chat_max_tokens : defaults.max_tokens);
  if (context > 0 && !req.max_tokens && req.chat && prompt_tokens < context) {
    max_tokens = std::min(max_tokens, context - prompt_tokens);
  }
  if (context > 0 && uint64_t{prompt_tokens} + max_tokens > context) {
    // Over the flags' guess only: the workers' own context lengths are a moment away (a router
    // that has just listed them), so the client is told to retry, not that its request is bad.
    if (served.fleet.max_context_guessed) {
      return MakeError(503,
                       "model '" + served.model + "': no worker has yet said its context length, and " +
                           std::to_string(uint64_t{prompt_tokens} + max_tokens) +
                           " tokens are over the router's guess (--max-context " + std::to_string(context) +
                           "); retry in a moment",
                       "server_error", "service_unavailable", 1);
    }
    return ContextExceeded(context, prompt_tokens, max_tokens);
  }
  params.sampling = SamplingOf(req, max_tokens);
  params.retention = req.retention;
  params.cache_salt = req.cache_salt;

  EchoSetup& echo = out->echo;
  echo.on = req.echo;
  if (!echo.on) return std::nullopt;
  echo.drop_generated = max_tokens == 0;
  if (echo.drop_generated) params.sampling.max_tokens = 1;
  if (req.prompt_text) {
    echo.text = *req.prompt_text;
  } else {
    // As the answer's own text decodes (TextCodec::Decode may spell special tokens otherwise).
    auto decoder = codec.NewDecoder();
    for (TokenId t : params.tokens) echo.text += decoder->Push(t);
    echo.text += decoder->Finish();
  }
  if (req.sampling.logprobs >= 0) echo.prompt = params.tokens;
  return std::nullopt;
}

}  // namespace kvfleet::router
