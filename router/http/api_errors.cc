#include "router/http/api_errors.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

namespace kvfleet::router {

http::Response JsonResponse(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

http::Response ErrorResponse(const ApiError& e) {
  http::Response r = JsonResponse(e.status, e.ToJson());
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  return r;
}

ApiError MakeError(int status, std::string message, std::string type, std::string code, int retry_after_s) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  e.retry_after_s = retry_after_s;
  return e;
}

int RetryAfterSeconds(double seconds) {
  return static_cast<int>(std::min(std::ceil(std::max(seconds, 1.0)), 3600.0));
}

ApiError ChatError(const std::string& model, const Status& s) {
  constexpr std::string_view kFix =
      ": start the router with --chat-template FILE, or put chat_template.jinja in the model directory";
  switch (s.code()) {
    case StatusCode::kFailedPrecondition:
      return MakeError(500, "model '" + model + "' cannot serve chats: " + s.message() + std::string(kFix),
                       "server_error", "chat_template_missing");
    case StatusCode::kUnimplemented:
      return MakeError(500, "model '" + model + "' cannot serve chats: " + s.message() + std::string(kFix),
                       "server_error", "chat_template_invalid");
    default: return BadRequest(s.message(), "messages");
  }
}

ApiError ResolveError(const Status& s, int retry_after_s) {
  if (s.code() == StatusCode::kNotFound) {
    return MakeError(404, s.message(), "invalid_request_error", "model_not_found");
  }
  return MakeError(503, s.message(), "server_error", "service_unavailable", retry_after_s);
}

ApiError RouteError(const Status& s, const Refusal& refusal) {
  // A request no worker of its model can serve as asked (constrained decoding).
  if (s.code() == StatusCode::kInvalidArgument) return MakeError(400, s.message(), "invalid_request_error");
  if (s.code() == StatusCode::kResourceExhausted) {
    return MakeError(429, s.message(), "rate_limit_error", "overloaded", RetryAfterSeconds(refusal.retry_after_s));
  }
  return MakeError(503, s.message(), "server_error", "service_unavailable");
}

ApiError WorkerError(const Status& s, int overloaded_retry_after_s, int unavailable_retry_after_s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return MakeError(400, s.message(), "invalid_request_error");
    case StatusCode::kOutOfRange:
      return MakeError(400, s.message(), "invalid_request_error", "context_length_exceeded");
    case StatusCode::kNotFound: return MakeError(404, s.message(), "invalid_request_error", "model_not_found");
    case StatusCode::kResourceExhausted:
      return MakeError(429, s.message(), "rate_limit_error", "overloaded", overloaded_retry_after_s);
    case StatusCode::kUnavailable:
      return MakeError(503, s.message(), "server_error", "service_unavailable", unavailable_retry_after_s);
    case StatusCode::kDeadlineExceeded: return MakeError(504, s.message(), "server_error", "timeout");
    default: return MakeError(500, s.message(), "server_error");
  }
}

}  // namespace kvfleet::router
