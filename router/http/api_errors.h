// The router API's failures as HTTP answers: OpenAI's error object (ApiError, openai.h) in a
// response, and the ApiError of each failure on the request path: a chat the codec cannot
// render, a name the Dispatcher cannot resolve, a routing refusal, a worker's failure.
//
// Thread safety: pure functions over values.
#pragma once

#include <string>

#include "common/http/server.h"
#include "common/status.h"
#include "router/http/openai.h"
#include "router/routing/router.h"

namespace kvfleet::router {

http::Response JsonResponse(int status, std::string body);
// The error's JSON, with Retry-After when e.retry_after_s > 0.
http::Response ErrorResponse(const ApiError& e);
ApiError MakeError(int status, std::string message, std::string type, std::string code = "", int retry_after_s = 0);

// Retry-After is whole seconds (RFC 9110): a predicted wait rounded up, at least 1, at most an hour.
int RetryAfterSeconds(double seconds);

// A chat the codec could not render (TextCodec::EncodeChat). A missing or broken template is
// the operator's to fix, so it is a 500 naming the fix; a template's raise_exception on these
// messages is a 400.
ApiError ChatError(const std::string& model, const Status& s);

// Dispatcher::Resolve's error: NotFound 404 model_not_found, else 503 with Retry-After
// `retry_after_s`.
ApiError ResolveError(const Status& s, int retry_after_s);

// Router::Route's refusal (routing/README.md, "Admission"): 429 when a retry may be admitted
// later (ResourceExhausted), with Retry-After from the predicted wait; else 503, as no worker
// could serve it in time even idle.
ApiError RouteError(const Status& s, const Refusal& refusal);

// A request the workers failed (router/fleet/lane.h): 429 with `overloaded_retry_after_s`
// when every worker tried refused it for a full queue, 503 with `unavailable_retry_after_s`
// when none could take it, 504 on a timeout, 400/404 for what the worker found wrong.
ApiError WorkerError(const Status& s, int overloaded_retry_after_s, int unavailable_retry_after_s);

}  // namespace kvfleet::router
