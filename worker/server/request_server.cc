#include "worker/server/request_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "schema/describe.h"
#include "schema/limits.h"

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

WorkerErrorCode ErrorCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOutOfRange: return WorkerErrorCode::kContextTooLong;
    case StatusCode::kNotFound: return WorkerErrorCode::kUnknownLora;
    case StatusCode::kResourceExhausted: return WorkerErrorCode::kOverloaded;
    case StatusCode::kUnavailable: return WorkerErrorCode::kShuttingDown;
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:  // e.g. unloading an adapter requests still use
    case StatusCode::kAlreadyExists: return WorkerErrorCode::kInvalidRequest;
    default: return WorkerErrorCode::kInternal;
  }
}

namespace {

// Contract 3's Generate as the engine's request; the prompt is moved, not copied.
engine::GenerateRequest ToRequest(GenerateParams&& g) {
  engine::GenerateRequest r;
  r.prompt = std::move(g.tokens);
  r.sampling = std::move(g.sampling);
  for (const RetentionRange& range : g.retention.ranges) {
    kv::TokenRangeRetention rr;
    rr.start = range.start;
    rr.end = range.end;
    rr.priority = range.priority;
    if (range.duration_ms) rr.duration = static_cast<DurationNs>(*range.duration_ms) * kNsPerMs;
    r.retention.token_ranges.push_back(rr);
  }
  if (g.retention.decode_priority) r.retention.decode_priority = *g.retention.decode_priority;
  if (g.retention.decode_duration_ms) {
    r.retention.decode_duration = static_cast<DurationNs>(*g.retention.decode_duration_ms) * kNsPerMs;
  }
  r.lora = std::move(g.lora);
  r.cache_salt = std::move(g.cache_salt);
  return r;
}

FinishReason ToWire(engine::FinishReason f) {
  switch (f) {
    case engine::FinishReason::kNone: return FinishReason::kNone;
    case engine::FinishReason::kStop: return FinishReason::kStop;
    case engine::FinishReason::kLength: return FinishReason::kLength;
    case engine::FinishReason::kCancelled: return FinishReason::kCancelled;
    case engine::FinishReason::kError: return FinishReason::kError;
  }
  return FinishReason::kError;
}

std::vector<TokenLogprob> ToWire(const std::vector<backend::TokenLogprobs>& in) {
  std::vector<TokenLogprob> out;
  out.reserve(in.size());
  for (const backend::TokenLogprobs& t : in) out.push_back(TokenLogprob{t.token, t.logprob, t.top});
  return out;
}

std::string EncodeOutput(uint64_t wire_id, const engine::RequestOutput& out) {
  WorkerDelta delta;
  delta.request_id = wire_id;
  delta.index = out.index;
  delta.tokens = out.new_tokens;
  delta.finish = ToWire(out.finish);
  delta.usage = {out.usage.prompt_tokens, out.usage.cached_device_tokens, out.usage.cached_host_tokens,
                 out.usage.completion_tokens, static_cast<uint64_t>(out.usage.time_to_first_token / kNsPerUs)};
  delta.logprobs = ToWire(out.logprobs);
  delta.prompt_logprobs = ToWire(out.prompt_logprobs);
  return EncodeDelta(delta);
}

}  // namespace

RequestServer::RequestServer(zmq::context_t& context, std::unique_ptr<zmq::context_t> own_context,
                             const Clock* clock, std::function<void(DurationNs)> on_first_token,
                             std::function<void(WorkerErrorCode)> on_error)
    : own_context_(std::move(own_context)),
      clock_(clock),
      on_first_token_(std::move(on_first_token)),
      on_error_(std::move(on_error)),
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
  std::unique_ptr<RequestServer> server(
      new RequestServer(context, std::move(own_context), clock, options.on_first_token, options.on_error));
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
    server->socket_.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxToWorkerBytes);
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
  server->loader_thread_ = std::thread([s = server.get()] { s->LoaderLoop(); });
  return server;
}

