// The Fleet (fleet.h) and most of FleetImpl (fleet_impl.h): start and stop, the registry
// of workers and models, and the fleet thread's loop. Registrations and DNS answers, which
// the loop hands over, are in fleet_membership.cc; the queries the router makes in
// fleet_queries.cc; the DEALERs to the workers and their monitors in fleet_connections.cc.
//
// Thread safety: thread-safe, as FleetImpl.
#include "router/fleet/fleet.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <variant>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <zmq.h>
#include <zmq.hpp>

#include "common/check.h"
#include "common/curve_keys.h"
#include "common/log.h"
#include "common/tokenizer_files.h"
#include "common/zmq_threads.h"
#include "router/fleet/discovery.h"
#include "router/fleet/fleet_impl.h"
#include "router/fleet/lane.h"
#include "router/fleet/poll_loop.h"
#include "schema/limits.h"

namespace kvfleet::router {

FleetImpl::FleetImpl(const FleetOptions& options, WorkerSignals* signals, const Clock* clock,
                     prometheus::Registry* registry)
    : options_(options), signals_(signals), clock_(clock) {
  if (registry != nullptr) {
    retries_ = &prometheus::BuildCounter()
                    .Name("kvfleet_router_retries_total")
                    .Help("Requests retried on another worker before their first token")
                    .Register(*registry)
                    .Add({});
    inflight_family_ = &prometheus::BuildGauge()
                            .Name("kvfleet_router_inflight")
                            .Help("Requests this router has in flight, per worker")
                            .Register(*registry);
    refused_family_ = &prometheus::BuildCounter()
                           .Name("kvfleet_router_workers_refused_total")
                           .Help("Worker registrations refused, by reason")
                           .Register(*registry);
  }
}

Status FleetImpl::Init() {
  const FleetCurve& curve = options_.curve;
  if (curve.client_keypair_file.empty() != curve.server_public_key_file.empty()) {
    return InvalidArgument("request CURVE needs both the router's key pair and the workers' public key");
  }
  if (!curve.client_keypair_file.empty()) {
    KVF_ASSIGN_OR_RETURN(curve_keys_, LoadCurveKeyPair(curve.client_keypair_file));
    KVF_ASSIGN_OR_RETURN(curve_server_public_, LoadCurvePublicKey(curve.server_public_key_file));
    curve_ = true;
  }
  if (options_.max_workers == 0 || options_.max_workers > config::kMaxWorkers) {
    return InvalidArgument("max workers must be 1.." + std::to_string(config::kMaxWorkers) + " (the index's)");
  }
  // Before the first socket, which fixes the context's limit.
  KVF_ASSIGN_OR_RETURN(const size_t max_sockets, SetMaxSockets(ctx_, options_.MaxSockets()));
  if (max_sockets < options_.MaxSockets()) {
    Logger("fleet")->warn("ZeroMQ allows {} sockets, not the {} that {} workers over {} lanes need", max_sockets,
                          options_.MaxSockets(), options_.max_workers, options_.lanes);
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal("eventfd failed");
  KVF_RETURN_IF_ERROR(BindRegistration());
  if (registration_.bound()) sockets_open_.fetch_add(1);
  for (const StaticFleet& fleet : options_.AllStaticFleets()) {
    for (const auto& ep : fleet.workers) AddOrUpdate(StaticHello(ep, fleet), HelloSource::kListed);
    for (const auto& name : fleet.dns_names) dns_sources_.push_back(DnsSource{fleet, name, {}});
  }
  thread_ = std::thread([this] { Loop(); });
  for (size_t i = 0; i < dns_sources_.size(); ++i) {
    dns_.push_back(std::make_unique<DnsWatcher>(dns_sources_[i].name, options_.dns_interval,
                                                [this, i](std::vector<std::string> answer) {
                                                  Post(DnsCmd{i, std::move(answer)});
                                                }));
  }
  return Status::Ok();
}

void FleetImpl::Stop() {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    if (stopping_) return;
    stopping_ = true;
    stopping_flag_.store(true);
  }
  own_lane_.Stop();  // Fleet::Submit's lane ends what it has in flight, on its own thread
  Wake();
  if (thread_.joinable()) thread_.join();
  dns_.clear();  // joins the resolver threads
  if (wake_fd_ >= 0) ::close(wake_fd_);
  wake_fd_ = -1;
}

// --- LaneFleet ---

std::vector<LaneFleet::WorkerEndpoint> FleetImpl::Endpoints() const {
  std::vector<WorkerEndpoint> out;
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (const auto& w : workers_) {
    if (w && !w->removed.load()) out.push_back({w->id, w->info.requests_endpoint});
  }
  return out;
}

bool FleetImpl::Routable(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr && !workers_[id]->removed.load() && Routable(*workers_[id]);
}

uint64_t FleetImpl::Failures(WorkerId id, std::string* why) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) {
    // Forgotten: every request sent there is lost, and a worker given its id since counts on.
    auto retired = retired_failures_.find(id);
    if (why != nullptr) *why = "worker forgotten";
    return retired == retired_failures_.end() ? 0 : retired->second;
  }
  if (why != nullptr) *why = workers_[id]->last_failure;
  return workers_[id]->failures.load();
}

