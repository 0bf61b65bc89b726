#include "cli/simulate/sim_worker.h"

#include <algorithm>
#include <iterator>

#include <zmq_addon.hpp>

#include "schema/describe.h"
#include "schema/requests.h"

namespace kvfleet::sim {

namespace {

// How long a closing registration socket may keep trying to deliver the Bye.
constexpr int kByeLingerMs = 1000;
// Frames taken off one socket per readiness, so one busy worker cannot starve its shard.
constexpr int kMaxFramesPerPoll = 64;

uint64_t NonZeroEpoch(uint64_t seed) {
  std::random_device rd;
  const uint64_t e = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t{rd()} << 32 | rd());
  return e == 0 ? 1 : e;
}

SimKvCacheOptions CacheOptions(const SimWorkerOptions& o) {
  SimKvCacheOptions c = o.cache;
  c.model = o.model;
  return c;
}

// Port 0: any free port.
std::string Endpoint(const std::string& host, uint16_t port) {
  return "tcp://" + host + ":" + (port == 0 ? std::string("*") : std::to_string(port));
}

// Binds `socket` and returns the endpoint it is bound to (the port resolved).
std::string BindOn(zmq::socket_t& socket, const std::string& host, uint16_t port) {
  socket.bind(Endpoint(host, port));
  return socket.get(zmq::sockopt::last_endpoint);
}

}  // namespace

zmq::socket_t MakeRegistrationSocket(zmq::context_t& context, const RegistrationSocketOptions& options) {
  zmq::socket_t socket(context, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, kByeLingerMs);
  // A router that is down keeps few Hellos: each one replaces the last.
  socket.set(zmq::sockopt::sndhwm, 4);
  socket.connect(options.router_endpoint);
  return socket;
}

SimWorker::SimWorker(zmq::context_t& context, const SimWorkerOptions& options, SimCounters* counters)
    : options_(options),
      counters_(counters),
      rng_(options.seed),
      cache_(CacheOptions(options), options.seed),
      stream_(options.name, NonZeroEpoch(options.seed), options.ring_batches),
      pub_(context, zmq::socket_type::pub),
      replay_(context, zmq::socket_type::router),
      requests_(context, zmq::socket_type::router) {}

Result<std::unique_ptr<SimWorker>> SimWorker::Start(zmq::context_t& context, const SimWorkerOptions& options,
                                                   TimeNs now, SimCounters* counters) {
  std::unique_ptr<SimWorker> w(new SimWorker(context, options, counters));
  KVF_RETURN_IF_ERROR(w->Bind(now));
  w->cache_.Fill(options.initial_fill);
  w->registration_ = MakeRegistrationSocket(context, RegistrationSocketOptions{options.router_endpoint});
  return w;
}

