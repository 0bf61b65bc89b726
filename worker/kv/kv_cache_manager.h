// KvCacheManager: the paged KV cache of one worker, following TensorRT-LLM's KV cache
// system (pools, reuse tree, priority eviction, host tier, windows, events) and LightLLM's
// contiguous block allocation.
//
// The backend owns the KV memory; the manager hands out block ids per pool and asks a
// BlockCopier to copy whole blocks between tiers (block_copier.h has the memory layout).
//
// Ownership and threads: thread-compatible. The engine thread owns the manager and is the
// only caller of every method, including TakeEvents() and Snapshot() (the worker loop
// hands their results to the event publisher). No locks: nothing here blocks.
//
// Lifecycle of a request (the engine's calls, nano-vllm style check/action pairs):
//   1. id = AddSequence({prompt, namespace, retention}).
//   2. Match(id) (read-only): the longest cached prefix, split into device tokens, host
//      tokens and partially reused tokens. The last prompt token is always computed.
//   3. if CanAllocate(id): Allocate(id). Shares the device hits, onboards the host hits,
//      copies a partly matching block (partial reuse) and allocates the rest, preferring
//      one contiguous run. NumComputedTokens(id) = tokens whose KV is already cached.
//   4. After each forward pass: Commit(id, n) = the first n tokens' KV is written. Each
//      full block enters the reuse tree then (stored event) and windows drop old blocks.
//   5. Each sampled token: if CanAppend(id): Append(id, {token}) reserves its slot.
//   6. Finish or cancel: Release(id). Stored blocks stay cached, evictable.
//      Preemption: Preempt(id) frees the blocks but keeps the sequence (all its tokens);
//      later Match/Allocate it again.
//   7. Once per engine step: TakeEvents() hands over the step's events (the worker loop
//      moves them into the event publisher).
// Match, CanAllocate and Allocate of one sequence in a row walk the tree once: the match is
// kept until the tree changes.
//
// Per sequence the attention kernels read View(id, pool): the block ids (the block table)
// and, for windowed or chunked pools, which logical blocks they hold; SlotOf() and CachePosition()
// give the token -> slot mapping and the position-shift RoPE positions (StreamingLLM).
//
// Invariants (CheckInvariants() verifies them; tests call it after every operation):
//   1. Per pool and tier: free + in_use + cached == total.
//   2. A block is on its tier's free list iff its refcount is 0 and it is not in the tree.
//   3. A device block's refcount == the number of live sequences holding it.
//   4. Tree links are consistent: parent/child lists and child counts agree, every node is
//      in the hash index under its hash, no two nodes share a hash.
//   5. A device node's parent is on the device (or the root): device nodes form a rooted
//      subtree, so onboarding and offloading never disconnect the tree.
//   6. A node held by a sequence has every ancestor held (refcount > 0).
//   7. The eviction queue of a tier holds exactly the unreferenced nodes with no child on
//      that tier (device) / no child at all (host), per priority in LRU order.
//   8. A sequence's block table holds its blocks in logical order, and its linear table the
//      same blocks at their logical indexes (kNoBlock elsewhere); a stored block a window
//      or attention chunk dropped stays held (not in the table) until no stored block past
//      the sink blocks is left in its table, so invariant 6 holds with windows and chunks too
//      (sink blocks are the chain's root end: held for good, they hold no descendant up).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "common/status.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/kv_config.h"
#include "schema/kv_event.h"
#include "worker/kv/retention.h"

