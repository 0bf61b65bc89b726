// BlockPool: the blocks of one pool on both tiers, its reuse tree and its eviction queues.
//
// The KV cache manager keeps one BlockPool per (attention window, kv heads) pair and drives
// it for every sequence; the pool knows nothing of sequences, only refcounts.
//
// Reuse tree: a node is a full block in the tree, identified by its Contract 1 sequence
// hash and checked against its parent and actual tokens, so a hash collision costs a miss,
// never wrong KV. A hash index (open addressing) finds a node in O(1); each node keeps a
// child list for partial reuse and snapshots. A node lives on one tier at a time.
//
// Eviction (TensorRT-LLM's priority LRU): each tier has one LRU queue per priority of the
// nodes that can go now; the victim is the head of the lowest non-empty priority. Device candidates are unreferenced nodes without a
// device child; host candidates are nodes without any child. Only those are evictable, so
// the tree stays connected; a parent becomes a candidate, at its own last use, when its last
// child goes. A device node whose priority >= offload_min_priority moves to the host tier
// (making room there by evicting a host node of lower or equal priority) and stays in the
// tree; otherwise it is dropped, together with the host nodes below it (children first).
// A priority with a duration falls back to kDefaultPriority once the duration passes without
// use (ProcessExpired).
//
// Invariants: the numbered list in kv_cache_manager.h (1, 2, 4, 5, 7); CheckInvariants().
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#pragma once

#include <array>
#include <cstdint>
#include <queue>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "common/status.h"
#include "worker/kv/block_allocator.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/event_buffer.h"
#include "worker/kv/huge_page_allocator.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/kv/kv_config.h"
#include "worker/kv/retention.h"

namespace kvfleet::kv {

using NodeId = uint32_t;
constexpr NodeId kNoNode = UINT32_MAX;  // also "the root" as a parent

class BlockPool {
 public:
  struct Options {
    uint32_t block_size = config::kDefaultBlockSize;
    bool enable_offload = true;
    uint8_t offload_min_priority = config::kDefaultOffloadMinPriority;
    bool include_tokens = false;
    uint32_t partial_reuse_max_candidates = config::kMaxPartialReuseCandidates;
  };

  // REQUIRES: events outlives the pool.
  BlockPool(uint32_t index, const PoolLayout& layout, const Options& options, EventBuffer* events);

  uint32_t index() const { return index_; }
  uint32_t window() const { return window_; }
  uint32_t num_blocks(Tier t) const { return alloc_[Idx(t)].num_blocks(); }
  uint32_t num_free(Tier t) const { return alloc_[Idx(t)].num_free(); }
  // Cached device blocks no sequence holds: what eviction can reclaim.
  uint32_t num_reclaimable() const { return unpinned_cached_[0]; }

  // --- the tree (read-only) ---
  // Changes whenever a node is added, removed or moves tier: a cached match is stale then.
  uint64_t version() const { return version_; }
  // Starts loading the index slot of h (a lookup a few blocks ahead hides its cache miss).
  void PrefetchSlot(BlockHash h) const { __builtin_prefetch(&index_slots_[Home(h)]); }
  // Starts loading node n and its tokens.
  void PrefetchNode(NodeId n) const {
    __builtin_prefetch(&nodes_[n]);
    __builtin_prefetch(&tokens_[size_t{n} * block_size_]);
  }
  NodeId FindHash(BlockHash h) const;
  // The child of `parent` (kNoNode = root) with hash h and these tokens, or kNoNode.
  NodeId Find(NodeId parent, BlockHash h, std::span<const TokenId> tokens) const;
  bool SameBlock(NodeId n, NodeId parent, std::span<const TokenId> tokens) const;
  // The child of `parent` sharing the longest leading run with `want` (device preferred on
  // ties), scanning at most options.partial_reuse_max_candidates children. Returns the run
  // length (0: none) and sets *source.
  uint32_t BestPartial(NodeId parent, std::span<const TokenId> want, NodeId* source) const;
  Tier tier(NodeId n) const { return nodes_[n].tier; }
  BlockId block(NodeId n) const { return nodes_[n].block; }
  uint8_t priority(NodeId n) const { return nodes_[n].priority; }
  BlockHash hash(NodeId n) const { return nodes_[n].hash; }
  uint32_t refcount(Tier t, BlockId b) const { return refcount_[Idx(t)][b]; }
  NodeId node_of(Tier t, BlockId b) const { return block_node_[Idx(t)][b]; }

  // --- references ---
  // Holds node n's block (either tier) and marks it used now.
  void Pin(NodeId n, TimeNs now);
  // Drops one hold on block b; a block outside the tree is freed at refcount 0.
  void Unpin(Tier t, BlockId b, TimeNs now);
  // Raises n's priority (and duration) to r when r is higher; emits `updated`.
  void Raise(NodeId n, const BlockRetention& r, TimeNs now);

  // --- allocation ---
  // Evicts until `n` device blocks are free. Returns false when it cannot.
  bool EnsureDeviceFree(uint32_t n, std::vector<BlockCopy>* copies);
  // n fresh device blocks (refcount 1), a contiguous run when possible.
  // REQUIRES: num_free(kDevice) >= n (EnsureDeviceFree).
  void AllocateDevice(uint32_t n, std::vector<BlockId>* out);
  // Copies pinned host node n into a fresh device block; n moves to the device tier and
  // keeps its holds. REQUIRES: a free device block, n's parent on the device.
  BlockId Onboard(NodeId n, std::vector<BlockCopy>* copies);
  // Adds device block b (held by the caller) to the tree under `parent`.
  // REQUIRES: FindHash(h) == kNoNode, parent on the device or the root.
  NodeId Store(NodeId parent, BlockHash h, std::span<const TokenId> tokens, BlockId b, const BlockRetention& r,
               TimeNs now);

