#include "worker/transfer/transfer_service.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "schema/limits.h"
#include "worker/transfer/transfer_service_impl.h"

namespace kvfleet::transfer {

namespace {

// An endpoint only this host can reach: loopback, ipc, inproc.
bool LocalOnlyEndpoint(const std::string& endpoint) {
  if (endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) return true;
  if (!endpoint.starts_with("tcp://")) return false;
  const std::string host = endpoint.substr(6, endpoint.rfind(':') - 6);
  return host == "localhost" || host == "[::1]" || host == "::1" || host.starts_with("127.");
}

}  // namespace

std::string_view PullOutcomeName(PullOutcome outcome) {
  switch (outcome) {
    case PullOutcome::kOk: return "ok";
    case PullOutcome::kRefused: return "refused";
    case PullOutcome::kDeadline: return "deadline";
    case PullOutcome::kBadChecksum: return "bad-checksum";
    case PullOutcome::kMalformed: return "malformed";
    case PullOutcome::kCancelled: return "cancelled";
    case PullOutcome::kBusy: return "busy";
    case PullOutcome::kInvalid: return "invalid";
  }
  return "?";
}

DurationNs ModelledTransferTime(uint64_t bytes, double bytes_per_s) {
  if (bytes_per_s <= 0) return 0;
  return static_cast<DurationNs>(std::ceil(static_cast<double>(bytes) / bytes_per_s * 1e9));
}

TransferService::Impl::Impl(TransferOptions opts, const Clock* c)
    : options(std::move(opts)), clock(c), router(context, zmq::socket_type::router) {}

Result<std::unique_ptr<TransferService>> TransferService::Start(TransferOptions options, const Clock* clock) {
  const bool curve = options.keypair.has_value();
  if (!curve && !options.insecure && !LocalOnlyEndpoint(options.bind)) {
    return FailedPrecondition("transfer socket " + options.bind +
                              " is reachable from other hosts but unauthenticated: anyone reaching it could read "
                              "this worker's KV cache. Give a CURVE key pair and the fleet's public keys, bind a "
                              "loopback address, or set insecure on a network where every host is trusted");
  }
  if (curve && options.authorized_keys.empty()) {
    return InvalidArgument("transfer socket: a CURVE key pair needs the authorized keys of the workers that may pull");
  }
  if (options.max_inflight_pulls == 0) return InvalidArgument("transfer: max_inflight_pulls must be at least 1");
  if (options.default_deadline <= 0) return InvalidArgument("transfer: default_deadline must be positive");
  auto impl = std::make_unique<Impl>(std::move(options), clock);
  Impl& s = *impl;
  try {
    if (curve) {
      s.zap = std::make_unique<ZapAuthenticator>(&s.context, s.options.authorized_keys,
                                                 [p = &s](const std::string&) { p->unauthorized.fetch_add(1); });
      KVF_RETURN_IF_ERROR(s.zap->status());
      s.router.set(zmq::sockopt::zap_domain, "kvfleet-transfer");
      KVF_RETURN_IF_ERROR(MakeCurveServer(s.router, *s.options.keypair));
    }
    s.router.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxPullRequestBytes);
    s.router.set(zmq::sockopt::sndhwm, config::kFrameHwm);
    s.router.set(zmq::sockopt::linger, config::kCloseLingerMs);
    // A frame for a full or vanished peer fails the send instead of vanishing silently.
    s.router.set(zmq::sockopt::router_mandatory, 1);
    s.router.bind(s.options.bind);
  } catch (const zmq::error_t& e) {
    return Unavailable("transfer socket " + s.options.bind + ": " + e.what());
  }
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.wake_fd < 0) return Internal("eventfd failed");
  std::unique_ptr<TransferService> service(new TransferService(std::move(impl)));
  service->bound_endpoint_ = service->impl_->router.get(zmq::sockopt::last_endpoint);
  service->endpoint_ =
      service->impl_->options.advertise.empty() ? service->bound_endpoint_ : service->impl_->options.advertise;
  service->impl_->io_thread = std::thread([p = service->impl_.get()] { p->IoLoop(); });
  return service;
}

TransferService::TransferService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TransferService::~TransferService() {
  Stop();
  if (impl_->wake_fd >= 0) close(impl_->wake_fd);
}

void TransferService::Stop() {
  Impl& s = *impl_;
  if (!s.stopping.exchange(true)) {
    uint64_t one = 1;
    (void)!write(s.wake_fd, &one, sizeof(one));
  }
  if (s.io_thread.joinable()) s.io_thread.join();
  s.cv.notify_all();
}

std::vector<IncomingPull> TransferService::TakePulls() {
  std::lock_guard lock(impl_->mu);
  std::vector<IncomingPull> out;
  out.swap(impl_->pulls_ready);
  return out;
}

std::vector<PullResult> TransferService::TakeResults() {
  std::lock_guard lock(impl_->mu);
  std::vector<PullResult> out;
  out.swap(impl_->results_ready);
  return out;
}

