// CompletionStream: one completion's answer, assembled from its worker's deltas (the lane's
// ResponseSink, router/fleet/lane.h). Each choice (the worker's sequence of that index) has
// its own detokenizer and stop strings; the answer goes out as SSE chunks (`stream`) or as one
// body at the end, with OpenAI's usage, logprobs and finish reasons, and every failure as an
// OpenAI error (a 4xx/5xx before the first chunk, an error event after it).
//
// Completions' `echo`: every choice starts with the prompt's text, outside the stop strings;
// with logprobs, with the prompt's entries too: the first token's (no logprob: null) and the
// rest's, which the worker sends once, in its first Delta (sequence 0's, which comes before
// the others: they fork from it). A one-token prompt has no rest, so no such Delta part.
//
// It needs no fleet: what it writes goes to an AnswerWriter (the client's HTTP exchange in
// api.cc, a recorder in tests), and what it shares with the API (metrics, clock, worker
// names) comes in a StreamContext.
//
// Thread safety: thread-compatible; every call on the lane's thread (the HTTP I/O thread
// that read the request).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/http/server.h"
#include "common/status.h"
#include "router/fleet/fleet.h"
#include "router/http/api_metrics.h"
#include "router/http/chat_output.h"
#include "router/http/codec.h"
#include "router/http/completion_params.h"
#include "router/http/openai.h"

namespace kvfleet::router {

// Response header naming the worker that served (or failed) a completion: its announced
// name, as in the body's "kvfleet.worker". Absent when no worker was reached.
inline constexpr std::string_view kWorkerHeader = "x-kvfleet-worker";

// Where an answer goes: an http::Exchange's calls, of which a stream makes either one
// Reply, or StartStream, Writes and Finish.
class AnswerWriter {
 public:
  virtual ~AnswerWriter() = default;
  virtual void Reply(http::Response response) = 0;
  virtual void StartStream(int status, std::string_view content_type, http::Headers headers) = 0;
  virtual void Write(std::string_view data) = 0;
  virtual void Finish() = 0;
};

// What the streams of one API share. Must outlive them (they hold it by shared_ptr).
struct StreamContext {
  ApiMetrics* metrics = nullptr;
  const Clock* clock = nullptr;
  std::function<std::string(WorkerId)> worker_name;  // the worker's announced name
  bool report_timings = false;  // RouterTimings in each answer's usage extension
  int retry_after_s = 1;        // Retry-After of a 503 the workers answered
};

// One request's side of its answer.
struct StreamSetup {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  TimeNs arrived = 0;
  TimeNs routed = 0;
  uint32_t prompt_tokens = 0;
  // Retry-After of a 429 that comes back from the workers (every one tried refused it, its
  // queue full): the predicted time to first token where it was routed.
  int retry_after_s = 1;
  // Ends the request on its worker early (a stop string ended every choice). May be empty.
  std::function<void()> cancel;
  EchoSetup echo;
  // Chat: how each choice's text splits into reasoning, content and tool calls (chat_output.h).
  ChatOutputSetup output;
};

class CompletionStream final : public ResponseSink {
 public:
  // REQUIRES: req.sampling.n >= 1.
  CompletionStream(std::shared_ptr<const StreamContext> context, std::shared_ptr<AnswerWriter> out,
                   CompletionRequest req, std::shared_ptr<const TextCodec> codec, StreamSetup setup);

  // The request was handed to its worker's socket.
  void MarkSent(TimeNs now);

  // --- ResponseSink ---
  void OnDelta(WorkerId worker, const WorkerDelta& d) override;
  void OnError(WorkerId worker, const Status& status, bool after_first_token) override;
  // The lane sends the request again, to `to`, right after this.
  void OnRetry(WorkerId from, WorkerId to) override;

 private:
  struct Choice {
    Choice(std::unique_ptr<StreamDecoder> d, StopMatcher s) : decoder(std::move(d)), stops(std::move(s)) {}
    std::unique_ptr<StreamDecoder> decoder;
    StopMatcher stops;
    std::string text;         // not streamed: the answer so far
    std::string finish;       // empty: still generating
    bool first_chunk = true;
    bool echoed = false;      // echo: the prompt went out ahead of this choice's text
    ChoiceLogprobs logprobs;  // not streamed: the whole choice's
    std::unique_ptr<ChatOutputStream> output;  // streamed with a tool or reasoning parser
    size_t text_offset = 0;   // the choice's text so far, in token texts (completions' text_offset)
  };

  std::string TokenText(TokenId t) const;  // a token's text alone, for logprobs
  void TakePromptLogprobs(const WorkerDelta& d);
  void EmitDelta(WorkerId worker, const WorkerDelta& d, Choice& c, const std::string& echo, ChoiceLogprobs* lp,
                 TimeNs now);
  // Times the delta: the first token's, or choice 0's gap since its last.
  void ObserveTimes(const WorkerDelta& d, TimeNs now);
  // Streams the choice's new text `out` and its logprobs *lp, or keeps them for the whole answer.
  void Send(WorkerId worker, Choice& c, const std::string& out, ChoiceLogprobs* lp, uint32_t index);
  void End(WorkerId worker);

  std::shared_ptr<const StreamContext> ctx_;
  std::shared_ptr<AnswerWriter> out_;
  CompletionRequest req_;
  std::shared_ptr<const TextCodec> codec_;  // the base model's
  StreamSetup setup_;
  int64_t created_;
  TimeNs last_;
  std::vector<Choice> choices_;
  size_t finished_choices_ = 0;
  bool first_ = false;    // the first token came
  bool started_ = false;  // the SSE stream started
  bool done_ = false;
  uint32_t completion_tokens_ = 0;
  RouterTimings timings_;
  TimeNs last_sent_ = 0;  // the latest send, a retry's included (queue time)
  UsageCounts usage_;
  std::vector<LogprobEntry> prompt_logprobs_;  // echo with logprobs: the prompt's entries
  bool prompt_logprobs_taken_ = false;         // the worker's part of them came
};

}  // namespace kvfleet::router
