// GlobalIndex: the router's answer to "which worker holds this prefix, on which tier".
//
// It maps a block's sequence hash (Contract 1) to the set of {worker, tier} that hold it,
// folded from every worker's KV events (Contract 2) by router/events/EventPlane, plus
// predicted entries the router adds for the worker it just chose (they cover the lag
// between a routing decision and that worker's `stored` events). It is the kv policy's
// PrefixIndex (prefix_index.h).
//
// Layout. config::kShards shards, picked by the top bits of a mix of the hash. Each shard owns:
//   - an open-addressing table (linear probing, load <= 3/4, power-of-two capacity) of
//     32-byte slots: {hash, device mask, host mask, LRU stamp, predicted count, overflow
//     groups}. Bit w of the masks is worker w, for workers 0..63 (config::kInlineWorkers):
//     a fleet of up to 64 workers lives entirely in the slots. Beside each slot a 4-byte
//     ref to its overflow row, and per 32 slots a version (the readers' seqlock, below).
//   - overflow rows (overflow_rows.h): the {device, host} masks of each 64-worker group
//     holding the block among workers 64..kMaxWorkers-1, one row per block in an arena of
//     words (the slot's overflow field is the row's set of groups, its ref the row's place).
//     Correct for any fleet; slower.
//   - a predicted table hash -> [(worker, expiry)] (the slot counts its holders).
//   - per worker, a reverse list: every hash the worker gained state on in this shard,
//     appended when it gains it and compacted (stale and duplicate hashes dropped) once it
//     is over four times the worker's live entries plus 32 (shard_table.h: kCompactFactor,
//     kCompactSlack), so RemoveWorker costs O(its own blocks).
//
// Memory per (block, worker) entry (the budget; bench section 3 measures it): a block's
// slot is 32 bytes / load (0.375..0.75) = 43..85 bytes, shared by its holders; each holder
// adds 8 bytes of reverse list, plus the hashes of entries removed since the list was last
// compacted (at most 3x more under heavy churn, none in steady growth). So 1 holder: ~50..95
// bytes, 2 holders: ~30..50, many (shared prefixes): ~10..15. Workers >= 64 add 16 bytes per
// 64-worker group in the block's overflow row (up to 2x that in the arena's doubling chunks)
// and 5..11 bytes of row ref per block; a predicted holder ~40 bytes. Measured: 31.8 bytes per
// entry over 3.17 M entries (1 M blocks held by two workers each, plus 32 hot 1,024-block
// prefixes held by all 64 workers), before the row refs and versions (+4.25 bytes a slot).
//
// Windows: the index holds one tier set per (block, worker). EventPlane indexes only the
// events of one pool per worker, the one IndexedWindow (schema/registration.h) picks from
// its Hello: the pool storing the shortest prefix, the smaller window on ties, full
// attention when the Hello lists no pool (or --routing-window-size for every worker), so
// windowSize does not appear here.
//
// Invariants (CheckInvariants() asserts them):
//   1. A slot is in use iff its LRU stamp is non-zero; an in-use slot has a holder (a mask
//      bit, an overflow row or a predicted holder). Its predicted count equals its predicted
//      holders, its overflow set the groups of its overflow row (each with a holder): it has
//      a row ref iff the set is not empty, and the arena's live rows are exactly these.
//   2. A (block, worker) pair is held (tier bits) or predicted, never both.
//   3. Every (block, worker) pair with state is in the worker's reverse list of its shard,
//      and the list's live count is the number of such pairs.
//   4. BlockCount(w, t) equals the number of blocks w holds with tier bit t.
//   5. Every slot is reachable from its home position by linear probing.
//
// Thread safety: thread-safe. Readers (FindMatches, Holds, HeldRun) do not wait for a writer
// that holds a shard. They read the slots and overflow rows without a lock, as a seqlock per
// slot group (32 slots, shard_table.h): a writer takes its shard's mutex (against other
// writers), does an op's lookups, then makes the versions of the groups it stores to odd for
// that op's stores alone; a reader retries only when a version of the groups its probe read
// was odd or changed, i.e. when a write touched those very slots (or their rows) meanwhile.
// A table that grows is built aside and swapped in (a reader still on the old one reads a
// consistent, older state) and freed only once no lock-free reader is running. Readers of the
// predicted table (only blocks with a prediction) take the shard's side-table mutex, which a
// writer holds only around one op's change to that table; a probe run past 8 groups (which a
// table at load <= 3/4 practically never has) is read under the shard's mutex. Writers (Apply
// and the single-block calls, InsertPredicted, RemoveWorker, ForgetStored, SweepExpired) take
// one shard's mutex at a time: Apply groups a batch's blocks by shard and writes each shard's
// in slices of config::kWriteSliceOps, so a reader sees a batch applied in part (as it always
// could across shards), never a slot or row torn between two writes; a block's slot and its
// predicted holders may be seen at two moments of one batch. FindMatches allocates nothing
// once *out has capacity for every worker that matches.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "router/core/worker.h"
#include "router/index/prefix_index.h"
#include "schema/kv_event.h"

