// The router's HTTP API: OpenAI /v1/completions, /v1/chat/completions and /v1/models, and
// the operator's /health, /ready, /metrics and /fleet, on the common HTTP server.
//
// A completion request is parsed (openai.h), tokenized and given its GenerateParams
// (completion_params.h), admitted, routed and sent (router/routing/dispatch.h), and answered
// by its CompletionStream (completion_stream.h) as SSE or whole. A client that disconnects
// cancels its request on the worker. /fleet, /v1/models and /ready: operator_api.h.
//
// Thread safety: thread-safe; handlers run on the HTTP I/O threads. Each I/O thread has
// its own forwarding lane (router/fleet/lane.h, kept as the thread's attachment), so a
// request's answer streams on the thread that read it. REQUIRES: the Fleet outlives the
// HTTP server the routes run on (its lanes are destroyed when the server stops).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/http/server.h"
#include "common/status.h"
#include "router/fleet/fleet.h"
#include "router/http/codec.h"
#include "router/http/completion_stream.h"  // kWorkerHeader
#include "router/http/lora_api.h"
#include "router/http/openai.h"
#include "router/routing/router.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::router {

struct ApiOptions {
  std::vector<std::string> api_keys;        // empty: no authentication
  // /metrics needs one of api_keys as well (it names models, adapters and workers, and shows
  // traffic). /health, /ready and /version stay open for probes.
  bool metrics_need_key = false;
  // Each API key's requests get their own cache namespace: the key's digest goes before the
  // request's own cache_salt, so one tenant's prompts never hit blocks another computed, and
  // cached_tokens cannot tell a tenant whether another sent a prompt. Needs api_keys.
  bool cache_salt_per_key = false;
  RequestLimits limits;
  uint32_t default_max_tokens = 16;         // /v1/completions without max_tokens (OpenAI's default)
  uint32_t default_chat_max_tokens = 4096;  // /v1/chat/completions without one (capped by the context)
  int retry_after_s = 1;                    // Retry-After on 429 and 503
  // For this long after the router starts, a model no worker has announced is 503 with
  // Retry-After, not 404: a restarted router re-learns the fleet from the workers' Hellos
  // (every 2 s) and event streams, and a model may simply not have come back yet.
  DurationNs unknown_model_grace = 10 * kNsPerSec;
  bool report_timings = false;              // RouterTimings in each response's usage extension
  // How long a LoRA load or unload waits for each worker's answer (lora_api.h).
  DurationNs lora_control_timeout = config::kLoraControlTimeout;
  // --routing-window-size's override of the indexed KV pool, for /fleet; none: IndexedWindow.
  std::optional<uint32_t> routing_window_size;
  // --tool-call-parser / --reasoning-parser: how every model's chat answers are parsed; none
  // given: what each model's chat template writes (tool_parsers.h, reasoning_parser.h).
  std::optional<ToolParserKind> tool_parser;
  std::optional<ReasoningParserKind> reasoning_parser;
};

// Reads API keys from a file: one per line; blank lines and lines starting with '#' skipped.
Result<std::vector<std::string>> LoadApiKeys(const std::string& path);

class ApiImpl;

class Api {
 public:
  // Every pointer must outlive the Api. The router's default policy is the one a request
  // without a "routing" field gets.
  Api(const ApiOptions& options, Fleet* fleet, Router* router, std::shared_ptr<const TextCodec> codec,
      const Clock* clock, std::shared_ptr<prometheus::Registry> registry);
  // Each model with its own codec (router/http/codec.h).
  Api(const ApiOptions& options, Fleet* fleet, Router* router, ModelCodecs codecs, const Clock* clock,
      std::shared_ptr<prometheus::Registry> registry);
  ~Api();

  // Adds every route to `routes` (and its OpenAI-style error formatter).
  void AddRoutes(http::Routes* routes);
  // Removes the per-worker series of `worker` (a name): the fleet forgot it. Any thread.
  void ForgetWorker(const std::string& worker);

 private:
  std::shared_ptr<ApiImpl> impl_;
};

}  // namespace kvfleet::router