namespace kvfleet::kv {

class BlockPool;
class EventList;

using SequenceId = uint64_t;

struct SequenceSpec {
  std::vector<TokenId> prompt;  // REQUIRES: non-empty
  std::string model;            // hash namespace (Contract 1)
  std::string lora;             // empty when absent
  std::string cache_salt;       // empty when absent
  KvCacheRetentionConfig retention;
  // false: Match finds nothing, so every position is computed (a request asking for prompt
  // logprobs needs the logits of each); its full blocks are still stored for others.
  bool match_cached = true;
};

// What Match() found. device + host + partial = tokens whose KV needs no recomputation.
struct MatchInfo {
  uint32_t device_tokens = 0;   // full blocks already on the device (shared)
  uint32_t host_tokens = 0;     // full blocks on the host tier (onboarded by Allocate)
  uint32_t partial_tokens = 0;  // leading tokens of a partly matching block (copied)
  uint32_t cached_tokens() const { return device_tokens + host_tokens + partial_tokens; }
};

// A sequence's blocks in one pool, for the attention kernels.
struct PoolView {
  std::span<const BlockId> blocks;  // the block table: kept blocks in logical order
  // Logical block of blocks[i]: i when i < num_sink_blocks, else first_window_block + i -
  // num_sink_blocks. Without a window or attention chunk every block is kept and logical == i.
  uint32_t num_sink_blocks = 0;
  uint32_t first_window_block = 0;
  // The same table indexed by logical block (entry j holds tokens [j·B, (j+1)·B)), kNoBlock
  // where a window or chunk dropped the block: what a backend's step reads. Kept up to date
  // as blocks come and go, so a step of a long streamed sequence costs no O(length) copy.
  std::span<const BlockId> linear;
};

// A block Evict() moved off the device.
struct EvictedBlock {
  uint32_t pool = 0;
  BlockHash hash = 0;
  uint8_t priority = kDefaultPriority;
  bool offloaded = false;  // true: now on the host tier; false: dropped from the cache
};

struct TierStats {
  uint32_t total = 0;
  uint32_t free = 0;
  uint32_t in_use = 0;     // held by sequences
  uint32_t cached = 0;     // in the reuse tree, held by no sequence
  uint32_t evictable = 0;  // cached blocks eviction can reclaim now
  std::array<uint64_t, kMaxPriority + 1> evictions_by_priority{};
};

struct PoolStats {
  uint32_t window = 0;
  std::array<TierStats, kNumTiers> tiers{};
  uint64_t offloads = 0;        // device -> host block copies
  uint64_t onboards = 0;        // host -> device block copies
  uint64_t partial_copies = 0;  // partial reuse copies
};

struct KvStats {
  std::vector<PoolStats> pools;
  uint64_t reused_tokens = 0;  // prompt tokens served from the cache by Allocate
  uint64_t missed_tokens = 0;  // prompt tokens Allocate had to compute
  uint64_t events_dropped = 0;
  double hit_rate() const {
    const uint64_t all = reused_tokens + missed_tokens;
    return all == 0 ? 0.0 : static_cast<double>(reused_tokens) / static_cast<double>(all);
  }
};

// One block of a chain the holder sends (Contract 4): its hash, its B tokens and where
// each pool keeps it.
struct ExportedBlock {
  BlockHash hash = 0;
  std::vector<TokenId> tokens;
  std::vector<BlockLocation> pools;  // indexed by pool
};

// A chain being received (Contract 4): the blocks of the import sequence `seq` that need
// their bytes, logical blocks [first_block, num_blocks) of View(seq, pool).linear.
struct ImportPlan {
  SequenceId seq = 0;
  uint32_t first_block = 0;
  uint32_t num_blocks = 0;
};

// Testing hooks. Production code leaves them default.
struct KvTestHooks {
  // Replaces every block hash, e.g. [](BlockHash h) { return h & 7; } to force collisions.
  BlockHash (*hash_override)(BlockHash) = nullptr;
  // Starts each pool's 32-bit LRU use counter here, to test what happens when it wraps.
  uint32_t first_lru_tick = 0;
};

class KvCacheManager {
 public:
  // REQUIRES: copier and clock outlive the manager.
  static Result<std::unique_ptr<KvCacheManager>> Make(const KvCacheConfig& config, BlockCopier* copier,
                                                      const Clock* clock, KvTestHooks hooks = {});
  ~KvCacheManager();
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // --- sequences ---
  // Fails on an empty prompt or a bad retention config.
  Result<SequenceId> AddSequence(SequenceSpec spec);
  // Read-only: the longest cached prefix of the sequence's tokens.
  // REQUIRES: the sequence holds no blocks (new or preempted).
  MatchInfo Match(SequenceId id) const;
  bool CanAllocate(SequenceId id) const;
  // Blocks for every token of the sequence; ResourceExhausted when !CanAllocate(id).
  Status Allocate(SequenceId id);
  // The first n tokens' KV is written. REQUIRES: NumComputedTokens(id) <= n <= NumTokens(id).
  void Commit(SequenceId id, uint32_t n);
  // Whether n more tokens can get slots.
  bool CanAppend(SequenceId id, uint32_t n = 1) const;
  // Adds tokens (sampled) and reserves their slots; ResourceExhausted when !CanAppend.
  Status Append(SequenceId id, std::span<const TokenId> tokens);
  // Frees the sequence's blocks and forgets it. Stored blocks stay in the tree.
  void Release(SequenceId id);
  // Frees the sequence's blocks but keeps its tokens, to be matched and allocated again.
  void Preempt(SequenceId id);

