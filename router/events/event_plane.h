// EventPlane: the router's side of Contract 2. It subscribes to every worker's KV event
// PUB socket, keeps one subscriber state machine per worker, recovers lost batches through
// the worker's replay ROUTER, and folds everything into the GlobalIndex it owns.
//
// Per worker (Contract 2, schema/README.md):
//   SYNCING   asked for a snapshot; live batches are buffered, then applied in seq order
//             after the snapshot, skipping those it already covers.
//   LIVE      applies batches in seq order; duplicates and stale batches are ignored.
//   REPLAYING a gap was seen: asked for {epoch, fromSeq}; live batches are buffered; back
//             to LIVE after the replay, or to SYNCING when the worker answers with a snapshot.
//   DEAD      nothing heard for heartbeat_timeout: its blocks are dropped from the index;
//             the next batch heard from it starts SYNCING again.
//   A batch with a new epoch clears the worker's blocks and starts SYNCING.
//
// Windows: per worker, the events of one pool are indexed; others are counted and skipped.
// The pool is the one its Hello says a prefix hit is limited by (IndexedWindow,
// schema/registration.h: full attention, or for an all-windowed model such as Mistral its
// windowed pool, whose stored blocks are each sequence's first window), or
// routing_window_size for every worker when set.
//
// The plane is the fleet's WorkerSignals (router/core/worker.h): the fleet adds and removes
// workers through it and reads their stream state and load reports.
//
// Threads: one event thread owns the SUB socket, the replay DEALERs and the state
// machines, and applies to the index; AddWorker/RemoveWorker queue commands to it. The
// index is read concurrently by the routing threads.
//
// Sockets: one SUB connected to every worker's PUB (topics carry the worker's name), and one
// replay DEALER per worker. A worker whose sockets cannot be made (the socket or file limit)
// is logged and tried again each second until it is removed.
//
// Thread safety: thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "router/core/worker.h"
#include "router/index/global_index.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::router {

namespace config {
// Sockets of the event plane's context beyond one replay DEALER per worker: the SUB socket,
// and room for those a context makes on its own.
inline constexpr size_t kEventSocketHeadroom = 16;
}  // namespace config

class FaultInjector;  // router/events/fault_injection.h

struct WorkerEndpoints {
  std::string events;  // the worker's PUB, tcp://host:port
  std::string replay;  // the worker's replay ROUTER, tcp://host:port
};

// CURVE settings for the router's sockets (all optional; empty = plaintext).
struct EventPlaneCurve {
  // The router's own key pair: a file with two lines, Z85 public key then Z85 secret key
  // (common/curve_keys.h; `kvfleet keygen` writes one).
  std::string client_keypair_file;
  // The workers' server public key (Z85, one line). Workers of one fleet share a server
  // key pair in the simple deployment; per-worker keys can come from registration later.
  std::string server_public_key_file;
};

struct EventPlaneOptions {
  GlobalIndexOptions index;
  // No batch (heartbeats included) from a worker for this long: DEAD. Contract 2 default.
  DurationNs heartbeat_timeout = 3 * kNsPerSec;
  // A replay request met by this much silence is sent again.
  DurationNs replay_timeout = 2 * kNsPerSec;
  // The same for a snapshot request, whose first chunk waits for the worker's engine to take
  // the snapshot between steps (a 1 M-block cache takes a fraction of a second).
  DurationNs snapshot_timeout = 10 * kNsPerSec;
  // Live batches buffered per worker while SYNCING/REPLAYING; beyond it the oldest go
  // (and are recovered by the next replay).
  size_t max_buffered_batches = 20'000;
  // A batch whose seq is this far ahead of what the worker is known to be at is treated
  // as malformed (counted, dropped) instead of triggering a huge replay.
  uint64_t max_seq_jump = 1'000'000;
  // Set: the events of pools with this windowSize are indexed for every worker (0 = full
  // attention). Unset: each worker's announced pool (AddWorker's indexed_window).
  std::optional<uint32_t> routing_window_size;
  // ZMQ receive high-water mark of the SUB socket (messages).
  int sub_rcvhwm = 100'000;
  // Workers subscribed at once (the router's --max-workers): each costs one replay DEALER, so
  // the plane's ZeroMQ context allows this many sockets and config::kEventSocketHeadroom.
  size_t max_workers = 1024;
  EventPlaneCurve curve;
  // Set: disturbs live batches between the SUB socket and the state machines (drops,
  // duplicates, reorders). Tests set it, and so does the router's --debug-drop-events F (drops
  // only, for testing recovery against a real fleet); null otherwise.
  std::shared_ptr<FaultInjector> fault_injector;
};

