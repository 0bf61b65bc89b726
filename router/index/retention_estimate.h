// RetentionEstimate: how soon each worker will evict a block it caches, from its KV events.
//
// The GlobalIndex feeds it every event batch it applies (GlobalIndex::Apply, on the event
// thread): a store on the device tier records the block at its retention priority (Contract
// 2's StoredBlock.priority), a priority update moves it to another priority, and a removal
// from the device tier (eviction, or an offload to the host) counts as one eviction at the
// block's priority. Per worker and priority p it keeps the blocks held at p, n_p, and the
// rate at which blocks of p leave the device, r_p (blocks/s, exponentially decayed over
// config::kEvictionRateWindowSeconds). Routing (routing/README.md, "Retention-aware
// routing") asks it which share of a worker's matched prefix will still be cached when a
// request's prefill starts:
//   1. A worker evicts by priority, then LRU within a priority (worker/kv), so the blocks of
//      p turn over in L_p = n_p / r_p seconds: a block of p lives about L_p once stored. A
//      priority nothing is evicted at (r_p = 0: a pinned system prompt) lives for ever.
//   2. Block i of the prefix survives a wait of h seconds with probability
//      s_i = exp(−h / L_{p_i}) (evictions as a Poisson stream, position in the LRU unknown).
//   3. The prefix is usable up to its first lost block, so the expected usable blocks are
//      Σ_i min_{j≤i} s_j.
//   4. A worker with more unused blocks than the wait will allocate evicts nothing before
//      the request runs: every block survives.
//
// It tracks nothing until Enable(): a hash map entry per device block and a mutex per
// batch are a cost on the event thread that only kv_retention should pay. The router enables
// it at start when kv_retention is its policy, else with the first request that asks for it;
// blocks stored before then count at the default priority and their removals are ignored.
//
// Invariants (CheckInvariants() asserts them):
//   1. For every worker, Σ_p n_p equals the number of tracked (block, worker) pairs.
//   2. Every tracked pair has a priority in 0..kv::kMaxPriority.
//
// Thread safety: thread-safe (one mutex; the event thread writes, routing threads read).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>

#include <boost/unordered/unordered_flat_map.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "router/core/worker.h"
#include "router/index/global_index.h"
#include "schema/kv_event.h"

namespace kvfleet::router {

namespace config {
// The eviction rate's memory: 10 s spans many engine steps (tens of evictions a second under
// pressure) yet follows a change of load within a few seconds of a routing decision.
inline constexpr double kEvictionRateWindowSeconds = 10.0;
}  // namespace config

class RetentionEstimate {
 public:
  // REQUIRES: clock outlives the estimate; rate_window_s > 0.
  explicit RetentionEstimate(const Clock* clock, double rate_window_s = config::kEvictionRateWindowSeconds);

  // Starts tracking (see above). Idempotent; cheap enough to call per request.
  void Enable() { enabled_.store(true, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Folds one batch of `worker`'s block changes (the GlobalIndex's ops), in order. Does
  // nothing until Enable().
  void Apply(WorkerId worker, std::span<const BlockOp> ops);
  // Forgets the worker (gone, or its cache cleared).
  void RemoveWorker(WorkerId worker);

  // The priority of a block `worker` holds on its device tier; kv::kDefaultPriority when it
  // is not tracked (a predicted entry, or a block the events never stored).
  uint8_t Priority(WorkerId worker, BlockHash hash) const;
  // Blocks `worker` holds on its device tier at `priority`, and in all.
  uint64_t Held(WorkerId worker, uint8_t priority) const;
  uint64_t Held(WorkerId worker) const;
  // Blocks of `priority` leaving `worker`'s device tier per second, decayed to now.
  double EvictionRate(WorkerId worker, uint8_t priority) const;
  // Seconds a block of `priority` stays cached on `worker` (1. above); +inf when none of
  // that priority is being evicted.
  double Lifetime(WorkerId worker, uint8_t priority) const;
  // The expected leading blocks of `matched` (the worker's matched prefix) still cached
  // after `horizon_s` seconds (2.–4. above). `spare_blocks`: blocks the worker can allocate
  // without evicting; `demand_blocks`: what it will allocate within the horizon.
  double ExpectedSurvivingBlocks(WorkerId worker, std::span<const BlockHash> matched, double horizon_s,
                                 double spare_blocks, double demand_blocks) const;

  void CheckInvariants() const;

 private:
  struct Rate {
    double per_s = 0;   // at `at`
    TimeNs at = 0;
  };
  struct WorkerBlocks {
    boost::unordered_flat_map<BlockHash, uint8_t> priority;  // device-tier blocks
    std::array<uint64_t, kv::kMaxPriority + 1> held{};
    std::array<Rate, kv::kMaxPriority + 1> evicted{};
  };
  double RateLocked(const WorkerBlocks& w, uint8_t priority, TimeNs now) const;
  double LifetimeLocked(const WorkerBlocks& w, uint8_t priority, TimeNs now) const;
  void Evicted(WorkerBlocks* w, uint8_t priority, TimeNs now);

  const Clock* clock_;
  const double window_s_;
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::unordered_map<WorkerId, WorkerBlocks> workers_;  // GUARDED_BY(mu_)
};

}  // namespace kvfleet::router