void FleetImpl::CountInflight(WorkerId id, const OwnLoadDelta& delta) {
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (Record(id) == nullptr) return;
    WorkerRecord& w = *workers_[id];
    if (delta.requests != 0 && w.inflight_gauge) w.inflight_gauge->Increment(static_cast<double>(delta.requests));
    w.own.Add(clock_, delta);
  }
  if (options_.on_own_load_change) options_.on_own_load_change(delta.requests > 0);
}

void FleetImpl::CountRetry() {
  if (retries_) retries_->Increment();
}

std::string FleetImpl::WorkerName(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr ? workers_[id]->info.name : std::string();
}

// --- internals ---

bool FleetImpl::Routable(WorkerId id, const RoutingRow& row) const {
  if (row.said_bye.load(std::memory_order_relaxed) || !row.connected.load(std::memory_order_relaxed)) return false;
  return !row.refused.load(std::memory_order_relaxed) && (signals_ == nullptr || signals_->State(id) != WorkerState::kDead);
}

bool FleetImpl::Serving(const WorkerRecord& w) const {
  if (!w.connected.load(std::memory_order_relaxed) || w.refused.load(std::memory_order_relaxed)) return false;
  return signals_ == nullptr || signals_->State(w.id) != WorkerState::kDead;
}

void FleetImpl::Post(Command cmd) {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    commands_.push_back(std::move(cmd));
  }
  Wake();
}

void FleetImpl::Wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
}

// --- registry (fleet thread, or Init before the thread starts) ---