std::vector<Arrival> TransferService::TakeArrivals() {
  Impl& s = *impl_;
  std::vector<Arrival> out;
  {
    std::lock_guard lock(s.mu);
    out.swap(s.arrivals_ready);
  }
  // The I/O thread stops reading holders' replies while kArrivalsAhead wait: it reads on now.
  if (out.size() >= config::kArrivalsAhead) {
    uint64_t one = 1;
    (void)!write(s.wake_fd, &one, sizeof(one));
  }
  return out;
}

std::vector<Released> TransferService::TakeReleases() {
  std::lock_guard lock(impl_->mu);
  std::vector<Released> out;
  out.swap(impl_->releases_ready);
  return out;
}

std::vector<SpentFrame> TransferService::TakeSpentFrames() {
  std::lock_guard lock(impl_->mu);
  std::vector<SpentFrame> out;
  out.swap(impl_->spent_ready);
  return out;
}

bool TransferService::WaitForWork(DurationNs timeout) {
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  auto has_work = [&] {
    return !s.pulls_ready.empty() || !s.results_ready.empty() || !s.releases_ready.empty() || !s.spent_ready.empty() ||
           !s.arrivals_ready.empty();
  };
  s.cv.wait_for(lock, std::chrono::nanoseconds(timeout), [&] { return has_work() || s.stopping.load(); });
  return has_work();
}

void TransferService::Impl::Queue(Command command) {
  {
    std::lock_guard lock(mu);
    if (io_done) {
      // Stopped: nothing will run it. The caller is the engine thread: it sees TakeReleases and
      // TakeSpentFrames on its next round.
      DropCommand(command);
      cv.notify_all();
      return;
    }
    commands.push_back(std::move(command));
  }
  uint64_t one = 1;
  (void)!write(wake_fd, &one, sizeof(one));
}

void TransferService::Impl::DropCommand(Command& command) {
  if (auto* device = std::get_if<ServeDeviceCommand>(&command)) {
    // A device run never sent: the engine unpins now.
    releases_ready.push_back(Released{device->peer_token, device->transfer_id, true});
    stats.device_expired++;
    stats.stale_serves++;
  } else if (auto* nccl = std::get_if<ServeNcclCommand>(&command)) {
    releases_ready.push_back(Released{nccl->peer_token, nccl->transfer_id, true, true});
    stats.stale_serves++;
  } else if (auto* frame = std::get_if<ServeFrameCommand>(&command)) {
    // A stream's first chunk opened nothing: it ends here. A later one's stream was cut on Stop.
    if (frame->chunk.first == 0) {
      releases_ready.push_back(Released{frame->peer_token, frame->transfer_id, true, false, true});
      stats.stale_serves++;
    }
    GiveBack(frame->peer_token, frame->transfer_id, std::move(frame->chunk.bytes));
  }
}

void TransferService::ServeFrame(uint64_t peer_token, uint64_t transfer_id, FrameChunk chunk) {
  impl_->Queue(ServeFrameCommand{peer_token, transfer_id, std::move(chunk)});
}

void TransferService::ServeDevice(uint64_t peer_token, uint64_t transfer_id, DeviceRun run) {
  impl_->Queue(ServeDeviceCommand{peer_token, transfer_id, std::move(run)});
}

void TransferService::ServeNccl(uint64_t peer_token, uint64_t transfer_id, NcclRun run) {
  impl_->Queue(ServeNcclCommand{peer_token, transfer_id, std::move(run)});
}

void TransferService::ReleasePull(uint64_t transfer_id) { impl_->Queue(ReleaseCommand{transfer_id}); }

void TransferService::RecordDeviceCopy(const std::string& source_endpoint, uint64_t bytes, double seconds) {
  std::lock_guard lock(impl_->mu);
  SourceStats& src = impl_->stats.pulls[source_endpoint];
  src.device_copy_bytes += bytes;
  src.device_copy_seconds += seconds;
}

void TransferService::RecordNcclCopy(const std::string& source_endpoint, uint64_t bytes, double seconds) {
  std::lock_guard lock(impl_->mu);
  SourceStats& src = impl_->stats.pulls[source_endpoint];
  src.nccl_copy_bytes += bytes;
  src.nccl_copy_seconds += seconds;
}

void TransferService::Refuse(uint64_t peer_token, uint64_t transfer_id, RefusalReason reason, std::string message) {
  impl_->Queue(RefuseCommand{peer_token, transfer_id, reason, std::move(message)});
}

uint64_t TransferService::StartPull(const std::string& source_endpoint, const std::string& source_server_key,
                                    PullRequest request) {
  Impl& s = *impl_;
  request.transfer_id = s.next_transfer_id.fetch_add(1);
  if (request.deadline_ms == 0) {
    request.deadline_ms = static_cast<uint32_t>(std::max<DurationNs>(1, s.options.default_deadline / kNsPerMs));
  }
  const uint64_t id = request.transfer_id;
  s.Queue(PullCommand{source_endpoint, source_server_key, std::move(request), s.clock->Now()});
  return id;
}