RequestServer::~RequestServer() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RequestServer::Stop() {
  {
    std::lock_guard lock(loader_mu_);
    loader_stop_ = true;
  }
  loader_cv_.notify_all();
  if (loader_thread_.joinable()) loader_thread_.join();
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

void RequestServer::SendError(const ClientKey& key, WorkerErrorCode code, const std::string& message) {
  if (on_error_) on_error_(code);
  {
    std::lock_guard lock(outbox_mu_);
    outbox_.push_back(Outgoing{key, ErrorReply{code, message}, clock_->Now()});
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RequestServer::SendLoraResult(const ClientKey& key, const Status& status) {
  WorkerLoraResult result{key.request_id, status.ok(), status.ok() ? WorkerErrorCode::kInternal : ErrorCodeFor(status),
                          status.message()};
  {
    std::lock_guard lock(outbox_mu_);
    outbox_.push_back(Outgoing{key, std::move(result), clock_->Now()});
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

void RequestServer::SetStructuredOutputs(std::shared_ptr<engine::StructuredOutputs> structured) {
  std::lock_guard lock(structured_mu_);
  structured_ = std::move(structured);
}

void RequestServer::SetLoraLoader(LoraLoader loader) {
  std::lock_guard lock(loader_mu_);
  loader_ = std::move(loader);
}

void RequestServer::LoaderLoop() {
  std::unique_lock lock(loader_mu_);
  while (true) {
    loader_cv_.wait(lock, [&] { return loader_stop_ || !loader_jobs_.empty(); });
    if (loader_stop_) return;
    LoadLoraCommand job = std::move(loader_jobs_.front());
    loader_jobs_.pop_front();
    const LoraLoader loader = loader_;
    lock.unlock();
    if (!loader) {
      job.status = Unavailable("the worker is starting: LoRA adapters cannot be loaded yet");
    } else {
      auto adapter = loader(job.name, job.path);
      if (adapter.ok()) {
        job.adapter = *std::move(adapter);
      } else {
        job.status = adapter.status();
      }
    }
    {
      std::lock_guard inbox(inbox_mu_);
      inbox_.push_back(std::move(job));
    }
    inbox_cv_.notify_one();
    lock.lock();
  }
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
      frame = EncodeOutput(o.key.request_id, *out);
    } else if (auto* e = std::get_if<ErrorReply>(&o.body)) {
      first_token_sent_.erase(o.key);  // an Error ends the request
      frame = EncodeError(WorkerError{o.key.request_id, e->code, e->message});
    } else {
      frame = EncodeLoraResult(std::get<WorkerLoraResult>(o.body));
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
  const bool last = out->last;  // the request's final output (of its n sequences)
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
  auto decoded = DecodeToWorker(frame.data(), frame.size());
  if (!decoded.ok() && IsDescribe(frame.data(), frame.size())) {  // rare: decoded a second time
    AnswerDescribe(identity);
    return;
  }
  if (!decoded.ok()) {
    malformed_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (limit.Allow(&suppressed)) {
      Logger("server")->warn("dropped a malformed request frame ({} bytes): {} ({} more suppressed)", frame.size(),
                             decoded.status().message(), suppressed);
    }
    // A Generate whose id can be read is answered, so its router does not wait for a timeout.
    if (const uint64_t id = ReadGenerateRequestId(frame.data(), frame.size()); id != 0) {
      SendError(ClientKey{identity, id}, WorkerErrorCode::kInvalidRequest,
                "the request frame does not decode: " + decoded.status().message());
    }
    return;
  }
  ToWorkerMessage& msg = *decoded;
  Command cmd;
  if (msg.kind == ToWorkerMessage::Kind::kCancel) {
    cmd = CancelCommand{ClientKey{identity, msg.request_id}};
  } else if (msg.kind == ToWorkerMessage::Kind::kLoadLora) {
    {
      std::lock_guard lock(loader_mu_);
      loader_jobs_.push_back(LoadLoraCommand{ClientKey{identity, msg.request_id}, std::move(msg.lora.name),
                                             std::move(msg.lora.path), nullptr, Status::Ok()});
    }
    loader_cv_.notify_one();
    return;
  } else if (msg.kind == ToWorkerMessage::Kind::kUnloadLora) {
    cmd = UnloadLoraCommand{ClientKey{identity, msg.request_id}, std::move(msg.lora.name)};
  } else {
    std::string model = std::move(msg.params.model);
    PullHint pull = std::move(msg.params.pull);
    engine::GenerateRequest request = ToRequest(std::move(msg.params));
    if (request.sampling.structured.kind != StructuredOutput::Kind::kNone) {
      std::shared_ptr<engine::StructuredOutputs> structured;
      {
        std::lock_guard lock(structured_mu_);
        structured = structured_;
      }
      if (structured) {
        if (Status st = structured->Prepare(&request); !st.ok()) {
          return SendError(ClientKey{identity, msg.request_id}, ErrorCodeFor(st), st.message());
        }
      }
    }
    cmd = GenerateCommand{ClientKey{identity, msg.request_id}, std::move(model), std::move(request), received,
                          std::move(pull)};
  }
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.push_back(std::move(cmd));
  }
  inbox_cv_.notify_one();
}

void RequestServer::SetHello(const WorkerHello& hello) {
  std::string frame = EncodeDescribed(hello);
  std::lock_guard lock(hello_mu_);
  hello_frame_ = std::move(frame);
}

void RequestServer::AnswerDescribe(const std::string& identity) {
  std::string frame;
  {
    std::lock_guard lock(hello_mu_);
    frame = hello_frame_;
  }
  if (frame.empty()) return;  // still loading: the router asks again
  try {
    socket_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(frame), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    Logger("server")->warn("answering a Describe failed: {}", e.what());
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