Status SimWorker::Bind(TimeNs now) {
  for (zmq::socket_t* s : {&pub_, &replay_, &requests_}) s->set(zmq::sockopt::linger, 0);
  pub_.set(zmq::sockopt::sndhwm, 100'000);
  try {
    events_endpoint_ = BindOn(pub_, options_.host, options_.events_port);
    replay_endpoint_ = BindOn(replay_, options_.host, options_.replay_port);
    requests_endpoint_ = BindOn(requests_, options_.host, options_.requests_port);
  } catch (const zmq::error_t& e) {
    return Unavailable("worker " + options_.name + ": bind on " + options_.host + " ports " +
                       std::to_string(options_.requests_port) + "-" + std::to_string(options_.replay_port) + ": " +
                       e.what());
  }
  // Staggered, so a fleet started at once does not step in lockstep.
  std::uniform_int_distribution<DurationNs> phase(0, options_.batch_interval);
  next_step_ = now + phase(rng_);
  last_step_ = now;
  last_publish_ = now;
  next_hello_ = now;  // the first Hello goes out with the first RunDue
  hello_frame_ = EncodeHello(Hello());
  return Status::Ok();
}

WorkerHello SimWorker::Hello() const {
  WorkerHello h;
  h.name = options_.name;
  h.model = options_.model;
  h.block_size = options_.block_size;
  h.max_context = options_.max_context;
  h.device_blocks = options_.cache.capacity_blocks;
  h.requests_endpoint = requests_endpoint_;
  h.events_endpoint = events_endpoint_;
  h.replay_endpoint = replay_endpoint_;
  h.backend = "sim";
  h.epoch = stream_.epoch();
  KvPoolAnnounce pool;
  pool.layers = 1;
  pool.device_blocks = options_.cache.capacity_blocks;
  h.kv_pools = {pool};
  return h;
}

LoadReport SimWorker::Load() const {
  LoadReport l;
  l.active_requests = static_cast<uint32_t>(streams_.size());
  uint64_t decode_blocks = 0;
  for (const Answer& a : streams_) decode_blocks += (a.prompt_tokens + a.sent) / options_.block_size + 1;
  l.active_decode_blocks = decode_blocks;
  l.total_blocks[static_cast<int>(kv::Tier::kDevice)] = cache_.capacity();
  l.free_blocks[static_cast<int>(kv::Tier::kDevice)] = cache_.capacity() - std::min(decode_blocks, cache_.capacity());
  l.prefill_tokens_per_second = options_.prefill_tokens_per_second;
  l.decode_tokens_per_second = static_cast<float>(kNsPerSec) / static_cast<float>(std::max<DurationNs>(1, options_.token_delay));
  return l;
}

void SimWorker::BeginLeave(TimeNs now) {
  if (leaving()) return;
  (void)registration_.send(zmq::buffer(EncodeBye(WorkerBye{options_.name, stream_.epoch()})), zmq::send_flags::dontwait);
  registration_.close();  // lingers until the Bye is out
  leave_by_ = std::max<TimeNs>(1, now + options_.shutdown_grace);
}

void SimWorker::SendTo(const std::string& identity, const std::string& frame) {
  (void)requests_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)requests_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
}

void SimWorker::OnReplay() {
  // One request a call: an answer may be a snapshot of every block held.
  std::vector<zmq::message_t> parts;
  if (!zmq::recv_multipart(replay_, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
  if (parts.size() != 2) {
    ++counters_->malformed;
    return;
  }
  const std::string identity = parts[0].to_string();
  bool snapshot = false;
  for (const std::string& m : stream_.Answer(parts[1].data(), parts[1].size(), cache_, &snapshot)) {
    (void)replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)replay_.send(zmq::buffer(m), zmq::send_flags::dontwait);
  }
  ++(snapshot ? counters_->snapshots : counters_->replays);
}

void SimWorker::OnRequests(TimeNs now) {
  for (int i = 0; i < kMaxFramesPerPoll; ++i) {
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(requests_, std::back_inserter(parts), zmq::recv_flags::dontwait)) return;
    if (parts.size() != 2) {
      ++counters_->malformed;
      continue;
    }
    HandleRequest(parts[0].to_string(), parts[1], now);
  }
}