namespace kvfleet::router {

namespace config {
// Workers 0..63 are bits of a slot's own masks (the fast path); higher ids use the
// overflow table.
constexpr WorkerId kInlineWorkers = 64;
// 16 shards: readers take no lock, so shards only separate writers (the event thread and
// the HTTP threads' predictions), and fewer, larger tables can live in huge pages.
constexpr int kShardBits = 4;
constexpr int kShards = 1 << kShardBits;
// When a capped index trims, it removes the least recently used blocks until the entry
// count is this fraction of the cap, so trimming runs rarely and its cost amortises.
constexpr double kTrimTargetFraction = 0.9;
// A writer holds a shard's mutex for at most this many of a batch's ops at a time: another
// writer (a prediction) waits for one slice (~0.1 ms), not a whole snapshot chunk. Readers
// do not take it.
constexpr size_t kWriteSliceOps = 256;
}  // namespace config

struct GlobalIndexOptions {
  // Upper bound on (block, worker) entries in the whole index; 0 = unlimited. Above it
  // the least recently used blocks (stored, predicted or matched) are trimmed, which makes
  // the index forget blocks workers still hold: matching underestimates, never lies.
  uint64_t max_entries = 0;
};

// One block-level change of a worker's event batch (GlobalIndex::Apply).
struct BlockOp {
  enum Kind : uint8_t {
    kStore,   // the worker stores the block on `tier` (Store)
    kRemove,  // the worker no longer holds it on `tier` (Remove)
    kMove,    // the block moved to `tier` (Move); ignored when not held
    // Its retention priority changed to `priority`: only the RetentionEstimate reads it.
    // 4, not 3: the index's own predictions use 3 internally.
    kPriority = 4,
  };
  BlockHash hash;
  Kind kind;
  kv::Tier tier;
  uint8_t priority = kv::kDefaultPriority;  // kStore, kPriority: the block's retention priority
};

class RetentionEstimate;

class GlobalIndex final : public PrefixIndex {
 public:
  // REQUIRES: clock outlives the index.
  explicit GlobalIndex(const GlobalIndexOptions& options, Clock* clock);
  ~GlobalIndex() override;
  GlobalIndex(const GlobalIndex&) = delete;
  GlobalIndex& operator=(const GlobalIndex&) = delete;

  // ---- Queries -------------------------------------------------------------------------

  // Per worker that holds hashes[0] (stored or unexpired predicted): its leading run, in
  // ascending worker order. Stops at the first block no still-matching worker holds. A
  // block after the device run that the worker holds on the device again counts as a host
  // block: it is usable, and counting it as host keeps the estimate conservative. Each
  // match's held_blocks is HeldRun of its matched blocks, found in the same walk.
  // Clears and fills *out; no allocation once *out has capacity for the matching workers
  // (reserve config::kMaxWorkers to be sure).
  void FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const override;

