// GlobalIndex: the router's answer to "which worker holds this prefix, on which tier".
//
// It maps a block's sequence hash (Contract 1) to the set of {worker, tier} that hold it,
// folded from every worker's KV events (Contract 2) by router/events/EventPlane, plus
// predicted entries the router adds for the worker it just chose (they cover the lag
// between a routing decision and that worker's `stored` events).
//
// Layout (bytes per (block, worker) entry are measured by bench_global_index and
// reported by MemoryBytes(); the figures below are the design budget):
//   - kShards shards, picked by the hash's top bits; each owns a boost::unordered_flat_map
//     hash -> HolderList (32-byte slot: key, up to 2 holders inline, an LRU stamp) and, per
//     worker, a reverse set (unordered_flat_set<BlockHash>, 8-byte slots) of what that
//     worker holds in the shard.
//   - A holder is 8 bytes: worker id, tier bits, a predicted bit and its expiry.
//   - A hot block (more than 16 holders, e.g. a shared system prompt) also keeps 256 bytes
//     of worker bitsets, so FindMatches intersects 64 workers per instruction on it.
//   - So one (block, worker) entry costs about 8 (holder) + 9..18 (reverse set slot at
//     load 0.875..0.44) + 32/holders-per-block (map slot) + map metadata: ~50 bytes for a
//     block held by one worker, ~20 bytes each for a block held by many.
//
// Windows: the index holds one tier set per (block, worker). EventPlane indexes only the
// events of the pool it routes on (full attention, or the largest window when every pool
// is windowed; see router/events/event_plane.h), so windowSize does not appear here.
//
// Invariants (CheckInvariants() asserts them):
//   1. A holder exists iff its tier bits are non-zero or it has a predicted bit.
//   2. Worker w is in hash h's holder list iff h is in w's reverse set of h's shard.
//   3. BlockCount(w, t) equals the number of holders of w whose tier bit t is set.
//   4. No hash maps to an empty holder list.
//   5. A holder list past 16 holders carries worker bitsets (device, any tier) and a count
//      of predicted holders that agree with its holders.
//
// FindMatches keeps the still-matching workers as bitsets: per block it costs one hash lookup
// plus one AND per 64 workers on hot blocks, or a walk of the (few) holders otherwise.
//
// Thread safety: thread-safe. Readers (FindMatches, BlockCount, Holds) take per-shard
// shared locks, each at most once per call; writers take one shard's exclusive lock per
// operation and never hold two shard locks at once. FindMatches allocates nothing once
// *out has capacity for every worker that matches.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <vector>

#include <boost/unordered/unordered_flat_map.hpp>
#include <boost/unordered/unordered_flat_set.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "worker/kv/kv_event.h"

namespace kvfleet::router {

// Dense id, assigned by the router's fleet registry.
using WorkerId = uint32_t;

namespace config {
// Worker ids are dense and small: 1024 covers a large fleet and keeps the per-shard
// per-worker tables (reverse sets, counters) a few hundred KiB.
constexpr WorkerId kMaxWorkers = 1024;
// 64 shards: enough that apply threads and readers rarely meet on one lock, few enough
// that a 1,024-block FindMatches takes at most 64 lock acquisitions.
constexpr int kShardBits = 6;
constexpr int kShards = 1 << kShardBits;
// When a capped index trims, it removes the least recently used blocks until the entry
// count is this fraction of the cap, so trimming runs rarely and its cost amortises.
constexpr double kTrimTargetFraction = 0.9;
}  // namespace config

struct GlobalIndexOptions {
  // Upper bound on (block, worker) entries in the whole index; 0 = unlimited. Above it
  // the least recently used blocks (stored, predicted or matched) are trimmed, which makes
  // the index forget blocks workers still hold: matching underestimates, never lies.
  uint64_t max_entries = 0;
};

// One worker's match for a request: `device_blocks` leading blocks held on the device,
// then `host_blocks` more held on the host (a block after the device run that the worker
// holds on the device again counts as a host block: it is usable, and counting it as host
// keeps the estimate conservative). A predicted entry counts as a device block.
struct WorkerMatch {
  WorkerId worker;
  uint32_t device_blocks;
  uint32_t host_blocks;
};

class GlobalIndex {
 public:
  // REQUIRES: clock outlives the index.
  explicit GlobalIndex(const GlobalIndexOptions& options, Clock* clock);
  ~GlobalIndex();
  GlobalIndex(const GlobalIndex&) = delete;
  GlobalIndex& operator=(const GlobalIndex&) = delete;

