#include "router/fleet/lane.h"

#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>

#include <zmq.h>
#include <zmq.hpp>

#include "common/check.h"
#include "common/log.h"
#include "schema/limits.h"

namespace kvfleet::router {

namespace {

// Most messages one DEALER drain reads before the thread's other work (the writes of the
// answers just read, other sockets, new requests) gets a turn; the rest is drained next.
constexpr int kMaxDrain = 16;

Status StatusFromWorkerError(const WorkerError& e) {
  std::string m = "worker: " + e.message;
  switch (e.code) {
    case WorkerErrorCode::kInvalidRequest: return InvalidArgument(m);
    case WorkerErrorCode::kContextTooLong: return OutOfRange(m);
    case WorkerErrorCode::kUnknownLora: return NotFound(m);
    case WorkerErrorCode::kUnknownModel: return Unavailable(m);  // the registry is stale, not the request
    case WorkerErrorCode::kOverloaded: return ResourceExhausted(m);
    case WorkerErrorCode::kShuttingDown: return Unavailable(m);
    case WorkerErrorCode::kInternal: return Internal(m);
  }
  return Internal(m);
}

// A split request's prefill stage: the prompt, one token generated and dropped, as cheaply
// as the worker can (greedy, nothing else asked of it).
GenerateParams PrefillOnly(const GenerateParams& request) {
  GenerateParams p;
  p.tokens = request.tokens;
  p.retention = request.retention;
  p.lora = request.lora;
  p.cache_salt = request.cache_salt;
  p.model = request.model;
  p.sampling.temperature = 0;
  p.sampling.max_tokens = 1;
  p.sampling.ignore_eos = true;
  return p;
}

}  // namespace

Lane::Lane(LaneFleet* fleet, LaneLoop* loop)
    : fleet_(fleet), loop_(loop), options_(fleet->options()), alive_(std::make_shared<bool>(true)) {
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  KVF_CHECK(timer_fd_ >= 0);
  itimerspec spec{};
  spec.it_interval.tv_sec = options_.tick / kNsPerSec;
  spec.it_interval.tv_nsec = options_.tick % kNsPerSec;
  spec.it_value = spec.it_interval;
  KVF_CHECK(timerfd_settime(timer_fd_, 0, &spec, nullptr) == 0);
  timer_watch_ = loop_->WatchReadable(timer_fd_, [this] { Tick(); });
  Sync();
}

Lane::~Lane() {
  *alive_ = false;
  timer_watch_.reset();
  ::close(timer_fd_);
  std::vector<uint64_t> handles;
  for (auto& [handle, f] : flights_) handles.push_back(handle);
  for (uint64_t h : handles) {
    auto it = flights_.find(h);
    if (it != flights_.end()) End(h, it->second.worker, Unavailable("the router is shutting down"));
  }
  std::vector<uint64_t> controls;
  for (auto& [id, c] : controls_) controls.push_back(id);
  for (uint64_t id : controls) EndControl(id, Unavailable("the router is shutting down"));
  for (Peer& p : peers_) {
    p.watch.reset();
    p.dealer.reset();
  }
}

// --- workers ---

void Lane::Sync() {
  uint64_t gen = fleet_->Generation();
  if (gen == generation_ && (!missing_ || fleet_->clock()->Now() < missing_retry_at_)) return;
  generation_ = gen;
  missing_ = false;
  std::vector<bool> present(peers_.size(), false);
  for (const auto& w : fleet_->Endpoints()) {
    if (w.id >= peers_.size()) {
      peers_.resize(w.id + 1);
      present.resize(w.id + 1, false);
    }
    present[w.id] = true;
    if (!peers_[w.id].dealer || peers_[w.id].endpoint != w.requests_endpoint) Connect(w.id, w.requests_endpoint);
  }
  for (WorkerId id = 0; id < peers_.size(); ++id) {
    if (!present[id] && peers_[id].dealer) {
      peers_[id].watch.reset();
      peers_[id].dealer.reset();
      peers_[id].endpoint.clear();
    }
  }
}

void Lane::Connect(WorkerId id, const std::string& endpoint) {
  Peer& p = peers_[id];
  p.watch.reset();
  p.dealer = fleet_->NewDealer();  // null when the socket limit is spent (logged there)
  p.endpoint = endpoint;
  try {
    if (p.dealer) p.dealer->connect(endpoint);
  } catch (const zmq::error_t& e) {
    Logger("fleet")->warn("lane: cannot connect to {}: {}", endpoint, e.what());
  }
  try {
    if (p.dealer) p.watch = loop_->WatchReadable(p.dealer->get(zmq::sockopt::fd), [this, id] { Drain(id); });
  } catch (const zmq::error_t& e) {
    Logger("fleet")->error("lane: no file descriptor for the DEALER to {}: {}", endpoint, e.what());
  }
  if (!p.watch) {
    p.dealer.reset();  // the worker is not live on this lane until Sync makes one
    p.endpoint.clear();
    missing_ = true;
    missing_retry_at_ = fleet_->clock()->Now() + kNsPerSec;
  }
}

size_t Lane::dealers() const {
  return std::count_if(peers_.begin(), peers_.end(), [](const Peer& p) { return p.dealer != nullptr; });
}

// --- requests ---

void Lane::Submit(uint64_t handle, ForwardRequest request) {
  Flight f;
  f.prefill_tokens = request.prefill_tokens;
  f.whole_prompt = static_cast<uint32_t>(request.params.tokens.size());
  f.worker = request.worker;
  if (request.prefill) {
    f.prefilling = true;
    f.prefill_tokens = request.prefill->prefill_tokens;
    f.worker = request.prefill->worker;
  }
  f.request = std::move(request);
  f.deadline = fleet_->clock()->Now() + options_.request_timeout;
  WorkerId worker = f.worker;
  KVF_CHECK(flights_.emplace(handle, std::move(f)).second);  // handles are unique per lane
  if (fleet_->Stopping()) {
    return End(handle, worker, Unavailable("the router is shutting down"));
  }
  if (static_cast<int64_t>(flights_.at(handle).whole_prompt) > wire::limits::kMaxContextTokens) {
    // A worker's request socket would drop the connection at the frame (schema/limits.h).
    return End(handle, worker, InvalidArgument("the prompt is longer than any worker's context"));
  }
  Sync();  // a worker that joined since the last tick
  StartAttempt(handle, worker);
}

void Lane::Cancel(uint64_t handle) {
  auto it = flights_.find(handle);
  if (it == flights_.end()) return;
  SendCancel(it->second);
  Release(it->second);
  flights_.erase(it);
}

// Sends the flight to `worker`; on failure tries the next worker or ends the flight.
void Lane::StartAttempt(uint64_t handle, WorkerId worker) {
  Flight& f = flights_.at(handle);
  (f.prefilling ? f.prefill_tried : f.tried).push_back(worker);
  f.worker = worker;
  Peer* p = worker < peers_.size() ? &peers_[worker] : nullptr;
  if (p == nullptr || !p->dealer || !fleet_->Routable(worker)) {
    return FailOver(handle, Unavailable("worker " + std::to_string(worker) + " is not live"));
  }
  uint64_t attempt = next_attempt_++;
  std::string frame = EncodeGenerate(attempt, f.prefilling ? PrefillOnly(f.request.params) : f.request.params);
  // Counted before it is sent: the peer routers hear of it (FleetOptions::on_own_load_change,
  // gossip) before the worker does, and route their next request knowing it.
  const OwnLoadDelta counted{1, 1, static_cast<int64_t>(f.prefill_tokens), static_cast<int64_t>(f.whole_prompt)};
  fleet_->CountInflight(worker, counted);
  Status failed = Status::Ok();
  try {
    if (!p->dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait)) {
      failed = Unavailable("worker " + fleet_->WorkerName(worker) + " is not accepting requests");
    }
  } catch (const zmq::error_t& e) {
    failed = Unavailable(std::string("send failed: ") + e.what());
  }
  if (!failed.ok()) {
    fleet_->CountInflight(worker,
                          {-counted.requests, -counted.waiting, -counted.prefill_tokens, -counted.prompt_tokens});
    return FailOver(handle, failed);
  }
  f.attempt_id = attempt;
  f.finished = 0;
  f.failures_at_send = fleet_->Failures(worker, nullptr);
  f.sent = fleet_->clock()->Now();
  f.first_token_deadline = f.sent + options_.first_token_timeout;
  attempts_[attempt] = handle;
  AfterSend(worker);
}

