// BlockPool: the blocks of one pool on both tiers, its reuse tree and its eviction queues.
//
// The KV cache manager keeps one BlockPool per (attention window, kv heads) pair and drives
// it for every sequence; the pool knows nothing of sequences, only refcounts.
//
// Entries: one 48-byte Node per block of either tier, and the node *is* its block: node id
// b is device block b, node id D + h is host block h (D = device blocks). A node is "live"
// while its block is in the reuse tree; a block outside the tree only uses its node's
// refcount. A node that changes tier (offload, onboard) therefore changes id: MoveNode
// re-points its parent's child list, its children and its hash index slot.
//
// Reuse tree: a live node is a full block, identified by its Contract 1 sequence hash and
// checked against its parent and its actual tokens (PackedTokens), so a hash collision costs
// a miss, never wrong KV. HashIndex finds a node in O(1). Each node has a child list (for
// partial reuse, snapshots and dropping host descendants) that keeps device children before
// host children, so "has a device child" is one look at the first child.
//
// Eviction (TensorRT-LLM's priority LRU): each tier has one LRU queue per priority of the
// nodes that can go now; the victim is the head of the lowest non-empty priority. Device
// candidates are unreferenced nodes without a device child; host candidates are nodes
// without any child. Only those are evictable, so the tree stays connected; a parent becomes
// a candidate, at its own last use, when its last child goes. A device node whose priority
// >= offload_min_priority moves to the host tier (making room there by evicting a host node
// of lower or equal priority) and stays in the tree; otherwise it is dropped, together with
// the host nodes below it (children first). A priority with a duration falls back to
// kDefaultPriority once the duration passes without use (ProcessExpired).
//
// Host memory per block (MemoryBytes(); B = 32, 128K vocabulary, no host tier):
//   Node                                   48 B  (layout below)
//   tokens, 32 x 17 bits                   68 B  (PackedTokens; 4 x B bytes without vocab)
//   hash index, 8 B slots at load <= 0.8  ~10 B  (HashIndex)
//   free-block bitmap                    ~0.13 B (BlockAllocator)
//   total                               ~126 B; plus 8 B per expiry entry of a block with a duration.
//
// Invariants: the numbered list in kv_cache_manager.h (1, 2, 4, 5, 7) and
//   9. Device children precede host children in every child list.
//  10. Only live nodes are group ends.
//
// Routing groups (token-level KV): with group_blocks R > 1, events describe groups of R
// blocks, the routers' block size G = R x B. The node at the end of a group (depth kR + R - 1,
// flagged by the manager at Store) carries the group's Contract 1 hash at block size G; only
// group ends are published (stored, updated, removed, snapshots), with the previous group's
// end as parent and the group's R x B tokens. A group is stored when its last block is, and
// removed when its last block leaves: the group's other blocks are its end's ancestors, so
// none of them is evicted first, and the end's tier is the group's (a device node's
// ancestors are on the device).
// CheckInvariants() verifies them.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "common/status.h"
#include "worker/kv/block_allocator.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/event_list.h"
#include "worker/kv/hash_index.h"
#include "worker/kv/huge_page_allocator.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/kv/kv_config.h"
#include "worker/kv/packed_tokens.h"
#include "worker/kv/retention.h"

namespace kvfleet::kv {

namespace config {
// Expiry deadlines are 32-bit counts of this unit since the pool's epoch, compared modulo
// 2^32; a duration is capped at kMaxDurationTicks so every live deadline is within 2^31.
constexpr DurationNs kExpiryTickNs = 1'000'000;  // 1 ms: far below any useful retention
constexpr uint32_t kMaxDurationTicks = 1u << 30;  // ~12.4 days
// Distinct durations a pool tracks at once (a node keeps a 6-bit slot, not 8 bytes). A new
// duration beyond that is rounded up to the next longer one in use (or the longest).
constexpr uint32_t kMaxDurationSlots = 63;
// A block's refcount is 16 bits: more sequences than this never share one block.
constexpr uint32_t kMaxRefcount = 0xFFFF;
}  // namespace config

class BlockPool {
 public:
  struct Options {
    uint32_t block_size = config::kDefaultBlockSize;
    uint32_t group_blocks = 1;  // blocks per event block (routing group); 1: every block
    uint32_t vocab_size = 0;  // 0 = unknown: tokens are kept at 32 bits
    bool enable_offload = true;
    uint8_t offload_min_priority = config::kDefaultOffloadMinPriority;
    bool include_tokens = false;
    uint32_t partial_reuse_max_candidates = config::kMaxPartialReuseCandidates;
    TimeNs epoch = 0;            // time 0 of the 32-bit expiry clock (the clock at start)
    uint32_t first_lru_tick = 0;  // test hook: start the 32-bit LRU clock here
  };

  // REQUIRES: events outlives the pool.
  BlockPool(uint32_t index, const PoolLayout& layout, const Options& options, EventList* events);

