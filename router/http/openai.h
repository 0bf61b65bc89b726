// The OpenAI API's request and response shapes for /v1/completions and
// /v1/chat/completions: parsing a request body into a CompletionRequest (every check that
// earns a 400), and formatting responses, stream chunks and error objects.
//
// Sampling fields besides OpenAI's: `top_k`, `min_p` and `repetition_penalty` (HF/vLLM, over
// prompt + generated tokens), as vLLM takes them, beside OpenAI's `logit_bias` (token id
// string -> bias), `presence_penalty` and `frequency_penalty`; their bounds are
// schema/sampling.h's, which the workers check too. Logprobs: completions `logprobs` 0..20
// (+ `echo`: the prompt's text and, with logprobs, its tokens' logprobs, the first null;
// `max_tokens` 0 with echo scores the prompt alone, as lm-evaluation-harness asks), chat
// `logprobs` + `top_logprobs` 0..20, in OpenAI's shapes.
//
// Extensions (in the request body): `kv_retention` (TensorRT-LLM KvCacheRetentionConfig:
// {"token_ranges":[{"start","end","priority","duration_ms"}], "decode_priority",
// "decode_duration_ms"}), `cache_salt`, `ignore_eos`, `top_k`, `stop_token_ids` (vLLM's: ids that
// end the answer with finish_reason "stop", besides the model's eos ids), and `routing` (a
// policy name overriding the router's for this request). Every field passes the table in
// request_fields.h first: unknown and unsupported fields are a 400 naming them.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "schema/requests.h"
#include "router/http/chat_output.h"
#include "router/http/chat_tools.h"
#include "router/http/request_fields.h"
#include "router/routing/policy.h"

namespace kvfleet::router {

// An error as OpenAI words it: {"error":{"message","type","param","code"}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  int retry_after_s = 0;  // > 0: a Retry-After header

  std::string ToJson() const;
};

ApiError BadRequest(std::string message, std::string param = "");

struct CompletionRequest {
  bool chat = false;
  std::string model;
  std::optional<std::string> prompt_text;  // completions, a string prompt
  std::vector<TokenId> prompt_tokens;      // completions, a token-id prompt
  nlohmann::ordered_json messages;         // chat: the validated messages array, keys in the client's order
  // What the worker is asked for (schema/sampling.h), checked by ValidateSampling; its
  // max_tokens is the Api's to set, from `max_tokens` below or the Api's default. logprobs:
  // completions' logprobs or chat's top_logprobs (0 for a bare "logprobs": true);
  // prompt_logprobs: echo with logprobs.
  SamplingParams sampling;
  std::optional<uint32_t> max_tokens;  // max_tokens / max_completion_tokens; 0 only with echo
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  std::string user;
  Retention retention;
  std::string cache_salt;
  std::optional<Policy> routing;
  ChatTemplateOptions chat_template;  // chat: add_generation_prompt, continue_final_message, chat_template_kwargs, tools
  ChatTools tools;                    // chat: tools, tool_choice, parallel_tool_calls (chat_tools.h)
  // The field that set sampling.structured (response_format, guided_json, tool_choice, ...);
  // empty: unconstrained. Routing's 400 names it when no worker of the model can enforce it.
  std::string structured_field;
};

// The router's limits on a request besides the body size and the sampling bounds every
// worker holds too (schema/sampling.h, sampling::config).
struct RequestLimits {
  size_t max_stop_strings = 4;       // OpenAI's limit
  size_t max_stop_bytes = 256;
  uint32_t max_tokens_cap = 1 << 20;
  FieldRule fields;  // which top-level fields pass (request_fields.h)
  // Choices per request: each is a sequence decoding in the worker's batch beside the rest
  // (the prompt prefilled once), so n multiplies a request's decode work and KV blocks.
  uint32_t max_n = 16;
};

// Parses and validates a request body. `chat` selects the chat schema.
Result<CompletionRequest> ParseCompletionRequest(std::string_view body, bool chat, const RequestLimits& limits = {});
// The ApiError for a failed parse (its message; status 400).
ApiError ErrorFromStatus(const Status& status);