// Returns the worker's id, or nullopt when refused. A kListed Hello is a guess from the
// router's flags: it is refused only when the fleet is full (max_workers), and never
// overrides what a worker said of itself.
std::optional<WorkerId> FleetImpl::AddOrUpdate(const WorkerHello& hello, HelloSource source) {
  const bool listed = source == HelloSource::kListed;
  // A worker id names the worker in response headers, logs, metric labels and event topics.
  const bool control = std::any_of(hello.name.begin(), hello.name.end(),
                                   [](unsigned char c) { return c < 0x20 || c == 0x7f; });
  if (hello.name.empty() || hello.name.size() > config::kMaxWorkerNameBytes || control) {
    Refuse(hello, "invalid-name",
           "worker id must be 1 to " + std::to_string(config::kMaxWorkerNameBytes) + " bytes without control characters");
    return std::nullopt;
  }
  if (!IsValidBlockSize(hello.block_size)) {
    Refuse(hello, "invalid-block-size", "block size " + std::to_string(hello.block_size) +
                                            " is not a power of two");
    return std::nullopt;
  }
  if (hello.max_context > wire::limits::kMaxContextTokens) {
    Refuse(hello, "context-too-long",
           "max context " + std::to_string(hello.max_context) + " exceeds the " +
               std::to_string(wire::limits::kMaxContextTokens) + " tokens a request frame carries");
    return std::nullopt;
  }
  if (hello.requests_endpoint.empty()) {
    Refuse(hello, "no-endpoint", "it announced no requests endpoint");
    return std::nullopt;
  }
  // Tokenizer: a worker whose model reads token ids differently would answer garbage. Zero
  // on either side is "unknown" (the byte codec, a mock, a static entry): no comparison.
  const uint64_t ours = options_.TokenizerDigestFor(hello.model);
  if (ours != 0 && hello.tokenizer_digest != 0 && hello.tokenizer_digest != ours) {
    if (source == HelloSource::kRegistered) Withdraw(hello.requests_endpoint);  // a listed one stays, asked again
    Refuse(hello, "tokenizer-mismatch",
           "tokenizer digest " + DigestHex(hello.tokenizer_digest) + " differs from the router's " +
               DigestHex(ours) + " for model '" + hello.model +
               "' (start the worker and the router on the same model directory)");
    return std::nullopt;
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (!listed) refused_.erase(hello.requests_endpoint);
  auto& model = models_[hello.model];
  auto existing = by_endpoint_.find(hello.requests_endpoint);
  if (existing == by_endpoint_.end() && records_ >= options_.max_workers) {
    lock.unlock();
    // A worker gone but not yet forgotten yields its place: a fleet that replaces its pods
    // (new addresses each time) must not refuse the new ones for the old ones' grace.
    if (ForgetLongestGone()) return AddOrUpdate(hello, source);
    Refuse(hello, "max-workers",
           "the router already knows " + std::to_string(options_.max_workers) +
               " workers, none of them gone (--max-workers)");
    return std::nullopt;
  }
  // Block size: every member of a model's fleet that said its own must agree (Contract 1).
  if (model.block_size != 0 && model.block_size != hello.block_size && !listed) {
    bool others_live = false;
    for (WorkerId id : model.members) {
      const WorkerRecord& w = *workers_[id];
      if (existing != by_endpoint_.end() && id == existing->second) continue;
      others_live = others_live || (!w.removed.load() && w.described.load() && Routable(w));
    }
    if (others_live) {
      lock.unlock();
      Refuse(hello, "block-size-mismatch",
             "block size " + std::to_string(hello.block_size) + " disagrees with model '" + hello.model +
                 "' whose fleet uses " + std::to_string(model.block_size));
      return std::nullopt;
    }
  }
  std::optional<WorkerId> self;
  if (existing != by_endpoint_.end()) self = existing->second;
  if (std::optional<std::string> why = PrefillMismatch(model, hello, self); why && !listed) {
    lock.unlock();
    Refuse(hello, "kv-layout-mismatch", *why);
    return std::nullopt;
  }
  if (!listed || model.block_size == 0) model.block_size = hello.block_size;
  if (existing != by_endpoint_.end()) return UpdateRecord(lock, *workers_[existing->second], model, hello, source);
  return AddRecord(lock, model, hello, source);
}

// A new record for `hello`, a member of `model`. REQUIRES: `lock` holds mu_, and the fleet
// has room (records_ < max_workers); released on return.
WorkerId FleetImpl::AddRecord(std::unique_lock<std::shared_mutex>& lock, ModelEntry& model, const WorkerHello& hello,
                              HelloSource source) {
  const bool listed = source == HelloSource::kListed;
  const WorkerId id = TakeId();
  auto record = std::make_unique<WorkerRecord>(id, table_[id]);
  SetInfo(*record, hello);
  MoveDevice(record->id, "", hello.device_id);
  if (listed) record->listed = hello;
  record->from_static = source != HelloSource::kRegistered;
  record->described = !listed;
  if (inflight_family_ != nullptr) record->inflight_gauge = &inflight_family_->Add({{"worker", hello.name}});
  if (source == HelloSource::kRegistered) record->last_hello = clock_->Now();
  if (auto retired = retired_failures_.find(record->id); retired != retired_failures_.end()) {
    record->failures = retired->second + 1;  // past what lanes saw of the id's last worker
    retired_failures_.erase(retired);
  }
  WorkerRecord* w = record.get();
  if (options_.peers != nullptr) options_.peers->NameWorker(w->id, hello.name);
  workers_[w->id] = std::move(record);
  ++records_;
  by_endpoint_[hello.requests_endpoint] = w->id;
  model.members.push_back(w->id);
  lock.unlock();
  (void)Connect(*w);  // on failure, tried again at a later tick
  Logger("fleet")->info("worker {} joined: model {}, block size {}, requests {}", hello.name, hello.model,
                        hello.block_size, hello.requests_endpoint);
  if (signals_) signals_->AddWorker(w->id, hello);
  return w->id;
}

// The Hello of the worker already recorded as `w`, a member of `model`. REQUIRES: `lock`
// holds mu_; released on return.
WorkerId FleetImpl::UpdateRecord(std::unique_lock<std::shared_mutex>& lock, WorkerRecord& w, ModelEntry& model,
                                 const WorkerHello& hello, HelloSource source) {
  auto log = Logger("fleet");
  const bool listed = source == HelloSource::kListed;
  if (listed) w.listed = hello;
  // A listed entry's guess is kept only until the worker says what it is.
  const WorkerHello merged = listed && w.described.load() ? w.info : hello;
  // A new epoch alone is the event plane's business (it resyncs); a new name (the events'
  // topic), endpoints, model, block size or indexed pool make this a different worker to it.
  bool changed = w.info.model != merged.model || w.info.name != merged.name ||
                 w.info.events_endpoint != merged.events_endpoint ||
                 w.info.replay_endpoint != merged.replay_endpoint || w.info.block_size != merged.block_size ||
                 w.info.kv_block_size != merged.kv_block_size || IndexedWindow(w.info) != IndexedWindow(merged) ||
                 w.removed.load();
  if (w.described.load() && w.info.epoch != hello.epoch && !listed) {
    log->info("worker {} restarted (epoch {})", hello.name, hello.epoch);
  }
  if (w.info.model != merged.model) {
    auto& old = models_[w.info.model].members;
    std::erase(old, w.id);
    model.members.push_back(w.id);
  }
  bool readded = w.removed.exchange(false);
  if (readded) model.members.push_back(w.id);
  if (!listed && w.info.loras != hello.loras) {
    std::string names;
    for (const LoraAnnounce& l : hello.loras) names += (names.empty() ? "" : ", ") + l.name;
    log->info("worker {} serves LoRA adapters [{}]", hello.name, names);
  }
  MoveDevice(w.id, w.info.device_id, merged.device_id);
  if (options_.peers != nullptr && w.info.name != merged.name) options_.peers->NameWorker(w.id, merged.name);
  SetInfo(w, merged);
  w.said_bye = false;
  if (!listed) w.described = true;
  if (source == HelloSource::kRegistered) {
    w.from_static = false;
    w.last_hello = clock_->Now();
  }
  WorkerId id = w.id;
  lock.unlock();
  if (readded && !w.dealer) (void)Connect(w);
  if (changed) {
    log->info("worker {} ({}) {}: model {}, block size {}, max context {}", merged.name, merged.requests_endpoint,
              source == HelloSource::kDescribed ? "described itself" : "re-registered", merged.model,
              merged.block_size, merged.max_context);
    if (signals_) {
      signals_->RemoveWorker(id);
      signals_->AddWorker(id, merged);
    }
  }
  return id;
}

WorkerId FleetImpl::TakeId() {
  if (!free_ids_.empty()) return free_ids_.extract(free_ids_.begin()).value();
  workers_.emplace_back();
  return static_cast<WorkerId>(workers_.size() - 1);
}

void FleetImpl::Refuse(const WorkerHello& hello, const std::string& reason, const std::string& why) {
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    refused_[hello.requests_endpoint] = RefusedWorker{hello, reason, why};
    refused_at_[hello.requests_endpoint] = clock_->Now();
  }
  if (refused_family_ != nullptr) refused_family_->Add({{"reason", reason}}).Increment();
  // Registrations repeat every few seconds: log each (worker, reason) once.
  if (refusals_logged_.insert(hello.requests_endpoint + "|" + reason).second) {
    Logger("fleet")->warn("refusing worker {} ({}): {}", EscapeForLog(hello.name), EscapeForLog(hello.requests_endpoint),
                          why);
  }
}