  uint32_t NumTokens(SequenceId id) const;
  uint32_t NumComputedTokens(SequenceId id) const;
  bool IsAllocated(SequenceId id) const;
  PoolView View(SequenceId id, uint32_t pool) const;
  // The KV slot (block * B + offset) of token t, or nullopt when its block was dropped
  // by the window. REQUIRES: t < NumTokens(id).
  std::optional<uint64_t> SlotOf(SequenceId id, uint32_t pool, uint32_t t) const;
  // SlotOf for tokens [begin, end), appended to *out (-1 where the window dropped the
  // block): the slot mapping a forward pass writes new KV to. REQUIRES: end <= NumTokens(id).
  void SlotsOf(SequenceId id, uint32_t pool, uint32_t begin, uint32_t end, std::vector<int64_t>* out) const;
  // The token's position within the kept cache (table index * B + offset): the position
  // StreamingLLM's position-shift RoPE uses. Equals t when nothing was dropped.
  std::optional<uint32_t> CachePosition(SequenceId id, uint32_t pool, uint32_t t) const;
  // Chunked attention: the logical blocks [first, last) queries of chunk c may see.
  // REQUIRES: attention_chunk_size > 0.
  std::pair<uint32_t, uint32_t> ChunkBlocks(SequenceId id, uint32_t chunk) const;

  // --- KV transfer between workers (Contract 4, schema/README.md) ---
  // The holder's side. Finds the leading run of the chain `hashes` (Contract 1 sequence
  // hashes; `parent` is the hash of the block before the first, 0: the root) that every pool
  // holds on either tier, pins those blocks, calls copy(run) to copy their bytes out, and
  // unpins them. Returns the run (empty: the first block is not held, or the manager groups
  // blocks for routing and cannot serve by block); copy's error is returned as is.
  // Marks the run used: a block pulled by another worker is as hot as one reused here.
  Result<std::vector<ExportedBlock>> ExportChain(
      BlockHash parent, std::span<const BlockHash> hashes,
      const std::function<Status(std::span<const ExportedBlock>)>& copy);
  // ExportChain in two calls, for a copy that outlives the engine thread's call (a receiver on
  // the same host copying device to device): PinChain finds and pins the leading run, marks it
  // used and returns it; the caller must UnpinChain each of its blocks exactly once (any
  // subspans). REQUIRES: no Clear() while a run is pinned.
  std::vector<ExportedBlock> PinChain(BlockHash parent, std::span<const BlockHash> hashes);
  void UnpinChain(std::span<const ExportedBlock> run);
  // How many leading blocks of the chain PinChain would find now; nothing is pinned or marked.
  uint32_t HeldRun(BlockHash parent, std::span<const BlockHash> hashes) const;
  // The longest leading run of the chain that a live sequence here has among its prompt's full
  // blocks, stored or still to be computed: a holder computing a prefix will hold this much of
  // it once that sequence's prefill is done (unless it is cancelled first). Longer than
  // HeldRun's only while such a sequence has blocks of the chain left to compute.
  uint32_t LiveRun(BlockHash parent, std::span<const BlockHash> hashes) const;
  // The receiver's side, in two calls around the byte copy. BeginImport registers
  // spec.prompt (the pulled chain's whole blocks from the first token on: n·B tokens) as a
  // sequence and allocates the blocks it does not hold yet; the caller writes the pulled
  // bytes into plan.first_block..num_blocks of View(plan.seq, pool).linear, then calls
  // EndImport(plan, written) with the number of those blocks written, from first_block on:
  // the chain up to them enters the reuse tree (stored events, spec.retention's priority) and
  // stays cached; the rest is freed. Either way the sequence is released. ResourceExhausted when the blocks do not fit now;
  // FailedPrecondition when this manager groups blocks for routing (token-level KV).
  Result<ImportPlan> BeginImport(SequenceSpec spec);
  void EndImport(const ImportPlan& plan, uint32_t written);
  // EndImport in two: StoreImport stores the written chain as EndImport does but keeps the
  // import sequence, so the chain stays referenced (no eviction takes it) until ReleaseImport
  // releases the sequence (and frees any of its blocks not written).
  void StoreImport(const ImportPlan& plan, uint32_t written);
  void ReleaseImport(const ImportPlan& plan);
  // Import sequences begun and not yet released: blocks held for no request of the engine's.
  size_t live_imports() const { return live_imports_; }

  // --- cache-wide ---
  // Evicts up to n device blocks of `pool` (offloading those that qualify), lowest priority
  // first. Returns what left the device.
  std::vector<EvictedBlock> Evict(uint32_t pool, uint32_t n);
  // Drops every cached block and emits `cleared`. REQUIRES: no sequence holds blocks.
  void Clear();
  // The events since the last call, oldest first (at most event_buffer_max_size: the
  // oldest beyond that were dropped and counted in events_dropped()).
  // Routers index events by window (schema/README.md): of pools that share a window (Llama 4's
  // chunked and NoPE layers both have none), only the one storing the shortest prefix
  // publishes (a hit needs every pool); the others' events are neither kept nor counted.
  std::vector<KvEvent> TakeEvents();
  // Events dropped because the list was full, since the manager was made (only grows).
  uint64_t events_dropped() const;
  // Every stored block, per pool and tier (device first), parent before child, as stored
  // events. It reflects every event so far, taken or not: take them first for a
  // consistent cut.
  std::vector<KvEvent> Snapshot() const;