void SimWorker::HandleRequest(const std::string& identity, const zmq::message_t& frame, TimeNs now) {
  if (IsDescribe(frame.data(), frame.size())) {
    SendTo(identity, EncodeDescribed(Hello()));
    return;
  }
  auto msg = DecodeToWorker(frame.data(), frame.size());
  if (!msg.ok()) {
    ++counters_->malformed;
    return;
  }
  switch (msg->kind) {
    case ToWorkerMessage::Kind::kGenerate: {
      if (leaving()) {
        ++counters_->refused;
        SendTo(identity, EncodeError(WorkerError{msg->request_id, WorkerErrorCode::kShuttingDown, "shutting down"}));
        return;
      }
      ++counters_->generates;
      const SamplingParams& s = msg->params.sampling;
      streams_.push_back(Answer{.identity = identity,
                                .request_id = msg->request_id,
                                .sequences = std::max(1u, s.n),
                                .total = std::max(1u, std::min(options_.tokens, s.max_tokens)),
                                .max_tokens = s.max_tokens,
                                .prompt_tokens = static_cast<uint32_t>(msg->params.tokens.size()),
                                .arrival = now,
                                .due = now + options_.token_delay});
      return;
    }
    case ToWorkerMessage::Kind::kCancel: {
      auto it = std::find_if(streams_.begin(), streams_.end(), [&](const Answer& a) {
        return a.identity == identity && a.request_id == msg->request_id;
      });
      if (it == streams_.end()) return;
      ++counters_->cancels;
      for (uint32_t s = 0; s < it->sequences; ++s) {
        WorkerDelta d;
        d.request_id = it->request_id;
        d.index = s;
        d.finish = FinishReason::kCancelled;
        SendTo(identity, EncodeDelta(d));
      }
      streams_.erase(it);
      return;
    }
    case ToWorkerMessage::Kind::kLoadLora:
    case ToWorkerMessage::Kind::kUnloadLora:
      SendTo(identity, EncodeLoraResult(WorkerLoraResult{msg->request_id, false, WorkerErrorCode::kInvalidRequest,
                                                         "a simulated worker serves no LoRA adapters"}));
      return;
  }
}

void SimWorker::SendTokens(TimeNs now) {
  while (!streams_.empty() && streams_.front().due <= now) {
    Answer a = std::move(streams_.front());
    streams_.pop_front();
    if (a.sent == 0) a.first_token_us = static_cast<uint64_t>((now - a.arrival) / kNsPerUs);
    ++a.sent;
    const bool last = a.sent == a.total;
    for (uint32_t s = 0; s < a.sequences; ++s) {
      WorkerDelta d;
      d.request_id = a.request_id;
      d.index = s;
      d.tokens = {static_cast<TokenId>('a' + (a.sent - 1) % 26)};  // a letter under the byte codec
      if (last) {
        d.finish = a.total == a.max_tokens ? FinishReason::kLength : FinishReason::kStop;
        d.usage = WorkerUsage{a.prompt_tokens, 0, 0, a.sent, a.first_token_us};
      }
      SendTo(a.identity, EncodeDelta(d));
    }
    counters_->tokens += a.sequences;
    if (last) {
      ++counters_->completed;
      continue;
    }
    a.due = now + options_.token_delay;
    streams_.push_back(std::move(a));
  }
}

void SimWorker::Step(TimeNs now, TimeNs wall_ns) {
  // At most a second's worth: a worker whose shard fell behind does not burst to catch up.
  const DurationNs elapsed = std::min<DurationNs>(now - last_step_, kNsPerSec);
  event_budget_ += options_.events_per_s * static_cast<double>(elapsed) / kNsPerSec;
  last_step_ = now;
  std::vector<kv::KvEvent> events;
  size_t block_events = 0;
  while (event_budget_ > 0) {
    const size_t n = cache_.Request(&events);
    event_budget_ -= static_cast<double>(n);
    block_events += n;
  }
  if (events.empty() && now - last_publish_ < options_.heartbeat_interval) return;
  const std::string& frame = stream_.Seal(std::move(events), Load(), wall_ns);
  (void)pub_.send(zmq::buffer(stream_.topic()), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)pub_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
  last_publish_ = now;
  ++(block_events > 0 ? counters_->batches : counters_->heartbeats);
  counters_->block_events += block_events;
}

TimeNs SimWorker::RunDue(TimeNs now, TimeNs wall_ns) {
  if (!leaving() && now >= next_hello_) {
    (void)registration_.send(zmq::buffer(hello_frame_), zmq::send_flags::dontwait);
    next_hello_ = now + options_.hello_interval;
  }
  SendTokens(now);
  if (now >= next_step_) {
    Step(now, wall_ns);
    next_step_ += options_.batch_interval;
    if (next_step_ <= now) next_step_ = now + options_.batch_interval;  // a late shard does not catch up
  }
  TimeNs next = leaving() ? next_step_ : std::min(next_hello_, next_step_);
  if (!streams_.empty()) next = std::min(next, streams_.front().due);
  return next;
}

}  // namespace kvfleet::sim
