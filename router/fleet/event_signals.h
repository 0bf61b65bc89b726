// Adapters from the event plane (router/events, router/index) to what the fleet and the
// routing policies ask: WorkerSignals (liveness, load reports) and PrefixIndex (matches
// and predicted entries in the global index).
//
// Thread safety: as thread-safe as EventPlane and GlobalIndex, which are.
#pragma once

#include "common/log.h"
#include "router/events/event_plane.h"
#include "router/fleet/fleet.h"
#include "router/index/global_index.h"
#include "router/routing/predicted_index.h"

namespace kvfleet::router {

class EventPlaneSignals final : public WorkerSignals {
 public:
  explicit EventPlaneSignals(EventPlane* plane) : plane_(plane) {}

  void AddWorker(WorkerId id, const WorkerHello& info) override {
    if (info.events_endpoint.empty()) {
      Logger("router")->warn("worker {} announced no events endpoint: no index entries for it", info.name);
      return;
    }
    Status st = plane_->AddWorker(id, info.name, WorkerEndpoints{info.events_endpoint, info.replay_endpoint});
    if (!st.ok()) Logger("router")->warn("worker {}: event plane: {}", info.name, st.message());
  }
  void RemoveWorker(WorkerId id) override { plane_->RemoveWorker(id); }

  WorkerLiveness State(WorkerId id) const override {
    switch (plane_->State(id)) {
      case WorkerState::kSyncing: return WorkerLiveness::kSyncing;
      case WorkerState::kLive: return WorkerLiveness::kLive;
      case WorkerState::kReplaying: return WorkerLiveness::kReplaying;
      case WorkerState::kDead: return WorkerLiveness::kDead;
    }
    return WorkerLiveness::kUnknown;
  }

  std::optional<LoadReport> Load(WorkerId id) const override {
    auto load = plane_->Load(id);
    if (!load) return std::nullopt;
    LoadReport r;
    r.active_requests = load->active_requests;
    r.queued_requests = load->queued_requests;
    r.active_prefill_tokens = static_cast<double>(load->active_prefill_tokens);
    r.prefill_tokens_per_s = load->prefill_tokens_per_second;
    r.received_at = load->received_at;
    return r;
  }

 private:
  EventPlane* plane_;
};

class GlobalPrefixIndex final : public PrefixIndex {
 public:
  explicit GlobalPrefixIndex(GlobalIndex* index) : index_(index) {}

  void FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const override {
    thread_local std::vector<WorkerMatch> matches;
    matches.clear();
    index_->FindMatches(hashes, &matches);
    for (const auto& m : matches) out->push_back({m.worker, m.device_blocks, m.host_blocks});
  }
  void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) override {
    index_->InsertPredicted(worker, hashes, ttl);
  }
  void RemoveWorker(WorkerId worker) override { index_->RemoveWorker(worker); }

 private:
  GlobalIndex* index_;
};

}  // namespace kvfleet::router