void FleetImpl::Withdraw(const std::string& endpoint) {
  WorkerRecord* w = nullptr;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    auto it = by_endpoint_.find(endpoint);
    if (it == by_endpoint_.end() || workers_[it->second]->removed.load()) return;
    w = workers_[it->second].get();
    w->removed = true;
    std::erase(models_[w->info.model].members, w->id);
  }
  FailWorker(w->id, Unavailable("worker " + w->info.name + " was refused"));
  Disconnect(*w);
  if (signals_) signals_->RemoveWorker(w->id);
}

// --- the loop (the DEALERs' monitors are drained in fleet_connections.cc) ---

// The poll set: the wake eventfd and the registration socket. Monitor sockets are not
// polled but drained each tick: connect and disconnect are noticed within one tick
// (20 ms by default), and the lanes check failures at their own ticks.
void FleetImpl::Loop() {
  TimeNs next_tick = clock_->Now();
  const bool registration = registration_.bound();
  zmq::pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                              {registration ? registration_.socket().handle() : nullptr, registration ? 0 : -1,
                               static_cast<short>(registration ? ZMQ_POLLIN : 0), 0}};
  while (true) {
    {
      std::lock_guard<std::mutex> lock(cmd_mu_);
      if (stopping_) break;
    }
    long timeout_ms = std::max<long>(1, static_cast<long>((next_tick - clock_->Now()) / kNsPerMs));
    if (zmq_poll(items, 2, timeout_ms) < 0) continue;
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof(v));
    }
    DrainCommands();
    if (registration && (items[1].revents & ZMQ_POLLIN)) {
      registration_.Drain([this](const ToRouterMessage& m, const RegistrationPeer& p) { OnRegistration(m, p); });
    }
    if (clock_->Now() >= next_tick) {
      DrainMonitors();
      RetryConnects();
      ForgetGone();
      next_tick = clock_->Now() + options_.tick;
    }
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (auto& w : workers_) {
    if (w) Disconnect(*w);
  }
  registration_.Close();
}

