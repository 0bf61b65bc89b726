#include "router/http/completion_stream.h"

#include <utility>

#include "router/http/api_errors.h"

namespace kvfleet::router {

namespace {

double Seconds(DurationNs d) { return static_cast<double>(d) / kNsPerSec; }

}  // namespace

CompletionStream::CompletionStream(std::shared_ptr<const StreamContext> context, std::shared_ptr<AnswerWriter> out,
                                   CompletionRequest req, std::shared_ptr<const TextCodec> codec, StreamSetup setup)
    : ctx_(std::move(context)),
      out_(std::move(out)),
      req_(std::move(req)),
      codec_(std::move(codec)),
      setup_(std::move(setup)),
      created_(ctx_->clock->WallNs() / kNsPerSec),
      last_(setup_.arrived) {
  timings_.read = setup_.arrived;
  timings_.routed = setup_.routed;
  const std::vector<std::string_view> shown = ToolParserSpecialTokens(setup_.output.tools);
  for (uint32_t i = 0; i < req_.sampling.n; ++i) {
    choices_.emplace_back(shown.empty() ? codec_->NewDecoder() : codec_->NewDecoderShowing(shown),
                          StopMatcher(req_.stop));
    if (req_.chat && req_.stream && setup_.output.active()) {
      choices_.back().output = std::make_unique<ChatOutputStream>(setup_.output);
    }
  }
  // The prompt's first token has no logprob (null); the worker scores the tokens after it.
  if (!setup_.echo.prompt.empty()) {
    prompt_logprobs_.push_back(LogprobEntry{TokenText(setup_.echo.prompt[0]), std::nullopt, {}});
  }
}

void CompletionStream::MarkSent(TimeNs now) {
  timings_.sent = now;
  if (last_sent_ == 0) last_sent_ = now;
}

void CompletionStream::OnRetry(WorkerId, WorkerId) { last_sent_ = ctx_->clock->Now(); }

std::string CompletionStream::TokenText(TokenId t) const {
  auto decoder = codec_->NewDecoder();
  std::string s = decoder->Push(t);
  return s + decoder->Finish();
}

void CompletionStream::TakePromptLogprobs(const WorkerDelta& d) {
  if (d.prompt_logprobs.empty() || prompt_logprobs_taken_ || setup_.echo.prompt.empty()) return;
  prompt_logprobs_taken_ = true;
  AppendLogprobEntries(d.prompt_logprobs, [this](TokenId t) { return TokenText(t); }, &prompt_logprobs_);
}

void CompletionStream::OnDelta(WorkerId worker, const WorkerDelta& d) {
  if (done_) return;
  if (d.index >= choices_.size()) {
    // A worker that answers for a sequence the request did not ask for is broken.
    if (setup_.cancel) setup_.cancel();
    return OnError(worker, Internal("worker " + ctx_->worker_name(worker) + " sent sequence " +
                                    std::to_string(d.index) + " of a request of n=" + std::to_string(req_.sampling.n)),
                   started_);
  }
  Choice& c = choices_[d.index];
  if (!c.finish.empty()) return;  // a stop string ended this choice; the worker goes on with the rest
  const TimeNs now = ctx_->clock->Now();
  TakePromptLogprobs(d);
  // The echoed prompt (and its logprobs) goes first in every choice, outside the stop strings.
  std::string echo;
  ChoiceLogprobs chunk_lp;
  chunk_lp.text_offset = c.text_offset;
  if (req_.echo && !c.echoed) {
    c.echoed = true;
    echo = setup_.echo.text;
    if (req_.sampling.logprobs >= 0) chunk_lp.entries = prompt_logprobs_;
  }
  if (setup_.echo.drop_generated) {
    WorkerDelta none = d;
    none.tokens.clear();
    if (none.finish != FinishReason::kNone || !echo.empty()) EmitDelta(worker, none, c, echo, &chunk_lp, now);
    return;
  }
  if (req_.sampling.logprobs >= 0) {
    AppendLogprobEntries(d.logprobs, [this](TokenId t) { return TokenText(t); }, &chunk_lp.entries);
  }
  EmitDelta(worker, d, c, echo, &chunk_lp, now);
}

void CompletionStream::ObserveTimes(const WorkerDelta& d, TimeNs now) {
  if (!first_ && !d.tokens.empty()) {
    first_ = true;
    timings_.first_delta = now;
    ctx_->metrics->ttft.Observe(Seconds(now - setup_.arrived));
    ctx_->metrics->queue_time.Observe(Seconds((last_sent_ > 0 ? last_sent_ : now) - setup_.arrived));
  } else if (!d.tokens.empty() && d.index == 0) {
    // Choice 0's gaps: the n choices' deltas of one step arrive together.
    ctx_->metrics->itl.Observe(Seconds(now - last_) / static_cast<double>(d.tokens.size()));
  }
  if (d.index == 0) last_ = now;
}

void CompletionStream::EmitDelta(WorkerId worker, const WorkerDelta& d, Choice& c, const std::string& echo,
                                 ChoiceLogprobs* lp, TimeNs now) {
  ObserveTimes(d, now);
  std::string text;
  for (TokenId t : d.tokens) {
    ++completion_tokens_;
    text += c.decoder->Push(t);
  }
  if (d.finish != FinishReason::kNone) text += c.decoder->Finish();
  bool stopped = false;
  std::string out = echo + c.stops.Push(text, &stopped);
  for (const LogprobEntry& e : lp->entries) c.text_offset += e.token.size();
  usage_.prompt_tokens = d.usage.prompt_tokens > 0 ? d.usage.prompt_tokens : setup_.prompt_tokens;
  usage_.cached_tokens = d.usage.cached_device_tokens + d.usage.cached_host_tokens;
  usage_.completion_tokens = completion_tokens_;  // summed over the choices
  if (stopped) {
    c.finish = "stop";
  } else if (d.finish != FinishReason::kNone) {
    out += c.stops.Flush();
    c.finish = std::string(FinishReasonText(d.finish));
  }
  const bool all_done = !c.finish.empty() && ++finished_choices_ == choices_.size();
  if (all_done) {
    usage_.worker = ctx_->worker_name(worker);
    usage_.worker_ttft_ms = static_cast<double>(d.usage.time_to_first_token_us) / 1000.0;
    if (ctx_->report_timings) usage_.timings = timings_;
    // A choice a stop string ended may still run on the worker: it need not go on. (The
    // lane forgot the flight already when the worker ended every sequence itself.)
    if (setup_.cancel) setup_.cancel();
  }
  Send(worker, c, out, lp, d.index);
  if (all_done) End(worker);
}

void CompletionStream::Send(WorkerId worker, Choice& c, const std::string& out, ChoiceLogprobs* lp,
                            uint32_t index) {
  const bool with_lp = req_.sampling.logprobs >= 0;
  if (!req_.stream) {
    c.text += out;
    if (with_lp) {
      for (LogprobEntry& e : lp->entries) c.logprobs.entries.push_back(std::move(e));
    }
    return;
  }
  if (!started_) {
    started_ = true;
    out_->StartStream(200, "text/event-stream", {{std::string(kWorkerHeader), ctx_->worker_name(worker)}});
  }
  std::optional<ChatOutputDelta> parsed;
  if (c.output) {
    parsed = c.output->Push(out);
    if (!c.finish.empty()) {
      ChatOutputDelta rest = c.output->Finish();
      parsed->reasoning += rest.reasoning;
      parsed->content += rest.content;
      for (ToolCallDelta& d : rest.calls) parsed->calls.push_back(std::move(d));
    }
  }
  const bool any = parsed ? !parsed->empty() : !out.empty();
  if (any || (c.first_chunk && req_.chat) || !lp->entries.empty()) {
    out_->Write(FormatChunk(req_, setup_.id, created_, out, "", c.first_chunk, index, with_lp ? lp : nullptr,
                            parsed ? &*parsed : nullptr));
    if (timings_.first_chunk == 0 && any) timings_.first_chunk = ctx_->clock->Now();
    c.first_chunk = false;
  }
  // Each choice's finish in its own chunk, as OpenAI streams it; "tool_calls" when the
  // model stopped after calling.
  if (!c.finish.empty()) {
    const bool called = c.output && c.output->called() && c.finish == "stop";
    out_->Write(FormatChunk(req_, setup_.id, created_, "", called ? "tool_calls" : c.finish, false, index));
  }
}

void CompletionStream::OnError(WorkerId worker, const Status& status, bool /*after_first_token*/) {
  if (done_) return;
  done_ = true;
  ApiError e = WorkerError(status, setup_.retry_after_s, ctx_->retry_after_s);
  ApiMetrics& m = *ctx_->metrics;
  m.duration.Observe(Seconds(ctx_->clock->Now() - setup_.arrived));
  if (first_) m.CountTokens(req_.model, usage_.prompt_tokens, completion_tokens_);
  if (status.code() == StatusCode::kResourceExhausted) {
    m.refused.Add({{"model", req_.model}, {"reason", "worker_queue_full"}}).Increment();
  }
  m.CountRequest(req_.model, ctx_->worker_name(worker), std::to_string(e.status));
  if (started_) {
    // Tokens already went out: the stream ends with an error event.
    out_->Write(FormatStreamError(e));
    out_->Write(kDoneEvent);
    out_->Finish();
    return;
  }
  http::Response r = ErrorResponse(e);
  r.headers.emplace_back(kWorkerHeader, ctx_->worker_name(worker));
  out_->Reply(std::move(r));
}

void CompletionStream::End(WorkerId worker) {
  done_ = true;
  ApiMetrics& m = *ctx_->metrics;
  m.actual.Increment(usage_.cached_tokens);
  m.CountTokens(req_.model, usage_.prompt_tokens, usage_.completion_tokens);
  m.CountRequest(req_.model, ctx_->worker_name(worker), "200");
  if (req_.stream) {
    if (req_.include_usage) out_->Write(FormatUsageChunk(req_, setup_.id, created_, usage_));
    out_->Write(kDoneEvent);
    out_->Finish();
  } else {
    http::Response r;
    r.headers.emplace_back(kWorkerHeader, usage_.worker);
    std::vector<ChoiceText> choices;
    std::vector<ChatOutput> outputs(choices_.size());
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      ChoiceText choice{std::move(c.text), c.finish, req_.sampling.logprobs >= 0 ? &c.logprobs : nullptr};
      if (req_.chat && setup_.output.active()) {
        outputs[i] = ParseChatOutput(setup_.output, choice.text);
        choice.output = &outputs[i];
        if (!outputs[i].calls.empty() && choice.finish_reason == "stop") choice.finish_reason = "tool_calls";
      }
      choices.push_back(std::move(choice));
    }
    r.body = FormatCompletion(req_, setup_.id, created_, choices, usage_);
    out_->Reply(std::move(r));
  }
  m.duration.Observe(Seconds(ctx_->clock->Now() - setup_.arrived));
}

}  // namespace kvfleet::router
