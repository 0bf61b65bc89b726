// EventPlane::Impl: the event plane behind event_plane.h. Internal to router/events:
// included only by event_plane.cc (the event thread: sockets, subscribers, the index and the
// metrics) and event_plane_api.cc (EventPlane, which forwards to it).
//
// Thread safety: as EventPlane's; members marked for the event thread are that thread's alone.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/check.h"
#include "common/curve_keys.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "common/zmq_monitor.h"
#include "common/zmq_threads.h"
#include "router/events/fault_injection.h"
#include "router/events/worker_subscriber.h"
#include "schema/event_codec.h"
#include "schema/limits.h"

#include "router/events/event_plane.h"

namespace kvfleet::router {

class EventPlane::Impl final : public WorkerSubscriber::Io {
 public:
  Impl(const EventPlaneOptions& options, Clock* clock, prometheus::Registry* metrics);
  ~Impl() override;

  // WorkerSubscriber::Io
  void RequestReplay(WorkerId worker, uint64_t epoch, uint64_t from_seq, uint64_t request_id) override;
  void OnApplied(WorkerId worker, double lag_seconds) override { m_lag_->Observe(lag_seconds); }

  struct Command {
    enum Kind { kAdd, kRemove, kNoop } kind = kNoop;
    WorkerId id = 0;
    std::string name;
    WorkerEndpoints endpoints;
    uint32_t indexed_window = 0;
  };
  void Enqueue(Command c, bool wait);

  struct View {
    WorkerState state = WorkerState::kSyncing;
    WorkerEventStats stats;
  };

  EventPlaneOptions options_;
  Clock* clock_;
  GlobalIndex index_;
  mutable std::shared_mutex view_mu_;  // the HTTP threads read views while the event thread writes
  std::unordered_map<WorkerId, View> views_;
  // By id: each worker's last load report, none without a view. GUARDED_BY(view_mu_). An array,
  // not in the views: routing reads every worker's (EventPlane::VisitLoads), a dense run of lines.
  std::vector<std::optional<WorkerLoad>> loads_ = std::vector<std::optional<WorkerLoad>>(config::kMaxWorkers);
  // By id: what its pulls took, by holder endpoint (WorkerSubscriber::pull_fits). GUARDED_BY(view_mu_).
  std::unordered_map<WorkerId, std::map<std::string, PullFit, std::less<>>> pull_fits_;
  // When any worker last reported a failed pull (0: never): routing reads the pairs' failures
  // (pull_fits_) only after one.
  std::atomic<TimeNs> last_pull_failure_{0};
  // By id: views_[id].state, kUnknown without a view. Stored under view_mu_ with views_ (SetState)
  // and read without it (EventPlane::State): a state read a moment late is one routing could
  // have read anyway.
  std::array<std::atomic<WorkerState>, config::kMaxWorkers> states_;
  // REQUIRES: view_mu_ held exclusively; id < config::kMaxWorkers.
  void SetState(WorkerId id, WorkerState state) { states_[id].store(state, std::memory_order_relaxed); }
  Status status_;  // set by the constructor
  std::atomic<size_t> replay_sockets_{0};

 private:
  struct Entry {
    WorkerId id;
    std::string name;
    WorkerEndpoints endpoints;
    uint32_t indexed_window = 0;  // as asked by AddWorker (before the override)
    zmq::socket_t dealer;
    bool reply_waiting = false;  // the dealer polled readable and has not been read empty since
    std::unique_ptr<WorkerSubscriber> sub;
    std::array<prometheus::Gauge*, kv::kNumTiers> blocks_gauge{};
    std::array<prometheus::Gauge*, kEventStreamStates> state_gauge{};
  };

  void Run();
  Status OpenSub();
  void HandleCommand(Command& c);
  // Runs queued commands in order until none is left or `until` has passed (at least one);
  // returns how many ran.
  size_t HandleCommands(TimeNs until);
  void Add(const Command& c);
  // The worker's replay DEALER, connected, and the SUB connected to its PUB.
  Status OpenSockets(Entry& e, const Command& c);
  void RetryAdds(TimeNs now);
  void Remove(WorkerId id);
  void ReceiveSub();
  void Deliver(WorkerId id, events::DecodedBatch batch);
  // Reads e's replies until none is left (returns true) or `until` has passed (at least one;
  // returns false).
  bool ReceiveReplies(Entry& e, TimeNs until);
  void Periodic(TimeNs now, bool force);
  void RefreshView(const Entry& e);
  void ExportCounters();
  void Malformed(const char* reason, const std::string& detail);

  zmq::context_t ctx_;
  zmq::socket_t sub_;
  std::unique_ptr<SocketMonitor> sub_monitor_;  // its dropped connections, counted
  bool curve_ = false;
  CurveKeyPair client_keys_;
  std::string server_public_;
  std::shared_ptr<spdlog::logger> log_ = Logger("events");
  RateLimit malformed_log_;
  // The current loop turn, for the slow-turn log.
  struct Turn {
    size_t batches = 0;
    int64_t oldest_batch_ns = 0;  // the largest age of a batch on receipt (worker wall clock)
  } turn_;
  RateLimit slow_turn_log_;

  std::unordered_map<WorkerId, std::unique_ptr<Entry>> workers_;
  std::unordered_map<std::string, WorkerId> by_topic_;
  std::unordered_set<WorkerId> touched_;
  std::vector<FaultInjector::Delivery> deliveries_;
  EventCounters counters_, exported_;
  TimeNs last_gauges_ = 0, last_sweep_ = 0, last_tick_ = 0, last_idle_drain_ = 0;
  WorkerId reply_cursor_ = 0;  // the worker whose replies the next turn reads first (or the next id)

  std::mutex cmd_mu_;
  std::condition_variable cmd_cv_;
  std::deque<Command> cmds_;
  uint64_t cmds_queued_ = 0, cmds_done_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::unordered_map<WorkerId, Command> retry_;  // adds whose sockets could not be made
  TimeNs last_retry_ = 0;
  RateLimit socket_errors_log_;

  // Metrics.
  prometheus::Family<prometheus::Counter>* f_applied_;
  prometheus::Counter *m_stored_, *m_removed_, *m_updated_, *m_cleared_;
  prometheus::Counter *m_gaps_, *m_replays_, *m_snapshots_, *m_epochs_, *m_unknown_parent_;
  prometheus::Counter* m_event_id_mismatches_;
  prometheus::Counter* m_disconnects_;
  prometheus::Family<prometheus::Counter>* f_malformed_;
  prometheus::Family<prometheus::Gauge>* f_blocks_;
  prometheus::Family<prometheus::Gauge>* f_state_;
  prometheus::Histogram* m_lag_;
};


}  // namespace kvfleet::router
