// PredictedIndex: an index of the router's own decisions only.
//
// The `kv` policy reads the event-fed global index (router/index) through PrefixIndex
// (router/index/prefix_index.h); the `approx` policy reads a PredictedIndex, which holds
// nothing but the blocks of requests this router sent. Without events it models each
// worker's cache as the worker runs it: an LRU of `capacity` blocks (the worker's Hello), in
// which every routed prompt's blocks become the most recent, so a prediction lives as long
// as the worker would keep the blocks, not for a fixed time (routing/README.md, "approx").
// Each entry also has a TTL, an upper bound for what the router cannot see (other routers'
// traffic filling the worker's cache), and the only bound for a worker of unknown capacity.
//
// Thread safety: thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <span>
#include <unordered_map>
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
// stall routing for tens of milliseconds. Eviction by capacity is O(1) per evicted block.
//
// Invariants (CheckInvariants() asserts them):
//   1. An entry whose expiry has passed is never reported by FindMatches.
//   2. entries_ counts the (hash, worker) pairs stored, expired ones included until swept.
//   3. Every stored (hash, worker) pair has a record in expiry_ whose expiry equals the
//      pair's; expiry_ may also hold stale records (of refreshed or removed pairs), which
//      are skipped when popped.
//   4. Every stored (hash, worker) pair is in that worker's LRU list exactly once, and the
//      lists hold nothing else: their lengths sum to entries_.
//   5. After an insert, a worker with a known capacity holds at most that many blocks.
class PredictedIndex final : public PrefixIndex {
 public:
  // `max_entries`: when an insert would pass it even after expired entries are dropped,
  // the insert is skipped (predictions are hints, never needed for correctness).
  explicit PredictedIndex(const Clock* clock, size_t max_entries = 4'000'000);

  void FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const override;
  // The prompt's blocks become `worker`'s most recent, block 0 first of all (a worker frees
  // a finished sequence's tail first, so its prefix outlives its tail); beyond the worker's
  // capacity its least recent blocks are forgotten.
  void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) override;
  void RemoveWorker(WorkerId worker) override;
  // `blocks` = 0: unknown, entries are bounded by their TTL alone. A smaller capacity
  // takes effect at the worker's next insert.
  void SetCapacity(WorkerId worker, uint64_t blocks) override;

  size_t entries() const;
  // Entries held for `worker`.
  size_t entries(WorkerId worker) const;
  // Test support: KVF_CHECKs the invariants above. O(entries).
  void CheckInvariants() const;

 private:
  using LruList = std::list<BlockHash>;  // front: most recent
  struct Entry {
    WorkerId worker;
    TimeNs expires;
    LruList::iterator lru;  // in workers_[worker].lru
  };
  struct Expiry {
    TimeNs expires;
    BlockHash hash;
    WorkerId worker;
  };
  struct WorkerCache {
    uint64_t capacity = 0;  // 0: unknown
    LruList lru;
  };
  // Most blocks are predicted for one worker (two during a retry): keep them inline.
  using Holders = boost::container::small_vector<Entry, 2>;
  // Drops expired entries from the front of expiry_ (insertion order; a record with a
  // longer TTL ahead of shorter ones only delays theirs, and FindMatches checks expiry).
  void ExpireLocked(TimeNs now);
  // Removes (hash, worker) from map_ and from the worker's LRU.
  void EraseLocked(BlockHash hash, WorkerId worker);

  const Clock* clock_;
  size_t max_entries_;
  mutable std::mutex mu_;
  boost::unordered_flat_map<BlockHash, Holders> map_;  // GUARDED_BY(mu_)
  std::deque<Expiry> expiry_;                           // GUARDED_BY(mu_), insertion order
  std::unordered_map<WorkerId, WorkerCache> workers_;   // GUARDED_BY(mu_); node-stable
  size_t entries_ = 0;                                  // GUARDED_BY(mu_)
};

}  // namespace kvfleet::router