void Lane::SendLoraControl(WorkerId worker, ToWorkerMessage::Kind kind, const LoraControl& lora, DurationNs timeout,
                           LoraDone done) {
  KVF_CHECK(kind == ToWorkerMessage::Kind::kLoadLora || kind == ToWorkerMessage::Kind::kUnloadLora);
  Sync();  // a worker that joined since the last tick
  const uint64_t id = next_attempt_++;
  controls_.emplace(id, Control{worker, fleet_->clock()->Now() + timeout, fleet_->Failures(worker, nullptr),
                                std::move(done)});
  if (fleet_->Stopping()) return EndControl(id, Unavailable("the router is shutting down"));
  Peer* p = worker < peers_.size() ? &peers_[worker] : nullptr;
  if (p == nullptr || !p->dealer || !fleet_->Routable(worker)) {
    return EndControl(id, Unavailable("worker " + fleet_->WorkerName(worker) + " is not live"));
  }
  const std::string frame =
      kind == ToWorkerMessage::Kind::kLoadLora ? EncodeLoadLora(id, lora) : EncodeUnloadLora(id, lora.name);
  try {
    if (!p->dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait)) {
      return EndControl(id, Unavailable("worker " + fleet_->WorkerName(worker) + " is not accepting requests"));
    }
  } catch (const zmq::error_t& e) {
    return EndControl(id, Unavailable(std::string("send failed: ") + e.what()));
  }
  AfterSend(worker);
}