// The router's own timestamps of one request, for latency breakdowns (router_loadgen).
// Clock::Now() values: CLOCK_MONOTONIC ns, comparable only with clocks read on the same host.
struct RouterTimings {
  TimeNs read = 0;         // the request was read and handed to the API
  TimeNs routed = 0;       // parsed, tokenized, hashed and routed
  TimeNs sent = 0;         // handed to the chosen worker's socket
  TimeNs first_delta = 0;  // the worker's first token was read
  TimeNs first_chunk = 0;  // its text was queued for the client
};

struct UsageCounts {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_tokens = 0;
  // Extension, for operators and benchmarks: a top-level "kvfleet" object beside usage
  // {"worker": name, "worker_ttft_ms": the worker's own time to first token}. OpenAI
  // clients ignore fields they do not know. Empty worker: left out.
  std::string worker;
  double worker_ttft_ms = 0;
  // With ApiOptions::report_timings: also {"router_timings_ns": {...}} in that object.
  std::optional<RouterTimings> timings;
};

std::string_view FinishReasonText(FinishReason reason);  // "stop", "length", ...

// One token of a choice's logprobs, as text: the token's own text (decoded alone) and its
// top entries'. No logprob: the prompt's first token (null in the completions shape).
struct LogprobEntry {
  std::string token;
  std::optional<float> logprob;
  std::vector<std::pair<std::string, float>> top;
};
// A choice's (or a chunk's) logprobs; text_offset: where entries[0]'s text starts in the
// choice's whole text (completions' text_offset counts from there, token text by token text).
struct ChoiceLogprobs {
  std::vector<LogprobEntry> entries;
  size_t text_offset = 0;
};
// Entries for the worker's logprobs, each token's text from `text`.
template <typename TextOf>
void AppendLogprobEntries(const std::vector<TokenLogprob>& lps, const TextOf& text, std::vector<LogprobEntry>* out) {
  for (const TokenLogprob& lp : lps) {
    LogprobEntry e{text(lp.token), lp.logprob, {}};
    for (const auto& [token, logprob] : lp.top) e.top.emplace_back(text(token), logprob);
    out->push_back(std::move(e));
  }
}

// One choice of a whole response. `logprobs`: the choice's, or null.
struct ChoiceText {
  std::string text;
  std::string finish_reason;
  const ChoiceLogprobs* logprobs = nullptr;
  // Chat with a tool or reasoning parser: the message's content, reasoning_content and
  // tool_calls come from here (content null when empty beside calls or reasoning), not `text`.
  const ChatOutput* output = nullptr;
};

// Whole responses: choices[i] gets index i.
std::string FormatCompletion(const CompletionRequest& req, std::string_view id, int64_t created,
                             const std::vector<ChoiceText>& choices, const UsageCounts& usage);
std::string FormatCompletion(const CompletionRequest& req, std::string_view id, int64_t created,
                             std::string_view text, std::string_view finish_reason, const UsageCounts& usage,
                             const ChoiceLogprobs* logprobs = nullptr);
// One SSE event ("data: {...}\n\n") carrying a text delta of choice `index`;
// `finish_reason` empty: null. For chat, `first` (the choice's first chunk) adds the
// assistant role. `logprobs`: the chunk's tokens', or null.
// `parsed` (chat with a tool or reasoning parser): the delta's content, reasoning_content and
// tool_calls (OpenAI's shape: a call's first entry has its id, type and name) instead of `text`.
std::string FormatChunk(const CompletionRequest& req, std::string_view id, int64_t created, std::string_view text,
                        std::string_view finish_reason, bool first, uint32_t index = 0,
                        const ChoiceLogprobs* logprobs = nullptr, const ChatOutputDelta* parsed = nullptr);
// A message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}].
nlohmann::json ToolCallsJson(const std::vector<ParsedToolCall>& calls);
// The usage-only chunk sent before [DONE] when stream_options.include_usage is set.
std::string FormatUsageChunk(const CompletionRequest& req, std::string_view id, int64_t created,
                             const UsageCounts& usage);
// An error event inside a stream.
std::string FormatStreamError(const ApiError& error);
inline constexpr std::string_view kDoneEvent = "data: [DONE]\n\n";

// Stop strings matched across token boundaries: text goes in piece by piece; what may
// still turn out to begin a stop string is held back.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Adds text; returns what can be emitted now. Sets *stopped when a stop string
  // appeared (the text before it is returned; nothing after it ever is).
  std::string Push(std::string_view text, bool* stopped);
  // The held-back tail, once generation ended without a stop string.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace kvfleet::router
