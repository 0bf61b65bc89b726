// PrefixIndex: what routing asks of a block index. PredictedIndex: an index of the
// router's own decisions only.
//
// The `kv` policy reads the event-fed global index (router/index) through PrefixIndex;
// the `approx` policy reads a PredictedIndex, which holds nothing but the blocks of
// requests this router sent, each for a TTL. Predicted entries cover the gap between a
// decision and the worker's `stored` events (a burst sharing a new prefix lands on one
// worker) and are all `approx` knows.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "router/routing/policy.h"

namespace kvfleet::router {

struct PrefixMatch {
  WorkerId worker = 0;
  uint32_t device_blocks = 0;  // leading blocks on the device tier
  uint32_t host_blocks = 0;    // further leading blocks on the host tier
};

class PrefixIndex {
 public:
  virtual ~PrefixIndex() = default;
  // Appends, for every worker holding the first block, how many leading blocks of
  // `hashes` it holds. Read-only.
  virtual void FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const = 0;
  // Records that `worker` will hold `hashes` (on its device tier) for `ttl`.
  virtual void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) = 0;
  virtual void RemoveWorker(WorkerId worker) = 0;
};

// Invariants:
//   1. An entry whose expiry has passed is never reported by FindMatches.
//   2. entries_ counts the (hash, worker) pairs stored, expired ones included until swept.
//   3. entries_ < max(2 x the entries left by the last sweep, kSweepMinEntries) + one
//      insert's hashes: expired entries are swept as inserts go on, so a router that sees a
//      steady stream of new prompts holds about what the TTL keeps alive, not everything
//      it ever predicted.
class PredictedIndex final : public PrefixIndex {
 public:
  // Below this many entries no sweep runs: small indexes are not worth walking.
  static constexpr size_t kSweepMinEntries = 4096;

  // `max_entries`: past it, expired entries are swept; if still over, the oldest
  // predictions are simply not added (they are hints, never needed for correctness).
  explicit PredictedIndex(const Clock* clock, size_t max_entries = 4'000'000);

  void FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const override;
  void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) override;
  void RemoveWorker(WorkerId worker) override;

  size_t entries() const;

 private:
  struct Entry {
    WorkerId worker;
    TimeNs expires;
  };
  void SweepLocked(TimeNs now);

  const Clock* clock_;
  size_t max_entries_;
  mutable std::mutex mu_;
  std::unordered_map<BlockHash, std::vector<Entry>> map_;  // GUARDED_BY(mu_)
  size_t entries_ = 0;                                     // GUARDED_BY(mu_)
  size_t sweep_at_ = kSweepMinEntries;  // GUARDED_BY(mu_); the next sweep runs at this size
};

}  // namespace kvfleet::router