  KvStats Stats() const;
  Status CheckInvariants() const;

  const std::vector<PoolLayout>& pools() const { return layouts_; }
  uint32_t block_size() const { return config_.block_size; }
  bool reuse_enabled() const { return reuse_enabled_; }
  // Tokens of a pool's first window / attention chunk (the smaller): blocks past it are not
  // stored for reuse. 0: no limit.
  uint32_t ReuseLimit(uint32_t pool) const;
  // The most device blocks one sequence holds in a windowed or chunked pool once its prompt
  // is computed, however long it runs: its sink blocks, the blocks its window (chunk) can
  // see, the block of the next token, and, with reuse, the stored blocks of its first window
  // (chunk) until the window has passed them (invariant 8). 0: unbounded (full attention).
  // A prompt's blocks are all allocated at once, so a prompt longer than this needs more.
  uint32_t MaxSequenceBlocks(uint32_t pool) const;
  // Load report figures, summed over pools. Free counts the blocks free or evictable: cached
  // blocks no sequence holds, which a new sequence's Allocate takes as if free (Contract 2,
  // "Load"). A cache that has filled with reusable prefixes is full, not out of room.
  uint64_t FreeBlocks(Tier tier) const;
  uint64_t TotalBlocks(Tier tier) const;
  // Host memory of the manager's bookkeeping in bytes (nodes, tokens, index, free lists).
  size_t MemoryBytes() const;

 private:
  struct Sequence;
  struct Plan;
  KvCacheManager(const KvCacheConfig& config, std::vector<PoolLayout> layouts, BlockCopier* copier,
                 const Clock* clock, KvTestHooks hooks);

  Sequence& Seq(SequenceId id);
  const Sequence& Seq(SequenceId id) const;
  BlockHash HashAt(const Sequence& s, uint32_t i) const;
  void ExtendHashes(Sequence& s);
  void PlanMatch(SequenceId id, const Sequence& s, Plan* plan) const;
  // The leading run of the chain that every pool holds (on either tier), and its nodes (NodeId)
  // in *nodes, pools_.size() per block.
  uint32_t FindRun(BlockHash parent, std::span<const BlockHash> hashes, std::vector<uint32_t>* nodes) const;
  uint32_t BlocksNeeded(const Sequence& s, uint32_t pool, const Plan& plan) const;
  bool Fits(const Sequence& s, const Plan& plan) const;
  std::optional<uint32_t> TableIndex(const Sequence& s, uint32_t pool, uint32_t t) const;
  void StoreFullBlocks(Sequence& s);
  // Drops the blocks no later query of the sequence can see (sliding window, chunked
  // attention): unstored ones are freed, stored ones released to the reuse tree.
  void TrimWindows(Sequence& s);
  void FreeBlocks(Sequence& s);
  void Tick();  // expires durations; called at the start of each mutating call
  void FinishCall();  // issues the copies and closes pending events

  KvCacheConfig config_;
  std::vector<PoolLayout> layouts_;
  BlockCopier* copier_;
  const Clock* clock_;
  KvTestHooks hooks_;
  bool reuse_enabled_ = true;
  uint32_t group_blocks_ = 1;  // blocks per event block: EventBlockSize() / block_size
  size_t live_imports_ = 0;    // BeginImport's sequences not yet released (ReleaseImport)
  std::unique_ptr<EventList> events_;  // this manager's and its pools' events, until taken
  std::unique_ptr<EventList> muted_events_;  // off (max_size 0): the sink of non-publishing pools
  std::vector<bool> publishes_;              // [pool]: its events reach events_ (TakeEvents)
  std::vector<std::unique_ptr<BlockPool>> pools_;
  // Holds PinChain left for UnpinChain, by (pool, tier, block): invariant 3 counts them.
  std::map<std::tuple<uint32_t, Tier, BlockId>, uint32_t> export_pins_;
  std::vector<BlockCopy> copies_;  // this call's copies, issued by FinishCall
  std::unique_ptr<Plan> scratch_;  // Match/Allocate working space, reused to avoid allocations
  std::vector<std::unique_ptr<Sequence>> seqs_;  // slot -> sequence
  std::vector<uint32_t> free_slots_;
  uint64_t reused_tokens_ = 0;
  uint64_t missed_tokens_ = 0;
};

}  // namespace kvfleet::kv