void Lane::EndControl(uint64_t id, Result<WorkerLoraResult> result) {
  auto it = controls_.find(id);
  if (it == controls_.end()) return;
  LoraDone done = std::move(it->second.done);
  controls_.erase(it);
  done(std::move(result));
}

void Lane::OnLoraResult(const WorkerLoraResult& r) {
  auto it = controls_.find(r.request_id);
  if (it == controls_.end()) return;  // timed out already: a late answer
  EndControl(r.request_id, r);
}

// Controls past their deadline, or whose worker failed since they were sent.
void Lane::TickControls(TimeNs now) {
  std::vector<std::pair<uint64_t, Status>> ended;
  for (const auto& [id, c] : controls_) {
    std::string why;
    if (fleet_->Stopping()) {
      ended.emplace_back(id, Unavailable("the router is shutting down"));
    } else if (now >= c.deadline) {
      ended.emplace_back(id, Status(StatusCode::kDeadlineExceeded,
                                    "worker " + fleet_->WorkerName(c.worker) + " did not answer in time"));
    } else if (fleet_->Failures(c.worker, &why) != c.failures_at_send) {
      ended.emplace_back(id, Unavailable(why));
    }
  }
  for (auto& [id, why] : ended) EndControl(id, why);
}

// Undoes the in-flight counts of the flight's current attempt and forgets the attempt.
void Lane::Release(Flight& f) {
  if (f.attempt_id == 0) return;
  attempts_.erase(f.attempt_id);
  f.attempt_id = 0;
  if (f.first_token) {
    fleet_->CountInflight(f.worker, {-1, 0, 0, 0});
  } else {
    fleet_->CountInflight(f.worker, {-1, -1, -int64_t{f.prefill_tokens}, -int64_t{f.whole_prompt}});
  }
}

void Lane::SendCancel(const Flight& f) {
  if (f.attempt_id == 0 || f.worker >= peers_.size() || !peers_[f.worker].dealer) return;
  std::string frame = EncodeCancel(f.attempt_id);
  try {
    (void)peers_[f.worker].dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
  }
  AfterSend(f.worker);
}

// The current attempt failed with `why`. Before the first token: retry once elsewhere.
void Lane::FailOver(uint64_t handle, const Status& why) {
  Flight& f = flights_.at(handle);
  if (f.prefilling) return PrefillFailed(handle, why);
  Release(f);
  if (!f.first_token && static_cast<int>(f.tried.size()) < options_.max_attempts && f.request.reroute &&
      !fleet_->Stopping()) {
    auto next = f.request.reroute(f.tried);
    if (next.ok()) {
      Logger("fleet")->info("request {}: {}; retrying on worker {}", handle, why.message(), *next);
      fleet_->CountRetry();
      auto sink = f.request.sink;
      sink->OnRetry(f.worker, *next);
      if (flights_.count(handle) == 0) return;  // the sink cancelled it
      return StartAttempt(handle, *next);
    }
  }
  End(handle, f.worker, why);
}

void Lane::PrefillDone(uint64_t handle) {
  Flight& f = flights_.at(handle);
  const WorkerId prefilled_on = f.worker;
  const double seconds = static_cast<double>(fleet_->clock()->Now() - f.sent) / kNsPerSec;
  if (f.prefill_tried.size() == 1 && f.request.prefill->on_done) f.request.prefill->on_done(seconds);
  if (auto log = Logger("fleet"); log->should_log(spdlog::level::debug)) {  // the split's two stages, timed
    log->debug("request {}: prefilled on worker {} in {:.1f} ms (predicted {:.1f}); decoding on worker {}", handle,
               fleet_->WorkerName(prefilled_on), seconds * 1e3,
               f.request.prefill->estimated_s * 1e3, fleet_->WorkerName(f.request.worker));
  }
  Release(f);
  f.prefilling = false;
  f.prefill_tokens = f.request.prefill_tokens;
  f.request.params.pull = f.request.prefill->pull_from(prefilled_on);
  StartAttempt(handle, f.request.worker);
}

