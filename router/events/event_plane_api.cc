// EventPlane: the public face of the event plane, forwarding to its Impl (event_plane_impl.h).
#include "router/events/event_plane_impl.h"

namespace kvfleet::router {

namespace {

bool ValidEndpoint(const std::string& e) {
  return e.rfind("tcp://", 0) == 0 || e.rfind("ipc://", 0) == 0 || e.rfind("inproc://", 0) == 0;
}

}  // namespace

// ---- EventPlane ------------------------------------------------------------------------

EventPlane::EventPlane(const EventPlaneOptions& options, Clock* clock, prometheus::Registry* metrics)
    : impl_(std::make_unique<Impl>(options, clock, metrics)) {}

EventPlane::~EventPlane() = default;

Status EventPlane::AddWorker(WorkerId id, const std::string& worker_name, const WorkerEndpoints& endpoints,
                             uint32_t indexed_window) {
  if (id >= config::kMaxWorkers) return InvalidArgument("worker id " + std::to_string(id) + " >= kMaxWorkers");
  if (worker_name.empty() || worker_name.size() > events::config::kMaxWorkerIdBytes)
    return InvalidArgument("worker name must be 1..256 bytes");
  if (!ValidEndpoint(endpoints.events) || !ValidEndpoint(endpoints.replay))
    return InvalidArgument("worker " + worker_name + ": endpoints must be tcp://, ipc:// or inproc:// addresses");
  Impl::Command c;
  c.kind = Impl::Command::kAdd;
  c.id = id;
  c.name = worker_name;
  c.endpoints = endpoints;
  c.indexed_window = indexed_window;
  impl_->Enqueue(std::move(c), /*wait=*/false);
  {
    // Visible as SYNCING at once, so callers can route around it until it is LIVE.
    std::lock_guard lock(impl_->view_mu_);
    auto& v = impl_->views_[id];
    v.stats.id = id;
    v.stats.name = worker_name;
    impl_->SetState(id, v.state);
  }
  return Status::Ok();
}

void EventPlane::AddWorker(WorkerId id, const WorkerHello& info) {
  if (info.events_endpoint.empty()) {
    Logger("router")->warn("worker {} announced no events endpoint: no index entries for it", info.name);
    return;
  }
  Status st = AddWorker(id, info.name, WorkerEndpoints{info.events_endpoint, info.replay_endpoint}, IndexedWindow(info));
  if (!st.ok()) Logger("router")->warn("worker {}: event plane: {}", info.name, st.message());
}

void EventPlane::RemoveWorker(WorkerId id) {
  Impl::Command c;
  c.kind = Impl::Command::kRemove;
  c.id = id;
  impl_->Enqueue(std::move(c), /*wait=*/true);
}

WorkerState EventPlane::State(WorkerId id) const {
  return id < config::kMaxWorkers ? impl_->states_[id].load(std::memory_order_relaxed) : WorkerState::kUnknown;
}

std::optional<WorkerLoad> EventPlane::Load(WorkerId id) const {
  if (id >= config::kMaxWorkers) return std::nullopt;
  std::shared_lock lock(impl_->view_mu_);
  return impl_->loads_[id];
}

std::map<std::string, PullFit, std::less<>> EventPlane::PullFits(WorkerId receiver) const {
  std::shared_lock lock(impl_->view_mu_);
  auto it = impl_->pull_fits_.find(receiver);
  return it == impl_->pull_fits_.end() ? std::map<std::string, PullFit, std::less<>>{} : it->second;
}

TimeNs EventPlane::LastPullFailure() const { return impl_->last_pull_failure_.load(std::memory_order_relaxed); }

std::optional<PullFit> EventPlane::MeasuredPulls(WorkerId receiver, std::string_view holder_endpoint) const {
  std::shared_lock lock(impl_->view_mu_);
  auto worker = impl_->pull_fits_.find(receiver);
  if (worker == impl_->pull_fits_.end()) return std::nullopt;
  auto fit = worker->second.find(holder_endpoint);
  if (fit == worker->second.end()) return std::nullopt;
  return fit->second;
}

void EventPlane::VisitLoads(std::span<const WorkerId> ids,
                            const std::function<void(size_t i, const WorkerLoad* load)>& fn) const {
  std::shared_lock lock(impl_->view_mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::optional<WorkerLoad>* load = ids[i] < config::kMaxWorkers ? &impl_->loads_[ids[i]] : nullptr;
    fn(i, load == nullptr || !*load ? nullptr : &**load);
  }
}

std::vector<WorkerEventStats> EventPlane::Stats() const {
  std::vector<WorkerEventStats> out;
  std::shared_lock lock(impl_->view_mu_);
  for (const auto& [id, v] : impl_->views_) out.push_back(v.stats);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

const GlobalIndex& EventPlane::index() const { return impl_->index_; }
GlobalIndex& EventPlane::index() { return impl_->index_; }

void EventPlane::Sync() { impl_->Enqueue(Impl::Command{}, /*wait=*/true); }
Status EventPlane::status() const { return impl_->status_; }
size_t EventPlane::replay_sockets() const { return impl_->replay_sockets_.load(); }
}  // namespace kvfleet::router