// What an operator needs per worker, for /fleet.
struct WorkerEventStats {
  WorkerId id = 0;
  std::string name;
  WorkerState state = WorkerState::kSyncing;
  uint64_t epoch = 0;
  uint64_t applied_seq = 0;           // last seq folded into the index
  uint64_t last_event_id = 0;         // eventId of the last event folded in; 0 = unknown
  uint64_t batches_applied = 0;
  uint64_t gaps = 0;
  uint64_t replays = 0;
  uint64_t snapshots = 0;
  uint64_t epoch_changes = 0;
  uint64_t event_id_mismatches = 0;   // batches whose event ids did not follow on (resynced)
  uint64_t buffered_batches = 0;
  TimeNs last_heard = 0;              // router monotonic clock; 0 = never
  uint32_t indexed_window = 0;        // windowSize of the pool whose events are indexed
  double last_lag_seconds = 0;        // batch creation (worker wall clock) to apply
  std::array<uint64_t, 2> index_blocks{};  // by kv::Tier
};

class EventPlane final : public WorkerSignals {
 public:
  // Starts the event thread. REQUIRES: clock and metrics outlive the plane.
  EventPlane(const EventPlaneOptions& options, Clock* clock, prometheus::Registry* metrics);
  ~EventPlane() override;  // stops the event thread
  EventPlane(const EventPlane&) = delete;
  EventPlane& operator=(const EventPlane&) = delete;

  // Subscribes to a worker: connects to its endpoints and asks for a snapshot. Its events of
  // windowSize indexed_window are indexed (routing_window_size, when set, overrides it).
  // Idempotent: the same id with the same name, endpoints and window is a no-op; a change
  // resubscribes. REQUIRES: id < config::kMaxWorkers.
  Status AddWorker(WorkerId id, const std::string& worker_name, const WorkerEndpoints& endpoints,
                   uint32_t indexed_window = 0);
  // WorkerSignals: AddWorker above with the endpoints and IndexedWindow of the worker's Hello. A worker that
  // announced no events endpoint, or whose endpoints are refused, is logged and skipped:
  // its state stays kUnknown and it gets no index entries.
  void AddWorker(WorkerId id, const WorkerHello& info) override;
  // Unsubscribes and drops the worker's blocks from the index.
  void RemoveWorker(WorkerId id) override;

  // kUnknown for a worker not subscribed to (never added, refused, or removed). Takes no
  // lock: routing asks it of every worker of a model per decision (Fleet::Resolve).
  WorkerState State(WorkerId id) const override;
  std::optional<WorkerLoad> Load(WorkerId id) const override;
  std::optional<PullFit> MeasuredPulls(WorkerId receiver, std::string_view holder_endpoint) const override;
  TimeNs LastPullFailure() const override;
  std::map<std::string, PullFit, std::less<>> PullFits(WorkerId receiver) const override;
  void VisitLoads(std::span<const WorkerId> ids,
                  const std::function<void(size_t i, const WorkerLoad* load)>& fn) const override;
  std::vector<WorkerEventStats> Stats() const;

  const GlobalIndex& index() const;
  GlobalIndex& index();

  // Blocks until every queued command has been taken by the event thread (tests).
  void Sync();
  // Ok, unless the plane's SUB socket could not be made (the router then exits with it).
  Status status() const;
  // Workers with a replay DEALER open (tests: sockets are closed when a worker is removed).
  size_t replay_sockets() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfleet::router