void Lane::PrefillFailed(uint64_t handle, const Status& why) {
  Flight& f = flights_.at(handle);
  Release(f);
  if (fleet_->Stopping()) return End(handle, f.worker, why);
  if (static_cast<int>(f.prefill_tried.size()) < options_.max_attempts && f.request.prefill->reroute) {
    auto next = f.request.prefill->reroute(f.prefill_tried);
    if (next.ok()) {
      Logger("fleet")->info("request {}: prefill: {}; retrying on worker {}", handle, why.message(), *next);
      fleet_->CountRetry();
      return StartAttempt(handle, *next);
    }
  }
  // No prefill worker left to try: the decode worker computes the prompt itself.
  Logger("fleet")->info("request {}: prefill: {}; worker {} computes the prompt", handle, why.message(),
                        f.request.worker);
  f.prefilling = false;
  f.prefill_tokens = f.whole_prompt;
  StartAttempt(handle, f.request.worker);
}

// Ends the flight with an error: forgotten first, so the sink may call Cancel().
void Lane::End(uint64_t handle, WorkerId worker, const Status& why) {
  auto it = flights_.find(handle);
  if (it == flights_.end()) return;
  Release(it->second);
  std::shared_ptr<ResponseSink> sink = std::move(it->second.request.sink);
  bool after_first_token = it->second.first_token;
  flights_.erase(it);
  sink->OnError(worker, why, after_first_token);
}

// ZMQ_FD is a notification, not a level: it reads readable when the socket's state may
// have changed, and a send can consume that signal while answers wait. So readiness is
// read from ZMQ_EVENTS, and every send is followed by AfterSend.
void Lane::Drain(WorkerId id) {
  if (id >= peers_.size()) return;
  peers_[id].drain_posted = false;
  for (int i = 0; i < kMaxDrain; ++i) {
    Peer& p = peers_[id];  // a sink may submit, and peers_ may grow
    if (!p.dealer) return;
    if (!(p.dealer->get(zmq::sockopt::events) & ZMQ_POLLIN)) return;
    zmq::message_t msg;
    if (!p.dealer->recv(msg, zmq::recv_flags::dontwait)) return;
    auto decoded = DecodeFromWorker(msg.data(), msg.size());
    if (!decoded.ok()) {
      static RateLimit bad_frames;
      uint64_t suppressed = 0;
      if (bad_frames.Allow(&suppressed)) {
        Logger("fleet")->warn("worker {}: {} ({} more suppressed)", fleet_->WorkerName(id),
                              decoded.status().message(), suppressed);
      }
      continue;
    }
    if (auto* d = std::get_if<WorkerDelta>(&*decoded)) {
      OnDelta(*d);
    } else if (auto* e = std::get_if<WorkerError>(&*decoded)) {
      OnWorkerError(*e);
    } else if (auto* r = std::get_if<WorkerLoraResult>(&*decoded)) {
      OnLoraResult(*r);
    }
  }
  AfterSend(id);  // more than kMaxDrain waiting: come back after the others
}

void Lane::AfterSend(WorkerId id) {
  Peer& p = peers_[id];
  if (p.drain_posted || !p.dealer || !(p.dealer->get(zmq::sockopt::events) & ZMQ_POLLIN)) return;
  p.drain_posted = true;
  loop_->Post([this, id, alive = alive_] {
    if (*alive) Drain(id);
  });
}

void Lane::OnDelta(const WorkerDelta& d) {
  auto a = attempts_.find(d.request_id);
  if (a == attempts_.end()) return;  // cancelled, retried or timed out: a late answer
  uint64_t handle = a->second;
  Flight& f = flights_.at(handle);
  WorkerId worker = f.worker;
  if (d.finish == FinishReason::kError || d.finish == FinishReason::kCancelled) {
    // The worker ended it on its own: a failed step, or its shutdown's grace ran out (a
    // cancel this lane sent has forgotten the attempt already). Not an answer: before the
    // first token it is retried elsewhere, after it the stream ends with an error.
    return WorkerEnded(handle, d);
  }
  if (f.prefilling) {  // the prefill stage's token is not the client's
    if (d.finish != FinishReason::kNone) PrefillDone(handle);
    return;
  }
  if (!f.first_token && (!d.tokens.empty() || d.finish != FinishReason::kNone)) {
    fleet_->CountInflight(worker, {0, -1, -int64_t{f.prefill_tokens}, -int64_t{f.whole_prompt}});
    f.first_token = true;
    if (f.request.on_first_token && f.tried.size() == 1 && f.prefill_tried.empty() && !d.tokens.empty()) {
      f.request.on_first_token(static_cast<double>(fleet_->clock()->Now() - f.sent) / kNsPerSec);
    }
  }
  std::shared_ptr<ResponseSink> sink = f.request.sink;
  // A request of n sequences ends with the last delta of each (Contract 3).
  if (d.finish != FinishReason::kNone && ++f.finished >= std::max(1u, f.request.params.sampling.n)) {
    Release(f);
    flights_.erase(handle);
  }
  sink->OnDelta(worker, d);  // may Cancel(handle)
}

