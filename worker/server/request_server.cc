#include "worker/server/request_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include <capnp/message.h>

#include "common/check.h"
#include "common/log.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet::server {

namespace config {
// The I/O thread wakes at least this often to notice Stop() even if the eventfd write
// were lost; it costs nothing measurable.
constexpr long kIoPollTimeoutMs = 100;
// Linger on close so queued Deltas still reach routers during a graceful shutdown.
constexpr int kCloseLingerMs = 1000;
}  // namespace config

size_t ClientKeyHash::operator()(const ClientKey& k) const {
  return std::hash<std::string>()(k.identity) ^ (std::hash<uint64_t>()(k.request_id) * 0x9E3779B97F4A7C15ull);
}

ErrorCode ErrorCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOutOfRange: return ErrorCode::kContextTooLong;
    case StatusCode::kNotFound: return ErrorCode::kUnknownLora;
    case StatusCode::kResourceExhausted: return ErrorCode::kOverloaded;
    case StatusCode::kUnavailable: return ErrorCode::kShuttingDown;
    case StatusCode::kInvalidArgument:
    case StatusCode::kAlreadyExists: return ErrorCode::kInvalidRequest;
    default: return ErrorCode::kInternal;
  }
}

namespace {

engine::GenerateRequest ToRequest(schema::Generate::Reader g) {
  engine::GenerateRequest r;
  auto tokens = g.getTokens();
  r.prompt.reserve(tokens.size());
  for (TokenId t : tokens) r.prompt.push_back(t);
  auto s = g.getSampling();
  r.sampling.temperature = s.getTemperature();
  r.sampling.top_p = s.getTopP();
  r.sampling.top_k = s.getTopK();
  if (s.getHasSeed()) r.sampling.seed = s.getSeed();
  r.sampling.max_tokens = s.getMaxTokens();
  auto stops = s.getStopTokenIds();
  for (TokenId t : stops) r.sampling.stop_token_ids.push_back(t);
  r.sampling.ignore_eos = s.getIgnoreEos();
  auto ret = g.getRetention();
  for (auto range : ret.getRanges()) {
    kv::TokenRangeRetention rr;
    rr.start = range.getStart();
    if (range.getHasEnd()) rr.end = range.getEnd();
    rr.priority = range.getPriority();
    if (range.getHasDuration()) rr.duration = static_cast<DurationNs>(range.getDurationMs()) * kNsPerMs;
    r.retention.token_ranges.push_back(rr);
  }
  if (ret.getHasDecodePriority()) r.retention.decode_priority = ret.getDecodePriority();
  if (ret.getHasDecodeDuration()) {
    r.retention.decode_duration = static_cast<DurationNs>(ret.getDecodeDurationMs()) * kNsPerMs;
  }
  r.lora = g.getLoraName().cStr();
  r.cache_salt = g.getCacheSalt().cStr();
  return r;
}

schema::FinishReason ToWire(engine::FinishReason f) {
  switch (f) {
    case engine::FinishReason::kNone: return schema::FinishReason::NONE;
    case engine::FinishReason::kStop: return schema::FinishReason::STOP;
    case engine::FinishReason::kLength: return schema::FinishReason::LENGTH;
    case engine::FinishReason::kCancelled: return schema::FinishReason::CANCELLED;
    case engine::FinishReason::kError: return schema::FinishReason::ERROR;
  }
  return schema::FinishReason::ERROR;
}

std::string EncodeDelta(uint64_t wire_id, const engine::RequestOutput& out) {
  capnp::MallocMessageBuilder msg;
  auto delta = msg.initRoot<schema::FromWorker>().initDelta();
  delta.setRequestId(wire_id);
  auto tokens = delta.initTokens(static_cast<unsigned>(out.new_tokens.size()));
  for (unsigned i = 0; i < out.new_tokens.size(); ++i) tokens.set(i, out.new_tokens[i]);
  delta.setFinishReason(ToWire(out.finish));
  auto usage = delta.initUsage();
  usage.setPromptTokens(out.usage.prompt_tokens);
  usage.setCachedDeviceTokens(out.usage.cached_device_tokens);
  usage.setCachedHostTokens(out.usage.cached_host_tokens);
  usage.setCompletionTokens(out.usage.completion_tokens);
  usage.setTimeToFirstTokenUs(static_cast<uint64_t>(out.usage.time_to_first_token / kNsPerUs));
  return wire::Encode(msg);
}

std::string EncodeError(uint64_t wire_id, ErrorCode code, const std::string& message) {
  capnp::MallocMessageBuilder msg;
  auto err = msg.initRoot<schema::FromWorker>().initError();
  err.setRequestId(wire_id);
  err.setCode(static_cast<schema::ErrorCode>(code));
  err.setMessage(message);
  return wire::Encode(msg);
}

}  // namespace

