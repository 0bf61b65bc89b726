// Fuzzes what the router does with untrusted bytes before any routing: HTTP/1.1 request
// parsing with the server's header and body limits, then OpenAI request-body parsing and
// the response formatting that echoes request fields. Nothing may crash, hang or leak.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/http/server.h"
#include "router/http/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  kvfleet::http::ServerOptions limits;
  limits.max_header_bytes = 8 * 1024;
  limits.max_body_bytes = 256 * 1024;
  auto request = kvfleet::http::ParseRequest(bytes, limits);
  // Bodies without HTTP framing too, so the JSON layer gets deep coverage.
  std::string_view body = request.ok() ? std::string_view(request->body) : bytes;
  for (bool chat : {false, true}) {
    auto parsed = kvfleet::router::ParseCompletionRequest(body, chat);
    if (parsed.ok()) {
      (void)kvfleet::router::FormatChunk(*parsed, "id", 0, "text", "stop", true);
      kvfleet::router::StopMatcher stops(parsed->stop);
      bool stopped = false;
      (void)stops.Push(body.substr(0, 64), &stopped);
    } else {
      (void)kvfleet::router::ErrorFromStatus(parsed.status()).ToJson();
    }
  }
  return 0;
}