void Lane::WorkerEnded(uint64_t handle, const WorkerDelta& d) {
  Flight& f = flights_.at(handle);
  const WorkerId worker = f.worker;
  const std::string name = fleet_->WorkerName(worker);
  if (f.prefilling) return FailOver(handle, Internal("worker " + name + " failed the prefill"));
  if (!f.first_token && d.tokens.empty()) {
    return FailOver(handle, d.finish == FinishReason::kError
                                ? Internal("worker " + name + " failed the request")
                                : Unavailable("worker " + name + " cancelled the request (shutting down)"));
  }
  if (!d.tokens.empty()) {
    WorkerDelta tokens = d;
    tokens.finish = FinishReason::kNone;
    OnDelta(tokens);  // the tokens it did produce; may cancel the flight
    if (flights_.count(handle) == 0) return;
  }
  End(handle, worker,
      d.finish == FinishReason::kError ? Internal("worker " + name + " failed the request mid-stream")
                                       : Unavailable("worker " + name + " cancelled the request mid-stream"));
}

void Lane::OnWorkerError(const WorkerError& e) {
  auto a = attempts_.find(e.request_id);
  if (a == attempts_.end()) return;
  uint64_t handle = a->second;
  Status st = StatusFromWorkerError(e);
  // Another worker may take it: this one's queue is full, it is stopping, or it serves
  // another model than its registration said (it restarted with a new one).
  // Likewise an adapter it no longer serves (unloaded since its last Hello).
  bool retryable = e.code == WorkerErrorCode::kOverloaded || e.code == WorkerErrorCode::kShuttingDown ||
                   e.code == WorkerErrorCode::kUnknownModel || e.code == WorkerErrorCode::kUnknownLora;
  if (retryable) return FailOver(handle, st);
  End(handle, flights_.at(handle).worker, st);
}

void Lane::Tick() {
  uint64_t expirations;
  (void)!::read(timer_fd_, &expirations, sizeof(expirations));
  Sync();
  if (!controls_.empty()) TickControls(fleet_->clock()->Now());
  if (flights_.empty()) return;
  TimeNs now = fleet_->clock()->Now();
  bool stopping = fleet_->Stopping();
  std::vector<std::pair<uint64_t, Status>> failed;
  std::vector<uint64_t> timed_out;  // whole-request deadline
  for (auto& [handle, f] : flights_) {
    if (stopping) {
      timed_out.push_back(handle);
      continue;
    }
    if (now >= f.deadline) {
      timed_out.push_back(handle);
    } else if (f.attempt_id != 0 && !f.first_token && now >= f.first_token_deadline) {
      failed.emplace_back(handle, Status(StatusCode::kDeadlineExceeded, "no first token in time"));
    } else if (f.attempt_id != 0) {
      std::string why;
      if (fleet_->Failures(f.worker, &why) != f.failures_at_send) {
        failed.emplace_back(handle, Unavailable(why));
      } else if (!fleet_->Serving(f.worker)) {
        // Not Routable: a worker that said Bye finishes what it has (a drain), so only new
        // requests avoid it; failing these over would end those past their first token.
        failed.emplace_back(handle, Unavailable("worker " + fleet_->WorkerName(f.worker) + " is not live"));
      }
    }
  }
  for (uint64_t handle : timed_out) {
    auto it = flights_.find(handle);
    if (it == flights_.end()) continue;
    SendCancel(it->second);
    End(handle, it->second.worker,
        stopping ? Unavailable("the router is shutting down")
                 : Status(StatusCode::kDeadlineExceeded, "the request timed out"));
  }
  for (auto& [handle, why] : failed) {
    auto it = flights_.find(handle);
    if (it == flights_.end()) continue;
    SendCancel(it->second);
    FailOver(handle, why);
  }
}

}  // namespace kvfleet::router
