// FleetImpl's answers to the router (fleet_impl.h): what a request's model name resolves to
// and its routable workers, readiness, the /fleet view, and each worker's load and cache
// geometry. The registry they read is kept in fleet.cc.
//
// Thread safety: thread-safe, as FleetImpl.
#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "router/fleet/fleet_impl.h"

namespace kvfleet::router {

// --- the Fleet's queries ---

namespace {

bool Serves(const WorkerHello& info, std::string_view adapter) {
  return std::any_of(info.loras.begin(), info.loras.end(), [&](const LoraAnnounce& l) { return l.name == adapter; });
}

}  // namespace

std::optional<ModelFleet> FleetImpl::FindModel(std::string_view model) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = models_.find(std::string(model));
  if (it == models_.end()) return std::nullopt;
  return FleetOf(it->second, "");
}

// REQUIRES: mu_ held. The model's workers; with `adapter`, only those serving it.
ModelFleet FleetImpl::FleetOf(const ModelEntry& entry, std::string_view adapter) const {
  ModelFleet f;
  f.block_size = entry.block_size;
  f.max_context = 0;
  // The context length is the least of what the routable workers said of themselves. A listed
  // worker that has not described itself yet has only the flags' guess (--max-context, 8192 by
  // default), which refuses prompts its model takes: it counts only while no routable worker
  // has said anything (a worker older than Describe keeps the flags).
  // Each member's routing row (routing_table.h), not its record: only an adapter's needs the
  // record's Hello. While such a worker's first Describe is unanswered, the guess is marked
  // (ModelFleet::max_context_guessed): prompts over it are asked to retry, not refused.
  uint32_t guessed = 0;
  bool answer_pending = false;
  for (WorkerId id : entry.members) {
    const RoutingRow& row = table_[id];
    if (row.removed.load()) continue;
    if (!adapter.empty() && !Serves(workers_[id]->info, adapter)) continue;
    ++f.workers;
    f.needs_tokenizer = f.needs_tokenizer || row.needs_tokenizer;
    if (!Routable(id, row)) continue;
    f.routable.push_back(id);
    const bool described = row.described.load();
    answer_pending = answer_pending || (!described && row.describes_sent.load(std::memory_order_relaxed) < 2);
    uint32_t& least = described ? f.max_context : guessed;
    if (least == 0 || (row.max_context > 0 && row.max_context < least)) least = row.max_context;
  }
  if (f.max_context == 0) {
    f.max_context = guessed;
    f.max_context_guessed = guessed > 0 && answer_pending;
  }
  return f;
}

std::optional<ServedModel> FleetImpl::Resolve(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (auto it = models_.find(std::string(name)); it != models_.end()) {
    return ServedModel{FleetOf(it->second, ""), it->first, ""};
  }
  if (name.empty()) return std::nullopt;
  // An adapter that workers of several models announce: the first model (by name) with a
  // routable worker serving it.
  std::optional<ServedModel> found;
  for (const auto& [model, entry] : models_) {
    ModelFleet f = FleetOf(entry, name);
    if (f.workers == 0) continue;
    if (!found || (found->fleet.routable.empty() && !f.routable.empty())) {
      found = ServedModel{std::move(f), model, std::string(name)};
    }
  }
  return found;
}

void FleetImpl::NoteAdapter(WorkerId id, const LoraAnnounce& adapter, bool loaded) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) return;
  std::vector<LoraAnnounce>& loras = workers_[id]->info.loras;
  std::erase_if(loras, [&](const LoraAnnounce& l) { return l.name == adapter.name; });
  if (loaded) loras.push_back(adapter);
}

std::optional<double> FleetImpl::AdapterLoadSeconds(WorkerId id, uint64_t lora_id) const {
  uint64_t load_us = 0;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (Record(id) == nullptr) return std::nullopt;
    const WorkerHello& info = workers_[id]->info;
    auto it = std::find_if(info.loras.begin(), info.loras.end(),
                           [&](const LoraAnnounce& l) { return l.lora_id == lora_id; });
    if (it == info.loras.end()) return std::nullopt;
    load_us = info.lora_load_us;
  }
  // Resident only when the last report says so: without reports the router cannot tell.
  if (std::optional<WorkerLoad> load = ReportedLoad(id)) {
    const auto& resident = load->resident_loras;
    if (std::find(resident.begin(), resident.end(), lora_id) != resident.end()) return 0.0;
  }
  return static_cast<double>(load_us) / 1e6;
}