void TransferService::CancelPull(uint64_t transfer_id) { impl_->Queue(CancelCommand{transfer_id}); }

TimeNs TransferService::Now() const { return impl_->clock->Now(); }

TransferStats TransferService::Stats() const {
  std::lock_guard lock(impl_->mu);
  TransferStats out = impl_->stats;
  out.unauthorized_clients = impl_->unauthorized.load();
  return out;
}

void TransferService::Impl::Notify() {
  cv.notify_all();
  if (options.on_ready) options.on_ready();
}

void TransferService::Impl::PushResult(PullResult result) {
  {
    std::lock_guard lock(mu);
    CountPull(result);
    results_ready.push_back(std::move(result));
  }
  Notify();
}

void TransferService::Impl::CountPull(const PullResult& r) {
  SourceStats& src = stats.pulls[r.source];
  src.by_outcome[static_cast<size_t>(r.outcome)]++;
  if (r.outcome != PullOutcome::kOk) return;
  src.ok++;
  if (r.device) src.device++;
  if (r.nccl) src.nccl++;
  src.blocks += r.device ? r.device->blocks.size() : r.nccl ? r.nccl->blocks.size() : r.streamed_blocks;
  src.bytes += r.bytes;
  src.seconds += static_cast<double>(r.elapsed) / kNsPerSec;
}

void TransferService::Impl::RunCommands() {
  std::vector<Command> batch;
  {
    std::lock_guard lock(mu);
    batch.swap(commands);
  }
  for (Command& c : batch) {
    std::visit(
        [&](auto& cmd) {
          using T = std::decay_t<decltype(cmd)>;
          if constexpr (std::is_same_v<T, RefuseCommand>) {
            DoRefuse(cmd);
          } else if constexpr (std::is_same_v<T, PullCommand>) {
            DoPull(cmd);
          } else if constexpr (std::is_same_v<T, CancelCommand>) {
            DoCancel(cmd.transfer_id);
          } else if constexpr (std::is_same_v<T, ServeDeviceCommand>) {
            DoServeDevice(cmd);
          } else if constexpr (std::is_same_v<T, ServeNcclCommand>) {
            DoServeNccl(cmd);
          } else if constexpr (std::is_same_v<T, ServeFrameCommand>) {
            DoServeFrame(cmd);
          } else {
            static_assert(std::is_same_v<T, ReleaseCommand>);
            DoRelease(cmd.transfer_id);
          }
        },
        c);
  }
}

void TransferService::Impl::IoLoop() {
  std::vector<zmq::pollitem_t> items;
  std::vector<std::pair<std::string, zmq::socket_t*>> polled;  // the DEALERs behind items[2..]
  while (true) {
    const bool stop = stopping.load();
    RunCommands();
    const bool backlog = PumpServing();
    const TimeNs now = clock->Now();
    const TimeNs next_timer = CheckPullTimers(now);
    SweepOpenPulls(now);
    const bool holding = SweepHeld(now);
    ExpireLeases(now);
    if (stop) break;

    items.clear();
    polled.clear();
    items.push_back({router.handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
    // The engine has not taken the streamed blocks checked so far: replies wait in ZeroMQ's
    // queue (then TCP) until it does (TakeArrivals wakes this loop).
    bool arrivals_full;
    {
      std::lock_guard lock(mu);
      arrivals_full = arrivals_ready.size() >= config::kArrivalsAhead;
    }
    for (auto& [key, source] : sources) {
      if (arrivals_full) break;
      items.push_back({source.dealer->handle(), 0, ZMQ_POLLIN, 0});
      polled.emplace_back(key, source.dealer.get());
    }
    long timeout = config::kIdlePollMs;
    if (backlog || next_timer != 0 || holding || arrivals_full) timeout = config::kBusyPollMs;
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) Logger("transfer")->error("poll: {}", e.what());
      continue;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t drained;
      (void)!read(wake_fd, &drained, sizeof(drained));
    }
    if (items[0].revents & ZMQ_POLLIN) DrainRouter();
    for (size_t i = 0; i < polled.size(); ++i) {
      if (items[i + 2].revents & ZMQ_POLLIN) DrainDealer(polled[i].first, *polled[i].second);
    }
  }
  // Stopping: pulls this holder had not answered learn why; frames queued go out within the
  // linger; this side's own pulls end.
  RefuseAllOpen(RefusalReason::kShuttingDown, "the holder is shutting down");
  PumpServing();
  CutAllServing();
  CancelAllPulls("the transfer service stopped");
  // Commands queued since the loop's last round: a run among them was never sent.
  {
    std::lock_guard lock(mu);
    io_done = true;
    for (Command& c : commands) DropCommand(c);
    commands.clear();
  }
  Notify();
  ReleaseAllHeld();
  for (auto& [key, source] : sources) source.dealer->close();
  router.close();
}

}  // namespace kvfleet::transfer