  uint32_t index() const { return index_; }
  uint32_t window() const { return window_; }
  uint32_t num_blocks(Tier t) const { return alloc_[Idx(t)].num_blocks(); }
  uint32_t num_free(Tier t) const { return alloc_[Idx(t)].num_free(); }
  // Free blocks of tier `t`, and cached ones no sequence holds: what eviction (device) or a
  // drop (host) frees. What a new sequence (or an offload) can take.
  uint64_t num_free_or_evictable(Tier t) const { return uint64_t{num_free(t)} + unpinned_cached_[Idx(t)]; }

  // --- the tree (read-only) ---
  // Changes whenever a node is added, removed or moves tier: a cached match is stale then.
  uint64_t version() const { return version_; }
  // Starts loading the index slot of h (a lookup a few blocks ahead hides its cache miss).
  void PrefetchSlot(BlockHash h) const { hash_index_.Prefetch(h); }
  // Starts loading the node the index slot of h points at, and its tokens. False when the
  // index certainly holds no node with hash h.
  bool PrefetchCandidate(BlockHash h) const;
  // Starts loading device block b's node and token entry (a Store to come writes them).
  void PrefetchDeviceEntry(BlockId b) const {
    PrefetchAddress(&nodes_[b]);
    PrefetchAddress(tokens_.data(b));
    PrefetchAddress(tokens_.data(b) + tokens_.stride() - 1);
  }
  NodeId FindHash(BlockHash h) const {
    return hash_index_.Find(h, [this](NodeId n) { return nodes_[n].hash; });
  }
  // The child of `parent` (kNoNode = root) with hash h and these tokens, or kNoNode.
  NodeId Find(NodeId parent, BlockHash h, std::span<const TokenId> tokens) const;
  bool SameBlock(NodeId n, NodeId parent, std::span<const TokenId> tokens) const;
  // The child of `parent` sharing the longest leading run with `want` (device preferred on
  // ties), scanning at most options.partial_reuse_max_candidates children. Returns the run
  // length (0: none) and sets *source. At the root only blocks stored under `seed` (the
  // cache namespace: model, adapter, salt) qualify; below it a parent has one namespace.
  uint32_t BestPartial(NodeId parent, std::span<const TokenId> want, uint64_t seed, NodeId* source) const;
  Tier tier(NodeId n) const { return IsDevice(n) ? Tier::kDevice : Tier::kHost; }
  BlockId block(NodeId n) const { return IsDevice(n) ? n : n - num_device_; }
  uint8_t priority(NodeId n) const { return static_cast<uint8_t>(nodes_[n].priority); }
  BlockHash hash(NodeId n) const { return nodes_[n].hash; }
  uint32_t refcount(Tier t, BlockId b) const { return nodes_[Id(t, b)].refcount; }
  NodeId node_of(Tier t, BlockId b) const { return nodes_[Id(t, b)].live ? Id(t, b) : kNoNode; }
  NodeId parent(NodeId n) const { return nodes_[n].parent; }
  // Live node n's B tokens, appended to *out.
  void Tokens(NodeId n, std::vector<TokenId>* out) const { tokens_.Unpack(n, out); }

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
  // One fresh device block, prev + 1 when that one is free (a sequence's next block, kept
  // contiguous). REQUIRES: num_free(kDevice) >= 1.
  BlockId AllocateDeviceAfter(BlockId prev);
  // Copies pinned host node n into a fresh device block; the node moves to the device tier
  // (a new id, returned) and keeps its holds. REQUIRES: a free device block, n's parent on
  // the device.
  NodeId Onboard(NodeId n, std::vector<BlockCopy>* copies);
  // Adds device block b (held by the caller) to the tree under `parent`. Returns kNoNode,
  // storing nothing, when a token does not fit the vocabulary's bit width.
  // REQUIRES: FindHash(h) == kNoNode, parent on the device or the root.
  // group_end: b ends a routing group (always true when group_blocks is 1). lora_id: the
  // adapter the block's KV was computed with (LoraId; 0: the base model), for its events.
  // seed: the sequence's hash seed (its cache namespace), which partial reuse at the root checks.
  NodeId Store(NodeId parent, BlockHash h, std::span<const TokenId> tokens, BlockId b, const BlockRetention& r,
               TimeNs now, bool group_end = true, uint64_t lora_id = 0, uint64_t seed = 0);

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
  // Host memory this pool's bookkeeping uses, in bytes: every array at its capacity.
  size_t MemoryBytes() const;

