// The open-loop replayer: sends a scaled trace to a router's OpenAI API (or spreads it over
// several routers) at the trace's arrival times and records what each streamed response looked like.
//
// Every request is POST /v1/completions with the prompt as token ids, stream=true and
// stream_options.include_usage=true, max_tokens = the scaled output length and
// ignore_eos=true, so each request generates exactly what the trace says. Arrivals do not
// wait for earlier responses (open loop); only the concurrency limit holds a request back,
// in a FIFO, and the time it waited is recorded apart from its latencies.
//
// One Boost.Asio io_context runs every request as a C++20 coroutine on one thread: no
// thread per request, and no locks, since all state lives on that thread.
//
// Thread safety: Replay() is a blocking call; concurrent calls are independent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/bench/prompt_builder.h"
#include "cli/bench/trace.h"
#include "common/status.h"

namespace kvfleet::bench {

namespace config {
// The response header in which the router names the worker that served a request.
// ASSUMED: branch `router` sends no such header yet (2026-11-21); the bench also counts
// requests per worker from the router's metrics (fleet_process.h).
inline constexpr const char* kWorkerHeader = "x-kvfleet-worker";
// The request-body extension that overrides the router's routing policy per request.
// Read from branch `router`'s work in progress (router/http/openai.cc: "routing", a
// policy name); change it here if the router settles on another name.
inline constexpr const char* kPolicyField = "routing";
// Default cap on requests in flight: high enough not to shape a Mooncake replay at 10x
// on 8 mock workers, low enough to stay under the default 1024 open files.
inline constexpr uint32_t kDefaultConcurrencyLimit = 512;
// Per-request deadline (connect to the end of the stream); a hang shows up as an error.
inline constexpr double kDefaultRequestTimeoutS = 300;
}  // namespace config

// kv_retention attached to every request (the router's extension; TensorRT-LLM's
// KvCacheRetentionConfig): the prompt's first `prefix_tokens` tokens, cut to the prompt, at
// `priority` for `duration_ms` (0: for good). 0 prefix tokens: no kv_retention.
struct RetentionOptions {
  uint32_t prefix_tokens = 0;
  uint32_t priority = 100;   // 0..100
  uint64_t duration_ms = 0;

  Status Validate() const;
};

struct ReplayOptions {
  // http://host[:port], or several separated by ',': request i goes to router i mod n, so
  // clients spread evenly over routers that act as one (router/README.md, "Several
  // routers"); one that refuses the connection passes the request to the next.
  std::string router_url = "http://127.0.0.1:8000";
  std::string model;            // "model" of every request; empty: the router's only model
  std::string policy;           // per-request policy override; empty: the router's own
  std::string cache_salt;       // cache_salt extension; empty: none
  RetentionOptions retention;   // kv_retention extension; none by default
  uint32_t concurrency_limit = config::kDefaultConcurrencyLimit;  // requests in flight, >= 1
  double request_timeout_s = config::kDefaultRequestTimeoutS;     // seconds, > 0
  bool progress = true;         // a status line on stderr every few seconds

  Status Validate() const;
  // router_url split at ','.
  std::vector<std::string> RouterUrls() const;
};

// What happened to one request. Times are seconds.
struct RequestOutcome {
  bool ok = false;
  std::string error;           // empty when ok; else a short kind: "http_503", "timeout", ...
  std::string error_detail;    // the server's message or the socket error, for the log
  int http_status = 0;
  std::string router;          // the router URL it was sent to
  uint32_t connect_retries = 0;  // routers that refused its connection before `router` took it
  std::string worker;          // from the worker header, else the usage chunk's kvfleet.worker; empty when neither
  std::string request_id;      // its X-Request-Id: "bench-<run>-<index>", <run> the run's start in µs (hex)
  double sent_unix_s = 0;      // wall-clock send time (Unix seconds), to line up with other logs
  double arrival_s = 0;        // scheduled send time, from the start of the run
  double queue_s = 0;          // waited for the concurrency limit
  double ttft_s = -1;          // send to first token; -1: no token
  double e2e_s = -1;           // send to the end of the stream
  std::vector<double> token_gaps_s;  // between successive streamed chunks with tokens
  uint32_t prompt_tokens = 0;        // from usage
  uint32_t completion_tokens = 0;    // from usage
  uint32_t cached_tokens = 0;        // usage.prompt_tokens_details.cached_tokens
  bool has_usage = false;
};

struct ReplayRun {
  std::vector<RequestOutcome> outcomes;  // one per scaled request, in trace order
  double wall_s = 0;                     // first send to last response
};

// Runs the replay to the end. Fails only when it cannot start (bad URL, unresolvable
// host); per-request failures are outcomes.
Result<ReplayRun> Replay(const std::vector<ScaledRequest>& requests, const PromptBuilder& prompts,
                         const ReplayOptions& options);

// The JSON body Replay() sends for `request` (exposed for tests).
std::string CompletionBody(const ScaledRequest& request, const PromptBuilder& prompts, const ReplayOptions& options);

// Incremental parser of a Server-Sent Events stream of OpenAI completion chunks.
class SseChunkParser {
 public:
  struct Event {
    enum Kind { kTokens, kUsage, kDone, kError, kOther } kind = kOther;
    uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;  // kUsage
    std::string message;  // kError
    std::string worker;   // kUsage: the router's chunk's kvfleet.worker extension, when present
  };
  // Feeds bytes; appends each complete event to `out` (a chunk that carries both tokens
  // and usage gives two events).
  void Feed(std::string_view bytes, std::vector<Event>* out);

 private:
  void ParseEvent(std::string_view block, std::vector<Event>* out);
  std::string pending_;
};

}  // namespace kvfleet::bench