std::vector<std::string> FleetImpl::LiveModels() const {
  std::vector<std::string> out;
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (const auto& [name, m] : models_) {
    for (WorkerId id : m.members) {
      if (!workers_[id]->removed.load() && Routable(*workers_[id])) {
        out.push_back(name);
        break;
      }
    }
  }
  return out;
}

std::vector<ModelReadiness> FleetImpl::Readiness() const {
  std::vector<ModelReadiness> out;
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (const auto& [name, m] : models_) {
    ModelReadiness r{name, 0, 0};
    for (WorkerId id : m.members) {
      if (workers_[id]->removed.load()) continue;
      ++r.workers;
      // A prefill worker alone serves nothing: every request ends on a worker that decodes.
      const bool decodes = workers_[id]->info.role != WorkerRole::kPrefill;
      r.routable += decodes && Routable(*workers_[id]) ? 1 : 0;
    }
    if (r.workers > 0) out.push_back(std::move(r));
  }
  return out;
}

bool FleetImpl::Ready() const { return AnyServing(Readiness()); }

std::vector<RefusedWorker> FleetImpl::Refused() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<RefusedWorker> out;
  for (const auto& [endpoint, r] : refused_) out.push_back(r);
  return out;
}

std::vector<WorkerStatus> FleetImpl::Workers() const {
  std::vector<WorkerStatus> out;
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (const auto& w : workers_) {
    if (!w || w->removed.load()) continue;
    WorkerStatus s;
    s.id = w->id;
    s.info = w->info;
    s.connected = w->connected.load();
    s.said_bye = w->said_bye.load();
    s.state = signals_ ? signals_->State(w->id) : WorkerState::kUnknown;
    s.routable = Routable(*w);
    s.inflight_requests = w->own.requests();
    s.inflight_prefill_tokens = w->own.prefill_tokens();
    if (options_.peers != nullptr) {
      const OwnLoadCounts peers = options_.peers->Load(w->info.name);
      s.peer_inflight_requests = static_cast<int64_t>(peers.requests);
      s.peer_inflight_prefill_tokens = static_cast<int64_t>(peers.prefill_tokens);
    }
    if (signals_) s.load = signals_->Load(w->id);
    out.push_back(std::move(s));
  }
  return out;
}

bool FleetImpl::Serving(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr && !workers_[id]->removed.load() && Serving(*workers_[id]);
}

Fleet::OwnLoadCounts FleetImpl::OwnLoad(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) return {};
  return workers_[id]->own.Now();
}

Fleet::OwnLoadCounts FleetImpl::OwnLoadAt(WorkerId id, TimeNs at) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) return {};
  return workers_[id]->own.FromHistory(at);  // the history itself: Loads reads the routing row
}

std::optional<WorkerLoad> FleetImpl::ReportedLoad(WorkerId id) const {
  return signals_ ? signals_->Load(id) : std::nullopt;
}

void FleetImpl::Loads(std::span<const WorkerId> ids, std::vector<WorkerLoads::LoadView>* out) const {
  // The views are reset in place: a routing thread passes the same vector each decision, so
  // once warm it allocates nothing here and copies each report once, from the event plane.
  out->resize(ids.size());
  for (WorkerLoads::LoadView& v : *out) {
    std::vector<WorkerId> mates = std::move(v.device_mates);
    mates.clear();
    v = WorkerLoads::LoadView{};
    v.device_mates = std::move(mates);
  }
  if (signals_ != nullptr) {
    signals_->VisitLoads(ids, [out](size_t i, const WorkerLoad* load) {
      if (load != nullptr) (*out)[i].report = *load;
    });
  }
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::optional<PeerLoads::Reader> peers;  // one lock for the lot, and each worker's sums by its id
  if (options_.peers != nullptr) peers.emplace(*options_.peers);
  for (size_t i = 0; i < ids.size(); ++i) {
    WorkerLoads::LoadView& v = (*out)[i];
    if (Record(ids[i]) == nullptr) continue;
    // The worker's routing row: its record only for a report older than this router's last
    // change of its counts there (the history ring), and for its device mates.
    const RoutingRow& row = table_[ids[i]];
    const OwnLoadSlot::Snapshot own = row.own.Read();
    v.own = own.counts;
    if (v.report) {
      const TimeNs at = v.report->received_at;
      if (own.changes == 0) v.own_at_report = OwnLoadCounts{};
      else v.own_at_report = own.changed_at <= at ? own.counts : workers_[ids[i]]->own.At(at);
    }
    v.announced_prefill_rate = row.announced_prefill_rate;
    v.role = row.role;
    v.structured_outputs = row.structured_outputs;
    if (row.names_device) v.device_mates = DeviceMatesOf(*workers_[ids[i]]);
    v.transfer_format = row.transfer_format;
    v.transfer_host = row.transfer_host;
    if (peers) {
      const std::optional<TimeNs> at = v.report ? std::optional(v.report->received_at) : std::nullopt;
      peers->NowAndAt(ids[i], at, &v.peers, &v.peers_at_report);
    }
  }
}