  // Whether `worker` holds `hash` on any tier (predicted entries do not count).
  bool Holds(WorkerId worker, BlockHash hash) const;
  // Holds() for each of `hashes` in turn, up to the first it does not hold.
  uint32_t HeldRun(WorkerId worker, std::span<const BlockHash> hashes) const override;
  // Blocks `worker` holds on `tier` (predicted entries do not count).
  uint64_t BlockCount(WorkerId worker, kv::Tier tier) const;
  uint64_t CachedBlocks(WorkerId worker) const override { return BlockCount(worker, kv::Tier::kDevice); }
  // (block, worker) entries, predicted included.
  uint64_t EntryCount() const;
  // Distinct block hashes.
  uint64_t HashCount() const;
  // Bytes held by the tables, side tables and reverse lists (from their capacities;
  // excludes allocator overhead).
  uint64_t MemoryBytes() const;
  // Every hash `worker` holds on `tier`, sorted. For tests and debugging: O(blocks).
  std::vector<BlockHash> BlocksOf(WorkerId worker, kv::Tier tier) const;

  // ---- Updates (EventPlane applies events through these) ---------------------------------

  // Applies a batch of one worker's block changes, in order per block, taking each shard's
  // mutex once. The fast path for event batches and snapshots. REQUIRES: worker <
  // config::kMaxWorkers.
  void Apply(WorkerId worker, std::span<const BlockOp> ops);
  // `worker` stores `hash` on `tier`. Confirms a predicted entry. Idempotent.
  // REQUIRES: worker < config::kMaxWorkers.
  void Store(WorkerId worker, BlockHash hash, kv::Tier tier);
  // Store() for each block of a stored event, as one Apply.
  void StoreBlocks(WorkerId worker, std::span<const kv::StoredBlock> blocks);
  // `worker` no longer holds `hash` on `tier`. Unknown blocks are ignored.
  void Remove(WorkerId worker, BlockHash hash, kv::Tier tier);
  // The block moved to `tier` (offload or onboard): it is now held on `tier` only.
  // Returns false (and changes nothing) when `worker` does not hold `hash`.
  bool Move(WorkerId worker, BlockHash hash, kv::Tier tier);
  // Adds predicted entries: they count for matching (as device blocks) until `ttl` passes
  // or a Store confirms them. A block the worker already holds is left as it is.
  void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) override;
  // Removes every entry of `worker`, predicted ones included, in time proportional to its
  // own entries (plus one lock per shard).
  void RemoveWorker(WorkerId worker) override;
  // Removes what `worker`'s events said it holds and keeps the router's predicted entries for
  // it: a snapshot replaces the worker's stored blocks, but the requests this router sent it
  // and whose blocks are not stored yet are still on their way (routing/README.md,
  // "Predicted entries"). Same cost as RemoveWorker.
  void ForgetStored(WorkerId worker);
  // Drops predicted entries whose TTL has passed (matching already ignores them; this
  // returns their memory). Returns how many it dropped.
  uint64_t SweepExpired();

  // How soon each worker will evict what it holds, fed by Apply (retention_estimate.h).
  const RetentionEstimate& retention() const { return *retention_; }
  RetentionEstimate& retention() { return *retention_; }

  // Test support: KVF_CHECKs the invariants above. O(entries).
  void CheckInvariants() const;

  struct Shard;  // defined in global_index.cc
  struct Table;

 private:
  struct Op;
  Shard& ShardAt(int i) const;
  uint32_t NowMs() const;
  void ApplyOps(WorkerId worker, Op* ops, size_t n);
  // ops[0..n) are this shard's; ops[n..n + ahead) follow (other shards), for prefetching.
  void ApplyToShard(Shard& shard, WorkerId worker, const Op* ops, size_t n, size_t ahead, uint32_t now_ms);
  void Prefetch(const Op& op) const;
  void TrimIfNeeded(Shard& shard);
  void ClearWorker(WorkerId worker, bool keep_predicted);
  void Retire(Table* table);
  void ReclaimRetired();

  const GlobalIndexOptions options_;
  Clock* const clock_;
  const TimeNs base_ns_;
  std::unique_ptr<Shard[]> shards_;
  // Lock-free readers in flight; a retired table is freed only when this is 0.
  mutable std::atomic<uint64_t> readers_{0};
  std::mutex retired_mu_;
  std::vector<Table*> retired_;  // GUARDED_BY(retired_mu_)
  std::atomic<bool> has_retired_{false};
  std::unique_ptr<RetentionEstimate> retention_;
};

}  // namespace kvfleet::router