void FleetImpl::DrainCommands() {
  std::deque<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds.swap(commands_);
  }
  for (auto& cmd : cmds) {
    if (auto* d = std::get_if<DnsCmd>(&cmd)) ApplyDns(d->source, d->endpoints);
  }
}

// The requests the lanes have on worker `id` are lost: they fail over at the lanes' next
// tick (LaneFleet::Failures).
void FleetImpl::FailWorker(WorkerId id, const Status& why) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) return;
  workers_[id]->last_failure = std::string(why.message());
  workers_[id]->failures.fetch_add(1);
}

std::vector<StaticFleet> FleetOptions::AllStaticFleets() const {
  std::vector<StaticFleet> out;
  if (!static_workers.empty() || !dns_name.empty()) {
    StaticFleet flat;
    flat.model = static_model;
    flat.block_size = static_block_size;
    flat.max_context = static_max_context;
    flat.workers = static_workers;
    if (!dns_name.empty()) flat.dns_names.push_back(dns_name);
    out.push_back(std::move(flat));
  }
  out.insert(out.end(), static_fleets.begin(), static_fleets.end());
  return out;
}

Fleet::Fleet(std::unique_ptr<FleetImpl> impl) : impl_(std::move(impl)) {}
Fleet::~Fleet() { Stop(); }