void FleetImpl::MoveDevice(WorkerId id, const std::string& from, const std::string& to) {
  if (from == to) return;
  if (auto it = by_device_.find(from); !from.empty() && it != by_device_.end()) {
    std::erase(it->second, id);
    if (it->second.empty()) by_device_.erase(it);
  }
  if (!to.empty()) by_device_[to].push_back(id);
}

std::vector<WorkerId> FleetImpl::DeviceMatesOf(const WorkerRecord& w) const {
  std::vector<WorkerId> out;
  auto it = by_device_.find(w.info.device_id);
  if (w.info.device_id.empty() || it == by_device_.end()) return out;
  for (WorkerId id : it->second) {
    if (id == w.id || Record(id) == nullptr) continue;
    const WorkerRecord& mate = *workers_[id];
    if (!mate.removed.load() && Routable(mate)) out.push_back(id);
  }
  return out;
}

std::vector<WorkerId> FleetImpl::DeviceMates(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr ? DeviceMatesOf(*workers_[id]) : std::vector<WorkerId>{};
}

// KV blocks per routing block: a token-level worker (kv_block_size < block_size) holds
// block_size / kv_block_size of them in each.
static uint32_t PerBlock(const WorkerHello& info) {
  return info.kv_block_size > 0 && info.kv_block_size < info.block_size ? info.block_size / info.kv_block_size : 1;
}

uint64_t FleetImpl::CacheBlocks(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) return 0;
  const WorkerHello& info = workers_[id]->info;
  return (info.device_blocks + info.host_blocks) / PerBlock(info);  // counted in KV blocks
}

uint32_t FleetImpl::StoredPrefixBlocks(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  if (Record(id) == nullptr) return 0;
  const WorkerHello& info = workers_[id]->info;
  const uint32_t tokens = IndexedReuseTokens(info);
  return tokens == 0 || info.block_size == 0 ? 0 : std::max<uint32_t>(1, tokens / info.block_size);
}

std::shared_ptr<const TransferPeer> TransferPeerOf(const WorkerHello& info) {
  if (info.transfer_endpoint.empty() || info.transfer_format.empty()) return nullptr;
  return std::make_shared<const TransferPeer>(TransferPeer{info.name, info.transfer_endpoint, info.transfer_key,
                                                           info.transfer_format, info.transfer_bytes_per_block,
                                                           info.transfer_host_id});
}

void SetInfo(WorkerRecord& w, const WorkerHello& info) {
  w.info = info;
  w.transfer = TransferPeerOf(info);
  w.row.SetInfo(info, w.transfer ? TransferNameId(w.transfer->format) : 0,
                w.transfer && !w.transfer->host_id.empty() ? TransferNameId(w.transfer->host_id) : 0);
}

uint32_t TransferNameId(std::string_view name) {
  static std::mutex mu;
  static std::map<std::string, uint32_t, std::less<>> ids;  // GUARDED_BY(mu); a few formats and hosts
  std::lock_guard<std::mutex> lock(mu);
  auto it = ids.find(name);
  if (it == ids.end()) it = ids.emplace(std::string(name), static_cast<uint32_t>(ids.size() + 1)).first;
  return it->second;
}