RequestServer::RequestServer(zmq::context_t& context, std::unique_ptr<zmq::context_t> own_context,
                             const Clock* clock, std::function<void(DurationNs)> on_first_token)
    : own_context_(std::move(own_context)),
      clock_(clock),
      on_first_token_(std::move(on_first_token)),
      socket_(own_context_ ? *own_context_ : context, zmq::socket_type::router) {}

Result<std::unique_ptr<RequestServer>> RequestServer::Start(zmq::context_t& context,
                                                            const RequestServerOptions& options,
                                                            const Clock* clock) {
  const RequestServerCurve& curve = options.curve;
  if (curve.server_keypair_file.empty() && !curve.authorized_keys_file.empty()) {
    return InvalidArgument("requests socket: authorized keys need a server key pair");
  }
  std::unique_ptr<zmq::context_t> own_context;
  if (!curve.authorized_keys_file.empty()) own_context = std::make_unique<zmq::context_t>(1);
  std::unique_ptr<RequestServer> server(new RequestServer(context, std::move(own_context), clock, options.on_first_token));
  if (!curve.server_keypair_file.empty()) {
    KVF_ASSIGN_OR_RETURN(auto keys, LoadCurveKeyPair(curve.server_keypair_file));
    if (!curve.authorized_keys_file.empty()) {
      KVF_ASSIGN_OR_RETURN(auto authorized, LoadAuthorizedKeys(curve.authorized_keys_file));
      server->zap_ = std::make_unique<ZapAuthenticator>(server->own_context_.get(), std::move(authorized));
      KVF_RETURN_IF_ERROR(server->zap_->status());
    }
    KVF_RETURN_IF_ERROR(MakeCurveServer(server->socket_, keys));
  }
  try {
    server->socket_.set(zmq::sockopt::sndhwm, options.send_high_water_mark);
    server->socket_.set(zmq::sockopt::rcvhwm, options.send_high_water_mark);
    server->socket_.set(zmq::sockopt::linger, config::kCloseLingerMs);
    // A router that reconnects with the same identity takes over its connection.
    server->socket_.set(zmq::sockopt::router_handover, 1);
    server->socket_.bind(options.endpoint);
    server->bound_endpoint_ = server->socket_.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable("requests socket " + options.endpoint + ": " + e.what());
  }
  server->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (server->wake_fd_ < 0) return Internal("eventfd failed");
  server->io_thread_ = std::thread([s = server.get()] { s->IoLoop(); });
  return server;
}

RequestServer::~RequestServer() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RequestServer::Stop() {
  if (stopping_.exchange(true)) {
    if (io_thread_.joinable()) io_thread_.join();
    return;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (io_thread_.joinable()) io_thread_.join();
  Wake();
}

std::vector<Command> RequestServer::Take(DurationNs timeout) {
  std::unique_lock lock(inbox_mu_);
  if (inbox_.empty() && !inbox_woken_ && timeout > 0) {
    inbox_cv_.wait_for(lock, std::chrono::nanoseconds(timeout), [&] { return !inbox_.empty() || inbox_woken_; });
  }
  inbox_woken_ = false;
  std::vector<Command> out;
  out.swap(inbox_);
  return out;
}

void RequestServer::Wake() {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_woken_ = true;
  }
  inbox_cv_.notify_all();
}

