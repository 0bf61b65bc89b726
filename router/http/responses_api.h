// OpenAI's Responses API (POST /v1/responses), stateless: a Responses request becomes a
// chat completion (its input items the chat's messages, its flat function tools the chat's
// tools, text.format its response_format), served as any chat is, and the chat answer is
// written back in the Responses shape: output items (reasoning, message with output_text,
// function_call), usage, and, streamed, OpenAI's event sequence (response.created,
// response.in_progress, response.output_item.added, response.content_part.added,
// response.output_text.delta, ... .done, response.completed).
//
// Stateless: kvfleet keeps no response. `store` absent or false is served (the response says
// "store": false); `store: true` and `previous_response_id` are 400s saying so: a client
// sends the whole conversation as input items each turn (function_call and
// function_call_output items included), which is what the Agents SDK does with store off.
// A reasoning input item is accepted and not rendered (templates drop earlier turns'
// reasoning). Unsupported fields are 400s naming them.
//
// Thread safety: ParseResponsesRequest is a pure function; a ResponsesWriter belongs to one
// request (its answer's thread).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "router/http/completion_stream.h"
#include "router/http/openai.h"

namespace kvfleet::router {

struct ResponsesRequest {
  CompletionRequest chat;  // the chat completion that serves it (stream_options.include_usage set)
  bool stream = false;
  // The request's fields a response object repeats (instructions, tools, text, ...).
  nlohmann::ordered_json echo;
};

Result<ResponsesRequest> ParseResponsesRequest(std::string_view body, const RequestLimits& limits);

// Writes a chat completion's answer (what CompletionStream writes) as a Responses answer to
// `out`. `id`: "resp_...".
std::shared_ptr<AnswerWriter> NewResponsesWriter(std::shared_ptr<AnswerWriter> out, std::string id, int64_t created,
                                                 ResponsesRequest request);

// The Responses object for a whole chat.completion body (tests; the writer's Reply).
nlohmann::ordered_json ResponseFromChat(const nlohmann::json& chat, std::string_view id, int64_t created,
                                        const nlohmann::ordered_json& echo, std::string_view model);

}  // namespace kvfleet::router
