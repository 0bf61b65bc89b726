// PredictedIndex: an index of the router's own decisions only.
//
// The `kv` policy reads the event-fed global index (router/index) through PrefixIndex
// (router/index/prefix_index.h); the `approx` policy reads a PredictedIndex, which holds
// nothing but the blocks of requests this router sent, each for a TTL. Predicted entries
// cover the gap between a decision and the worker's `stored` events (a burst sharing a new
// prefix lands on one worker) and are all `approx` knows.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include <boost/container/small_vector.hpp>
#include <boost/unordered/unordered_flat_map.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "router/core/worker.h"
#include "router/index/prefix_index.h"

namespace kvfleet::router {

// Expiry is incremental: every insert first drops the entries whose TTL has passed, oldest
// first, from a queue kept in insertion order, so the cost of expiry is spread over the
// inserts (O(1) amortized per entry) and no call ever sweeps the whole map. With a hot
// router (200 req/s of 8K-token prompts is ~50 K entries/s) a periodic full sweep would
// stall routing for tens of milliseconds.
//
// Invariants:
//   1. An entry whose expiry has passed is never reported by FindMatches.
//   2. entries_ counts the (hash, worker) pairs stored, expired ones included until swept.
//   3. Every stored (hash, worker) pair has a record in expiry_ whose expiry equals the
//      pair's; expiry_ may also hold stale records (of refreshed or removed pairs), which
//      are skipped when popped.
class PredictedIndex final : public PrefixIndex {
 public:
  // `max_entries`: when an insert would pass it even after expired entries are dropped,
  // the insert is skipped (predictions are hints, never needed for correctness).
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
  struct Expiry {
    TimeNs expires;
    BlockHash hash;
    WorkerId worker;
  };
  // Most blocks are predicted for one worker (two during a retry): keep them inline.
  using Holders = boost::container::small_vector<Entry, 2>;
  // Drops expired entries from the front of expiry_ (insertion order; a record with a
  // longer TTL ahead of shorter ones only delays theirs, and FindMatches checks expiry).
  void ExpireLocked(TimeNs now);

  const Clock* clock_;
  size_t max_entries_;
  mutable std::mutex mu_;
  boost::unordered_flat_map<BlockHash, Holders> map_;  // GUARDED_BY(mu_)
  std::deque<Expiry> expiry_;                           // GUARDED_BY(mu_), insertion order
  size_t entries_ = 0;                                  // GUARDED_BY(mu_)
};

}  // namespace kvfleet::router