std::optional<std::string> FleetImpl::PrefillMismatch(const ModelEntry& model, const WorkerHello& hello,
                                                      std::optional<WorkerId> self) const {
  if (hello.role != WorkerRole::kPrefill) return std::nullopt;
  if (hello.transfer_endpoint.empty() || hello.transfer_format.empty() || hello.transfer_bytes_per_block == 0) {
    return "a prefill worker (--role prefill) must serve KV transfer: decode workers pull its blocks "
           "(see the worker's --transfer and --transfer-authorized-keys)";
  }
  std::string seen;
  for (WorkerId id : model.members) {
    const WorkerRecord& w = *workers_[id];
    if ((self && id == *self) || w.removed.load() || w.info.role == WorkerRole::kPrefill || !Routable(w)) continue;
    const TransferPeer* t = w.transfer.get();
    if (t != nullptr && t->format == hello.transfer_format && t->bytes_per_block == hello.transfer_bytes_per_block) {
      return std::nullopt;
    }
    if (seen.empty()) {
      seen = t == nullptr ? w.info.name + " serves no transfer"
                          : w.info.name + " holds " + t->format + ", " + std::to_string(t->bytes_per_block) +
                                " bytes per block";
    }
  }
  if (seen.empty()) return std::nullopt;  // no live decode worker yet: judged when one is
  return "its KV blocks (" + hello.transfer_format + ", " + std::to_string(hello.transfer_bytes_per_block) +
         " bytes per block) match no live decode worker of model '" + hello.model + "' (" + seen +
         "): start both pools with the same model, --kv-cache-dtype and block size";
}

std::shared_ptr<const TransferPeer> FleetImpl::Transfer(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr ? workers_[id]->transfer : nullptr;
}

double FleetImpl::AnnouncedPrefillRate(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr ? workers_[id]->info.prefill_tokens_per_second : 0;
}

bool FleetImpl::StructuredOutputs(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr && workers_[id]->info.structured_outputs;
}

WorkerRole FleetImpl::Role(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr ? workers_[id]->info.role : WorkerRole::kBoth;
}

uint32_t FleetImpl::KvBlocksPerBlock(WorkerId id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return Record(id) != nullptr ? PerBlock(workers_[id]->info) : 1;
}


std::map<std::string, OwnLoadCounts, std::less<>> FleetImpl::OwnLoadsByName() const {
  std::map<std::string, OwnLoadCounts, std::less<>> out;
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (const auto& w : workers_) {
    if (w == nullptr || w->own.requests() <= 0) continue;
    const OwnLoadCounts now = w->own.Now();
    OwnLoadCounts& sum = out[w->info.name];
    sum.requests += now.requests;
    sum.waiting += now.waiting;
    sum.prefill_tokens += now.prefill_tokens;
    sum.prompt_tokens += now.prompt_tokens;
  }
  return out;
}

std::map<std::string, OwnLoadCounts, std::less<>> Fleet::OwnLoadsByName() const { return impl_->OwnLoadsByName(); }

std::vector<WorkerId> Fleet::DeviceMates(WorkerId worker) const { return impl_->DeviceMates(worker); }

// Peers know a worker by its name (their ids are their own): a static worker that has not
// described itself yet goes by its requests endpoint here and may go by another name there.
OwnLoadCounts Fleet::PeerLoad(WorkerId worker) const {
  OwnLoadCounts now;
  if (const PeerLoads* peers = impl_->options().peers) PeerLoads::Reader(*peers).NowAndAt(worker, std::nullopt, &now, nullptr);
  return now;
}

OwnLoadCounts Fleet::PeerLoadAt(WorkerId worker, TimeNs at) const {
  OwnLoadCounts now, then;
  if (const PeerLoads* peers = impl_->options().peers) PeerLoads::Reader(*peers).NowAndAt(worker, at, &now, &then);
  return then;
}

double Fleet::PeerWorkRate(std::string_view model) const {
  const PeerLoads* peers = impl_->options().peers;
  return peers == nullptr ? 0 : peers->WorkRate(model);
}

std::optional<PullFit> Fleet::MeasuredPulls(WorkerId receiver, std::string_view holder_endpoint) const {
  return impl_->MeasuredPulls(receiver, holder_endpoint);
}

TimeNs Fleet::LastPullFailure() const { return impl_->LastPullFailure(); }

std::map<std::string, PullFit, std::less<>> Fleet::PullFits(WorkerId worker) const { return impl_->PullFits(worker); }

}  // namespace kvfleet::router