  // --- eviction ---
  // Evicts up to n device blocks, lowest (priority, last use) first.
  uint32_t EvictDevice(uint32_t n, std::vector<BlockCopy>* copies, std::vector<EvictedBlock>* out);
  // Priorities whose duration passed fall back to kDefaultPriority.
  void ProcessExpired(TimeNs now);
  // Drops every node and emits `cleared`. REQUIRES: no block is held.
  void Clear();

  // --- events, stats, checks ---
  void CloseEvents();  // pushes the event being batched, if any
  void Snapshot(std::vector<KvEvent>* out) const;
  void FillStats(PoolStats* s) const;
  void CountPartialCopy() { ++partial_copies_; }
  Status CheckInvariants() const;
  // Host memory this pool's bookkeeping uses, in bytes (for the overhead figure).
  size_t MemoryBytes() const;

 private:
  struct Node {
    BlockHash hash = 0;
    uint64_t tick = 0;          // last use, for LRU
    TimeNs expires_at = 0;      // 0: no duration
    DurationNs duration = 0;    // 0: none
    NodeId parent = kNoNode;
    BlockId block = 0;
    NodeId first_child = kNoNode;
    NodeId next_sibling = kNoNode;
    NodeId prev_sibling = kNoNode;
    uint32_t num_children = 0;
    uint32_t num_device_children = 0;
    NodeId lru_prev = kNoNode;  // eviction queue links
    NodeId lru_next = kNoNode;
    uint32_t expiry_stamp = 0;
    uint8_t priority = kDefaultPriority;
    uint8_t queued_priority = 0;  // the queue it is in, when queued
    Tier tier = Tier::kDevice;
    bool live = false;
    bool queued = false;
  };
  struct Queue {
    NodeId head = kNoNode;  // least recently used
    NodeId tail = kNoNode;
  };
  struct __attribute__((packed)) Slot {
    BlockHash hash;
    NodeId node;
  };
  struct ExpiryEntry {
    TimeNs at;
    NodeId node;
    uint32_t stamp;
    bool operator>(const ExpiryEntry& o) const { return at > o.at; }
  };

  static int Idx(Tier t) { return static_cast<int>(t); }
  std::span<const TokenId> TokensOf(NodeId n) const { return {&tokens_[size_t{n} * block_size_], block_size_}; }
  void Touch(Node& x, TimeNs now);

  // Puts n in, or takes it out of, its tier's eviction queue as invariant 7 says.
  void QueueUpdate(NodeId n);
  void QueueInsert(NodeId n);
  void QueueRemove(NodeId n);
  NodeId Front(int t) const;  // the next victim: lowest priority, least recently used

  uint64_t Home(BlockHash h) const { return (h * 0x9E3779B97F4A7C15ull) >> index_shift_; }
  void IndexInsert(BlockHash h, NodeId n);
  void IndexErase(BlockHash h);

  bool EvictOneDevice(std::vector<BlockCopy>* copies, std::vector<EvictedBlock>* out);
  bool EvictOneHost();
  void PrefetchNextVictims(const Node& x) const;
  bool MakeHostRoom(uint8_t priority);
  void RemoveNode(NodeId n);
  void DropHostDescendants(NodeId n);
  void LinkChild(NodeId parent, NodeId n);
  void UnlinkChild(NodeId n);

  void EmitStored(NodeId n);
  void EmitRemoved(BlockHash h, Tier t);
  void EmitUpdated(NodeId n, std::optional<Tier> tier, std::optional<uint8_t> priority);
  void Emit(KvEvent e);

  uint32_t index_;
  uint32_t window_;
  Options options_;
  uint32_t block_size_;
  EventBuffer* events_;

  std::array<BlockAllocator, kNumTiers> alloc_;
  std::array<HugeVector<NodeId>, kNumTiers> block_node_;
  std::array<HugeVector<uint32_t>, kNumTiers> refcount_;
  std::array<uint32_t, kNumTiers> unpinned_cached_{};

  HugeVector<Node> nodes_;
  HugeVector<TokenId> tokens_;  // [node][B]
  HugeVector<NodeId> free_nodes_;
  NodeId root_first_child_ = kNoNode;
  uint32_t root_num_children_ = 0;
  uint32_t live_nodes_ = 0;

  HugeVector<Slot> index_slots_;
  uint32_t index_shift_ = 0;

  // Per tier and priority, the evictable nodes in LRU order (tick ascending), and a bitmap
  // of the non-empty priorities so the lowest is found in O(1).
  std::array<std::array<Queue, kMaxPriority + 1>, kNumTiers> queues_{};
  std::array<std::array<uint64_t, 2>, kNumTiers> nonempty_{};
  std::array<uint32_t, kNumTiers> queued_{};
  std::priority_queue<ExpiryEntry, std::vector<ExpiryEntry>, std::greater<ExpiryEntry>> expiry_;
  uint64_t tick_ = 0;
  uint64_t version_ = 0;

  // Event batching: consecutive stored blocks of one chain, or removals on one tier, share
  // one event.
  std::optional<KvEvent> pending_;
  NodeId pending_last_ = kNoNode;

  std::array<std::array<uint64_t, kMaxPriority + 1>, kNumTiers> evictions_{};
  uint64_t offloads_ = 0;
  uint64_t onboards_ = 0;
  uint64_t partial_copies_ = 0;
};

}  // namespace kvfleet::kv