  // ---- Queries -------------------------------------------------------------------------

  // Per worker that holds hashes[0] (stored or unexpired predicted): its leading run, in
  // the order the workers appear in block 0's holder list. Stops at the first block no
  // still-matching worker holds. Clears and fills *out; no allocation once *out has
  // capacity for the matching workers (reserve config::kMaxWorkers to be sure).
  void FindMatches(std::span<const BlockHash> hashes, std::vector<WorkerMatch>* out) const;

  // Whether `worker` holds `hash` on any tier (predicted entries do not count).
  bool Holds(WorkerId worker, BlockHash hash) const;
  // Blocks `worker` holds on `tier` (predicted entries do not count).
  uint64_t BlockCount(WorkerId worker, kv::Tier tier) const;
  // (block, worker) entries, predicted included.
  uint64_t EntryCount() const;
  // Distinct block hashes.
  uint64_t HashCount() const;
  // Bytes held by the maps, reverse sets and overflow holder arrays (an estimate from
  // their capacities; excludes allocator overhead).
  uint64_t MemoryBytes() const;
  // Every hash `worker` holds on `tier`, sorted. For tests and debugging: O(blocks).
  std::vector<BlockHash> BlocksOf(WorkerId worker, kv::Tier tier) const;

  // ---- Updates (EventPlane applies events through these) ---------------------------------

  // `worker` stores `hash` on `tier`. Confirms a predicted entry. Idempotent.
  // REQUIRES: worker < config::kMaxWorkers.
  void Store(WorkerId worker, BlockHash hash, kv::Tier tier);
  // Store() for each block of a stored event, reading the clock once.
  void StoreBlocks(WorkerId worker, std::span<const kv::StoredBlock> blocks);
  // `worker` no longer holds `hash` on `tier`. Unknown blocks are ignored.
  void Remove(WorkerId worker, BlockHash hash, kv::Tier tier);
  // The block moved to `tier` (offload or onboard): it is now held on `tier` only.
  // Returns false (and changes nothing) when `worker` does not hold `hash`.
  bool Move(WorkerId worker, BlockHash hash, kv::Tier tier);
  // Adds predicted entries: they count for matching (as device blocks) until `ttl` passes
  // or a Store confirms them. A block the worker already holds is left as it is.
  void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl);
  // Removes every entry of `worker`, predicted ones included, in time proportional to its
  // own entries (plus one lock per shard).
  void RemoveWorker(WorkerId worker);
  // Drops predicted entries whose TTL has passed (matching already ignores them; this
  // returns their memory). Returns how many it dropped.
  uint64_t SweepExpired();

  // Test support: KVF_CHECKs the invariants above. O(entries).
  void CheckInvariants() const;

  // ---- Internals, public for the benchmark's memory accounting ---------------------------
  // 8 bytes: who holds a block and how.
  struct Holder {
    uint16_t worker;
    uint8_t flags;        // bit 0: device, bit 1: host, bit 2: predicted
    uint8_t reserved;
    uint32_t expiry_ms;   // predicted: index-relative expiry in ms; else 0
  };
  static constexpr uint8_t kDeviceBit = 1, kHostBit = 2, kPredictedBit = 4;
  // 24 bytes: the holders of one block; up to two inline, more on the heap.
  class HolderList;

 private:
  struct Shard;
  Shard& ShardOf(BlockHash h) const;
  uint32_t NowMs() const;
  void TrimIfNeeded(Shard& shard);
  void StoreOne(WorkerId worker, BlockHash hash, kv::Tier tier, uint32_t now_ms);

  const GlobalIndexOptions options_;
  Clock* const clock_;
  const TimeNs base_ns_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace kvfleet::router