Result<std::unique_ptr<Fleet>> Fleet::Start(const FleetOptions& options, WorkerSignals* signals, const Clock* clock,
                                            prometheus::Registry* registry) {
  if (options.max_attempts < 1) return InvalidArgument("max attempts must be >= 1");
  if (options.request_timeout <= 0 || options.first_token_timeout <= 0) {
    return InvalidArgument("request timeouts must be positive");
  }
  auto impl = std::make_unique<FleetImpl>(options, signals, clock, registry);
  KVF_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Fleet>(new Fleet(std::move(impl)));
}

void Fleet::Stop() { impl_->Stop(); }
uint64_t Fleet::NewHandle() { return impl_->NewHandle(); }
void Fleet::Submit(uint64_t handle, ForwardRequest request) { impl_->Submit(handle, std::move(request)); }
void Fleet::Cancel(uint64_t handle) { impl_->Cancel(handle); }
std::unique_ptr<Lane> Fleet::NewLane(LaneLoop* loop) { return impl_->NewLane(loop); }
std::optional<ModelFleet> Fleet::FindModel(std::string_view model) const { return impl_->FindModel(model); }
std::optional<ServedModel> Fleet::Resolve(std::string_view name) const { return impl_->Resolve(name); }
void Fleet::NoteAdapter(WorkerId worker, const LoraAnnounce& adapter, bool loaded) {
  impl_->NoteAdapter(worker, adapter, loaded);
}
std::optional<double> Fleet::AdapterLoadSeconds(WorkerId worker, uint64_t lora_id) const {
  return impl_->AdapterLoadSeconds(worker, lora_id);
}
std::vector<std::string> Fleet::LiveModels() const { return impl_->LiveModels(); }
std::vector<ModelReadiness> Fleet::Readiness() const { return impl_->Readiness(); }
bool Fleet::Ready() const { return impl_->Ready(); }
std::vector<WorkerStatus> Fleet::Workers() const { return impl_->Workers(); }
std::vector<RefusedWorker> Fleet::Refused() const { return impl_->Refused(); }
Fleet::OwnLoadCounts Fleet::OwnLoad(WorkerId worker) const { return impl_->OwnLoad(worker); }
Fleet::OwnLoadCounts Fleet::OwnLoadAt(WorkerId worker, TimeNs at) const { return impl_->OwnLoadAt(worker, at); }
std::optional<WorkerLoad> Fleet::ReportedLoad(WorkerId worker) const { return impl_->ReportedLoad(worker); }
void Fleet::Loads(std::span<const WorkerId> workers, std::vector<LoadView>* out) const { impl_->Loads(workers, out); }
uint64_t Fleet::CacheBlocks(WorkerId worker) const { return impl_->CacheBlocks(worker); }
uint32_t Fleet::KvBlocksPerBlock(WorkerId worker) const { return impl_->KvBlocksPerBlock(worker); }
std::shared_ptr<const TransferPeer> Fleet::Transfer(WorkerId worker) const { return impl_->Transfer(worker); }
double Fleet::AnnouncedPrefillRate(WorkerId worker) const { return impl_->AnnouncedPrefillRate(worker); }
WorkerRole Fleet::Role(WorkerId worker) const { return impl_->Role(worker); }
bool Fleet::StructuredOutputs(WorkerId worker) const { return impl_->StructuredOutputs(worker); }
bool Fleet::Routable(WorkerId worker) const { return impl_->Routable(worker); }
uint32_t Fleet::StoredPrefixBlocks(WorkerId worker) const { return impl_->StoredPrefixBlocks(worker); }
std::string Fleet::WorkerName(WorkerId worker) const { return impl_->WorkerName(worker); }
std::string Fleet::registration_endpoint() const { return impl_->registration_endpoint(); }
size_t Fleet::SocketsOpen() const { return impl_->SocketsOpen(); }
size_t Fleet::Records() const { return impl_->Records(); }

}  // namespace kvfleet::router