void RequestServer::SendOutput(const ClientKey& key, const engine::RequestOutput& output) {
  {
    std::lock_guard lock(outbox_mu_);
    outbox_.push_back(Outgoing{key, output, clock_->Now()});
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RequestServer::SendError(const ClientKey& key, ErrorCode code, const std::string& message) {
  {
    std::lock_guard lock(outbox_mu_);
    outbox_.push_back(Outgoing{key, ErrorReply{code, message}, clock_->Now()});
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RequestServer::FlushOutbox() {
  std::vector<Outgoing> batch;
  {
    std::lock_guard lock(outbox_mu_);
    batch.swap(outbox_);
  }
  for (Outgoing& o : batch) {
    std::string frame;
    if (auto* out = std::get_if<engine::RequestOutput>(&o.body)) {
      StampTimeToFirstToken(o.key, o.queued_at, out);
      frame = EncodeDelta(o.key.request_id, *out);
    } else {
      first_token_sent_.erase(o.key);  // an Error ends the request
      const auto& e = std::get<ErrorReply>(o.body);
      frame = EncodeError(o.key.request_id, e.code, e.message);
    }
    try {
      // A peer that is gone makes ROUTER drop the message silently (no mandatory flag):
      // its requests are cancelled when the router notices, not here.
      socket_.send(zmq::buffer(o.key.identity), zmq::send_flags::sndmore);
      socket_.send(zmq::buffer(frame), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      Logger("server")->warn("sending to a router failed: {}", e.what());
    }
  }
}

void RequestServer::StampTimeToFirstToken(const ClientKey& key, TimeNs queued_at, engine::RequestOutput* out) {
  const bool last = out->finish != engine::FinishReason::kNone;
  auto it = first_token_sent_.find(key);
  if (it != first_token_sent_.end()) {
    out->usage.time_to_first_token = it->second;
    if (last) first_token_sent_.erase(it);
    return;
  }
  if (out->usage.time_to_first_token == 0) return;  // no token yet
  // The engine measured decode -> first token; the wait in the outbox (the engine thread
  // handing the Delta to this thread) is the worker's own time too. Measured from the
  // queueing, so the few instructions between the engine's step and SendOutput stay out:
  // the figure errs low, never high.
  out->usage.time_to_first_token += std::max<DurationNs>(0, clock_->Now() - queued_at);
  if (!last) first_token_sent_.emplace(key, out->usage.time_to_first_token);
  if (on_first_token_) on_first_token_(out->usage.time_to_first_token);
}

void RequestServer::HandleFrame(const std::string& identity, const zmq::message_t& frame, TimeNs received) {
  static RateLimit limit;
  auto decoded = wire::Decode<schema::ToWorker>(frame.data(), frame.size());
  if (!decoded.ok()) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (limit.Allow(&suppressed)) {
      Logger("server")->warn("dropped a malformed request frame ({} bytes): {} ({} more suppressed)", frame.size(),
                             decoded.status().message(), suppressed);
    }
    return;
  }
  try {
    auto root = (*decoded)->Root<schema::ToWorker>();
    Command cmd;
    switch (root.which()) {
      case schema::ToWorker::GENERATE: {
        auto g = root.getGenerate();
        GenerateCommand gc{ClientKey{identity, g.getRequestId()}, g.getModel().cStr(), ToRequest(g), received};
        cmd = std::move(gc);
        break;
      }
      case schema::ToWorker::CANCEL:
        cmd = CancelCommand{ClientKey{identity, root.getCancel().getRequestId()}};
        break;
      default:
        malformed_.fetch_add(1, std::memory_order_relaxed);
        return;  // a union member from a newer schema: nothing we can answer
    }
    {
      std::lock_guard lock(inbox_mu_);
      inbox_.push_back(std::move(cmd));
    }
    inbox_cv_.notify_one();
  } catch (const kj::Exception& e) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    Logger("server")->warn("malformed request: {}", e.getDescription().cStr());
  }
}

void RequestServer::IoLoop() {
  zmq::pollitem_t items[2] = {{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  while (true) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(config::kIoPollTimeoutMs));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      Logger("server")->error("poll failed: {}", e.what());
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof(n));
    }
    FlushOutbox();
    if (stopping_.load(std::memory_order_acquire)) break;
    // Read what is there without blocking: identity frame, then one ToWorker frame.
    while (true) {
      zmq::message_t identity;
      auto got = socket_.recv(identity, zmq::recv_flags::dontwait);
      if (!got) break;
      // The worker's own time starts here: decoding an 8K-token frame is the worker's work.
      const TimeNs received = clock_->Now();
      std::vector<zmq::message_t> parts;
      while (socket_.get(zmq::sockopt::rcvmore)) {
        zmq::message_t part;
        (void)socket_.recv(part, zmq::recv_flags::none);
        parts.push_back(std::move(part));
      }
      if (parts.size() != 1) {
        malformed_.fetch_add(1, std::memory_order_relaxed);
        continue;  // Contract 3: exactly one frame after the identity
      }
      HandleFrame(identity.to_string(), parts[0], received);
    }
  }
  FlushOutbox();
  socket_.close();
}

}  // namespace kvfleet::server