 private:
  // 48 bytes. Links are node ids (kNoNode = none). A child list is null-terminated through
  // next_sibling; the head's prev_sibling is the tail.
  struct Node {
    BlockHash hash = 0;
    NodeId parent = kNoNode;
    NodeId first_child = kNoNode;
    NodeId next_sibling = kNoNode;
    NodeId prev_sibling = kNoNode;
    NodeId lru_prev = kNoNode;  // eviction queue links
    NodeId lru_next = kNoNode;
    uint32_t tick = 0;        // last use, for LRU (32-bit, renumbered before it wraps)
    uint32_t expires_at = 0;  // expiry ticks; meaningful when duration != 0
    uint32_t heap_at = 0;     // the expiry entry that speaks for this node (ProcessExpired)
    // Whole bytes where they can be: a narrow store followed by a wider load of the same
    // word (refcount++ then a flag test) would defeat store-to-load forwarding.
    uint16_t refcount = 0;
    uint8_t priority = kDefaultPriority;
    uint8_t live : 1 = 0;
    uint8_t queued : 1 = 0;
    uint8_t duration : 6 = 0;  // slot in durations_; 0 = none
  };
  static_assert(sizeof(Node) == 48);
  struct Queue {
    NodeId head = kNoNode;  // least recently used
    NodeId tail = kNoNode;
  };
  struct ExpiryEntry {
    uint32_t at;
    NodeId node;
  };

  static int Idx(Tier t) { return static_cast<int>(t); }
  bool IsDevice(NodeId n) const { return n < num_device_; }
  NodeId Id(Tier t, BlockId b) const { return t == Tier::kDevice ? b : num_device_ + b; }
  bool HasDeviceChild(const Node& x) const { return x.first_child != kNoNode && IsDevice(x.first_child); }
  void Touch(Node& x, TimeNs now);
  void RenumberTicks();

  // Puts n in, or takes it out of, its tier's eviction queue as invariant 7 says.
  void QueueUpdate(NodeId n);
  void QueueInsert(NodeId n);
  void QueueRemove(NodeId n);
  void SetPriority(NodeId n, uint8_t p);
  NodeId Front(int t) const;  // the next victim: lowest priority, least recently used

  // Expiry: 32-bit ticks (config::kExpiryTickNs) since options_.epoch.
  uint32_t NowTicks(TimeNs now) const;
  uint32_t Deadline(TimeNs now, uint32_t slot) const;
  static bool Before(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }
  uint32_t InternDuration(DurationNs d);
  void ReleaseDuration(Node& x);
  void PushExpiry(NodeId n);

  bool EvictOneDevice(std::vector<BlockCopy>* copies, std::vector<EvictedBlock>* out);
  bool EvictOneHost();
  void PrefetchNextVictims(const Node& x) const;
  bool MakeHostRoom(uint8_t priority);
  void RemoveNode(NodeId n);
  void DropHostDescendants(NodeId n);
  void MoveNode(NodeId from, NodeId to);
  NodeId& HeadOf(NodeId parent) { return parent == kNoNode ? root_first_child_ : nodes_[parent].first_child; }
  void LinkChild(NodeId parent, NodeId n);
  void UnlinkChild(NodeId n);

  // Routing groups: whether n ends one, and the end of the group before n's (kNoNode: root).
  bool IsGroupEnd(NodeId n) const {
    return options_.group_blocks == 1 || ((group_end_[n / 64] >> (n % 64)) & 1) != 0;
  }
  void SetGroupEnd(NodeId n, bool on);
  NodeId GroupParent(NodeId n) const;
  void EmitStored(NodeId n);
  void EmitRemoved(BlockHash h, Tier t);
  void EmitUpdated(NodeId n, std::optional<Tier> tier, std::optional<uint8_t> priority);
  void Emit(KvEvent e);
  StoredBlock MakeStoredBlock(NodeId n) const;

  uint32_t index_;
  uint32_t window_;
  Options options_;
  uint32_t block_size_;
  EventList* events_;

  std::array<BlockAllocator, kNumTiers> alloc_;
  uint32_t num_device_;
  std::array<uint32_t, kNumTiers> unpinned_cached_{};

  HugeVector<Node> nodes_;  // [device blocks][host blocks]
  PackedTokens tokens_;     // same entries
  // Same entries: the LoraId a node's KV was computed with; empty until an adapter's block
  // is stored (a worker without adapters pays nothing).
  std::vector<uint64_t> lora_ids_;
  // Same entries: the hash seed of a root child (its cache namespace); others unused.
  std::vector<uint64_t> root_seeds_;
  std::vector<uint64_t> group_end_;  // one bit per node: ends a routing group (group_blocks > 1)
  mutable std::vector<uint8_t> packed_;  // scratch: a query block, packed
  HashIndex hash_index_;
  NodeId root_first_child_ = kNoNode;
  uint32_t live_nodes_ = 0;

  // Per tier and priority, the evictable nodes in LRU order (tick ascending), and a bitmap
  // of the non-empty priorities so the lowest is found in O(1).
  std::array<std::array<Queue, kMaxPriority + 1>, kNumTiers> queues_{};
  std::array<std::array<uint64_t, 2>, kNumTiers> nonempty_{};
  std::array<uint32_t, kNumTiers> queued_{};
  uint32_t tick_ = 0;
  uint64_t version_ = 0;

  // Durations by slot (slot 0 = none) and how many nodes use each.
  std::array<DurationNs, config::kMaxDurationSlots + 1> durations_{};
  std::array<uint32_t, config::kMaxDurationSlots + 1> duration_uses_{};
  std::vector<ExpiryEntry> expiry_;  // min-heap by `at` (modulo 2^32)

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
