// A parsed completion request made ready for routing: its prompt tokenized with the (base)
// model's codec, max_tokens settled against the model's context, the worker's GenerateParams
// filled, and what the answer echoes (completions' `echo`).
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "router/fleet/fleet.h"
#include "router/http/codec.h"
#include "router/http/openai.h"

namespace kvfleet::router {

// max_tokens of a request without one.
struct CompletionDefaults {
  uint32_t max_tokens = 16;         // /v1/completions (OpenAI's default)
  uint32_t chat_max_tokens = 4096;  // /v1/chat/completions (capped by the context)
};

// The prompt an answer repeats ahead of its text (completions' `echo`).
struct EchoSetup {
  bool on = false;
  std::string text;             // the prompt's text (decoded, for a token-id prompt)
  std::vector<TokenId> prompt;  // with logprobs: its ids, for their entries' texts
  // max_tokens 0 (echo only, to score the prompt): the worker samples one token after the
  // prompt, and the answer drops it.
  bool drop_generated = false;
};

struct PreparedCompletion {
  GenerateParams params;  // model and lora unset: the Dispatcher's (dispatch.h)
  EchoSetup echo;
};

// Fills *out from `req` for the model `served` (its codec: `codec`). Moves the prompt's ids
// and the stop token ids out of `req`. Errors: 500 tokenizer_missing (text for a real model
// on a router without its tokenizer), the chat template's (ChatError), 400 for an empty
// prompt or one the codec refuses, 400 context_length_exceeded.
std::optional<ApiError> PrepareCompletion(CompletionRequest& req, const ServedModel& served, const TextCodec& codec,
                                          const CompletionDefaults& defaults, PreparedCompletion* out);

}  // namespace kvfleet::router
