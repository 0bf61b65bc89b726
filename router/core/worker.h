// What every room of the router knows of a worker beyond its registry record: its dense
// id, the state of its KV event stream, its last load report, and WorkerSignals, the
// interface through which the event plane (router/events) tells the fleet (router/fleet)
// about both. One type each, from the event plane to the routing decision.
//
// Thread safety: values, and an interface whose implementations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "router/core/pull_fit.h"
#include "schema/load_report.h"
#include "schema/requests.h"

namespace kvfleet::router {

// Dense id the fleet registry gives each worker it knows.
using WorkerId = uint32_t;

namespace config {
// Worker ids are dense and small: 1024 covers a large fleet and keeps the index's per-shard
// per-worker tables (reverse lists, counters) a few MiB in all. The fleet holds at most this
// many workers at once (--max-workers) and reuses a forgotten worker's id.
constexpr WorkerId kMaxWorkers = 1024;
}  // namespace config

// A worker's KV event stream (Contract 2), as the event plane tracks it. kUnknown is last:
// the event plane's state gauges index the four stream states 0..3.
enum class WorkerState {
  kSyncing,    // asked for a snapshot; not yet in step with the worker
  kLive,       // applying batches in seq order
  kReplaying,  // a gap was seen; replaying the missing batches
  kDead,       // nothing heard for the heartbeat timeout: not routable
  kUnknown,    // no event stream (none announced, or not subscribed): judged by its connection alone
};
inline constexpr int kEventStreamStates = 4;  // kSyncing..kDead

inline const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kSyncing: return "syncing";
    case WorkerState::kLive: return "live";
    case WorkerState::kReplaying: return "replaying";
    case WorkerState::kDead: return "dead";
    case WorkerState::kUnknown: return "unknown";
  }
  return "unknown";
}

// A worker's last load report (Contract 2's Load, carried in every event batch) and when
// it arrived.
struct WorkerLoad : kvfleet::LoadReport {
  TimeNs received_at = 0;  // router monotonic clock
};

// What the event plane tells the fleet. Without one, a worker's liveness is its request
// connection alone and there are no load reports.
class WorkerSignals {
 public:
  virtual ~WorkerSignals() = default;
  // Starts following the worker's event stream (the endpoints its Hello announced).
  virtual void AddWorker(WorkerId id, const WorkerHello& info) = 0;
  virtual void RemoveWorker(WorkerId id) = 0;
  // kUnknown for a worker whose events are not followed.
  virtual WorkerState State(WorkerId id) const = 0;
  virtual std::optional<WorkerLoad> Load(WorkerId id) const = 0;
  // What worker `receiver`'s pulls from the holder at `holder_endpoint` took (its load
  // reports' Load.pulls); none: it reported none.
  virtual std::optional<PullFit> MeasuredPulls(WorkerId /*receiver*/, std::string_view /*holder_endpoint*/) const {
    return std::nullopt;
  }
  // When a worker's load report last said one of its pulls failed (this clock; 0: never).
  virtual TimeNs LastPullFailure() const { return 0; }
  // What worker `receiver`'s pulls took, by holder endpoint: empty, none reported.
  virtual std::map<std::string, PullFit, std::less<>> PullFits(WorkerId /*receiver*/) const { return {}; }
  // Calls fn(i, load) for each of `ids`, in order, with Load(ids[i]) (null: none): routing
  // reads every candidate's at once and copies each straight into its own view, so an
  // implementation with a lock takes it once for the lot. fn must not call back in.
  virtual void VisitLoads(std::span<const WorkerId> ids,
                          const std::function<void(size_t i, const WorkerLoad* load)>& fn) const {
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::optional<WorkerLoad> load = Load(ids[i]);
      fn(i, load ? &*load : nullptr);
    }
  }
};

}  // namespace kvfleet::router
