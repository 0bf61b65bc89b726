#include "worker/kv/block_pool.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <utility>

#include "common/check.h"

namespace kvfleet::kv {

namespace {
constexpr int kDev = 0;
constexpr int kHost = 1;
// The hash index stays at most this full, so a probe usually ends within two slots.
constexpr double kMaxIndexLoad = 0.7;
}  // namespace

BlockPool::BlockPool(uint32_t index, const PoolLayout& layout, const Options& options, EventBuffer* events)
    : index_(index),
      window_(layout.window),
      options_(options),
      block_size_(options.block_size),
      events_(events),
      alloc_{BlockAllocator(layout.device_blocks), BlockAllocator(layout.host_blocks)} {
  const uint32_t max_nodes = layout.device_blocks + layout.host_blocks;
  for (int t = 0; t < kNumTiers; ++t) {
    const uint32_t n = alloc_[t].num_blocks();
    block_node_[t].assign(n, kNoNode);
    refcount_[t].assign(n, 0);
  }
  nodes_.resize(max_nodes);
  tokens_.resize(size_t{max_nodes} * block_size_);
  free_nodes_.reserve(max_nodes);
  for (uint32_t i = max_nodes; i > 0; --i) free_nodes_.push_back(i - 1);
  const uint64_t slots = std::bit_ceil(static_cast<uint64_t>(max_nodes / kMaxIndexLoad) + 2);
  index_slots_.assign(slots, Slot{0, kNoNode});
  index_shift_ = 64 - std::countr_zero(slots);
}

// ---------------------------------------------------------------- hash index

NodeId BlockPool::FindHash(BlockHash h) const {
  const uint64_t mask = index_slots_.size() - 1;
  for (uint64_t i = Home(h);; i = (i + 1) & mask) {
    const Slot& s = index_slots_[i];
    if (s.node == kNoNode) return kNoNode;
    if (s.hash == h) return s.node;
  }
}

void BlockPool::IndexInsert(BlockHash h, NodeId n) {
  const uint64_t mask = index_slots_.size() - 1;
  uint64_t i = Home(h);
  while (index_slots_[i].node != kNoNode) i = (i + 1) & mask;
  index_slots_[i] = Slot{h, n};
}

void BlockPool::IndexErase(BlockHash h) {
  const uint64_t mask = index_slots_.size() - 1;
  uint64_t i = Home(h);
  while (index_slots_[i].hash != h || index_slots_[i].node == kNoNode) {
    KVF_DCHECK(index_slots_[i].node != kNoNode) << "erasing a hash that is not indexed";
    i = (i + 1) & mask;
  }
  // Backward-shift deletion: move later entries of the probe run into the hole.
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & mask; index_slots_[j].node != kNoNode; j = (j + 1) & mask) {
    const uint64_t home = Home(index_slots_[j].hash);
    // Entry j may move to the hole if its home is not within (hole, j] cyclically.
    const bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!in_range) {
      index_slots_[hole] = index_slots_[j];
      hole = j;
    }
  }
  index_slots_[hole] = Slot{0, kNoNode};
}

// ---------------------------------------------------------------- tree queries

bool BlockPool::SameBlock(NodeId n, NodeId parent, std::span<const TokenId> tokens) const {
  const Node& x = nodes_[n];
  return x.parent == parent && tokens.size() == block_size_ &&
         std::memcmp(TokensOf(n).data(), tokens.data(), tokens.size_bytes()) == 0;
}

NodeId BlockPool::Find(NodeId parent, BlockHash h, std::span<const TokenId> tokens) const {
  const NodeId n = FindHash(h);
  return n != kNoNode && SameBlock(n, parent, tokens) ? n : kNoNode;
}

uint32_t BlockPool::BestPartial(NodeId parent, std::span<const TokenId> want, NodeId* source) const {
  *source = kNoNode;
  uint32_t best = 0;
  NodeId c = parent == kNoNode ? root_first_child_ : nodes_[parent].first_child;
  for (uint32_t scanned = 0; c != kNoNode && scanned < options_.partial_reuse_max_candidates;
       c = nodes_[c].next_sibling, ++scanned) {
    const std::span<const TokenId> have = TokensOf(c);
    uint32_t k = 0;
    while (k < want.size() && have[k] == want[k]) ++k;
    const bool better = k > best || (k == best && k > 0 && nodes_[c].tier == Tier::kDevice &&
                                     nodes_[*source].tier == Tier::kHost);
    if (better) {
      best = k;
      *source = c;
    }
  }
  return best;
}

// ---------------------------------------------------------------- references

void BlockPool::Touch(Node& x, TimeNs now) {
  x.tick = ++tick_;
  if (x.duration > 0) x.expires_at = now + x.duration;
}

void BlockPool::Pin(NodeId n, TimeNs now) {
  Node& x = nodes_[n];
  const int t = Idx(x.tier);
  if (refcount_[t][x.block]++ == 0) --unpinned_cached_[t];
  Touch(x, now);
  QueueUpdate(n);
}

void BlockPool::Unpin(Tier tier, BlockId b, TimeNs now) {
  const int t = Idx(tier);
  KVF_DCHECK(refcount_[t][b] > 0) << "unpinning a free block " << b;
  if (--refcount_[t][b] > 0) return;
  const NodeId n = block_node_[t][b];
  if (n == kNoNode) {
    alloc_[t].Free(b);
    return;
  }
  ++unpinned_cached_[t];
  Touch(nodes_[n], now);
  QueueUpdate(n);
}

void BlockPool::Raise(NodeId n, const BlockRetention& r, TimeNs now) {
  Node& x = nodes_[n];
  if (r.priority > x.priority) {
    x.priority = r.priority;
    x.duration = r.duration;
    ++x.expiry_stamp;  // any queued expiry belongs to the old priority
    x.expires_at = 0;
    if (x.duration > 0) {
      x.expires_at = now + x.duration;
      expiry_.push({x.expires_at, n, x.expiry_stamp});
    }
    EmitUpdated(n, std::nullopt, x.priority);
    QueueUpdate(n);
  } else if (r.priority == x.priority && x.duration > 0) {
    // Same priority: the longer keep wins; no duration means keep for good. The queued
    // expiry entry re-queues itself at the later deadline (ProcessExpired).
    if (r.duration == 0) {
      x.duration = 0;
      x.expires_at = 0;
      ++x.expiry_stamp;
    } else {
      x.duration = std::max(x.duration, r.duration);
      x.expires_at = std::max(x.expires_at, now + x.duration);
    }
  }
}

// ---------------------------------------------------------------- allocation

bool BlockPool::EnsureDeviceFree(uint32_t n, std::vector<BlockCopy>* copies) {
  while (alloc_[kDev].num_free() < n) {
    if (!EvictOneDevice(copies, nullptr)) return false;
  }
  return true;
}

void BlockPool::AllocateDevice(uint32_t n, std::vector<BlockId>* out) {
  const size_t first = out->size();
  alloc_[kDev].Allocate(n, out);
  for (size_t i = first; i < out->size(); ++i) refcount_[kDev][(*out)[i]] = 1;
}

BlockId BlockPool::Onboard(NodeId n, std::vector<BlockCopy>* copies) {
  Node& x = nodes_[n];
  KVF_DCHECK(x.tier == Tier::kHost && refcount_[kHost][x.block] > 0);
  KVF_DCHECK(x.parent == kNoNode || nodes_[x.parent].tier == Tier::kDevice);
  const BlockId hb = x.block;
  const BlockId db = alloc_[kDev].AllocateOne();
  copies->push_back({index_, Tier::kHost, hb, Tier::kDevice, db});
  refcount_[kDev][db] = std::exchange(refcount_[kHost][hb], 0);
  block_node_[kHost][hb] = kNoNode;
  alloc_[kHost].Free(hb);
  block_node_[kDev][db] = n;
  x.tier = Tier::kDevice;
  x.block = db;
  if (x.parent != kNoNode) {
    ++nodes_[x.parent].num_device_children;
    QueueUpdate(x.parent);
  }
  QueueUpdate(n);
  ++onboards_;
  ++version_;
  EmitUpdated(n, Tier::kDevice, std::nullopt);
  return db;
}

NodeId BlockPool::Store(NodeId parent, BlockHash h, std::span<const TokenId> tokens, BlockId b,
                        const BlockRetention& r, TimeNs now) {
  KVF_DCHECK(FindHash(h) == kNoNode);
  KVF_DCHECK(refcount_[kDev][b] > 0 && block_node_[kDev][b] == kNoNode);
  KVF_CHECK(!free_nodes_.empty()) << "node pool exhausted";
  const NodeId n = free_nodes_.back();
  free_nodes_.pop_back();
  if (!free_nodes_.empty()) PrefetchNode(free_nodes_.back());  // the next Store's node and tokens
  Node& x = nodes_[n];
  x = Node{};
  x.hash = h;
  x.block = b;
  x.tier = Tier::kDevice;
  x.priority = r.priority;
  x.duration = r.duration;
  x.live = true;
  ++live_nodes_;
  std::memcpy(&tokens_[size_t{n} * block_size_], tokens.data(), tokens.size_bytes());
  block_node_[kDev][b] = n;
  LinkChild(parent, n);
  IndexInsert(h, n);
  ++version_;
  Touch(x, now);
  if (x.duration > 0) expiry_.push({x.expires_at, n, ++x.expiry_stamp});
  if (parent != kNoNode) QueueUpdate(parent);
  EmitStored(n);
  return n;
}

void BlockPool::LinkChild(NodeId parent, NodeId n) {
  Node& x = nodes_[n];
  x.parent = parent;
  NodeId& head = parent == kNoNode ? root_first_child_ : nodes_[parent].first_child;
  x.prev_sibling = kNoNode;
  x.next_sibling = head;
  if (head != kNoNode) nodes_[head].prev_sibling = n;
  head = n;
  if (parent == kNoNode) {
    ++root_num_children_;
  } else {
    ++nodes_[parent].num_children;
    if (x.tier == Tier::kDevice) ++nodes_[parent].num_device_children;
  }
}

void BlockPool::UnlinkChild(NodeId n) {
  Node& x = nodes_[n];
  NodeId& head = x.parent == kNoNode ? root_first_child_ : nodes_[x.parent].first_child;
  if (x.prev_sibling != kNoNode) {
    nodes_[x.prev_sibling].next_sibling = x.next_sibling;
  } else {
    head = x.next_sibling;
  }
  if (x.next_sibling != kNoNode) nodes_[x.next_sibling].prev_sibling = x.prev_sibling;
  if (x.parent == kNoNode) {
    --root_num_children_;
  } else {
    --nodes_[x.parent].num_children;
    if (x.tier == Tier::kDevice) --nodes_[x.parent].num_device_children;
  }
}

// ---------------------------------------------------------------- eviction queues

void BlockPool::QueueUpdate(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(x.tier);
  const bool want = x.live && refcount_[t][x.block] == 0 &&
                    (t == kDev ? x.num_device_children == 0 : x.num_children == 0);
  if (x.queued) {
    if (want && x.queued_priority == x.priority) return;
    QueueRemove(n);
  }
  if (want) QueueInsert(n);
}

void BlockPool::QueueInsert(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(x.tier);
  Queue& q = queues_[t][x.priority];
  NodeId before;  // insert x before this node (kNoNode: at the tail)
  if (q.tail == kNoNode || nodes_[q.tail].tick <= x.tick) {
    before = kNoNode;  // the common case: released just now
  } else if (nodes_[q.head].tick >= x.tick) {
    before = q.head;
  } else {
    // A parent that became a leaf goes in at its own last use. Search from both ends; it
    // is usually close to one of them.
    NodeId a = q.head;
    NodeId b = q.tail;
    for (;;) {
      a = nodes_[a].lru_next;
      if (nodes_[a].tick > x.tick) {
        before = a;
        break;
      }
      b = nodes_[b].lru_prev;
      if (nodes_[b].tick < x.tick) {
        before = nodes_[b].lru_next;
        break;
      }
    }
  }
  x.lru_next = before;
  x.lru_prev = before == kNoNode ? q.tail : nodes_[before].lru_prev;
  if (x.lru_prev == kNoNode) {
    q.head = n;
  } else {
    nodes_[x.lru_prev].lru_next = n;
  }
  if (before == kNoNode) {
    q.tail = n;
  } else {
    nodes_[before].lru_prev = n;
  }
  x.queued = true;
  x.queued_priority = x.priority;
  nonempty_[t][x.priority / 64] |= uint64_t{1} << (x.priority % 64);
  ++queued_[t];
}

void BlockPool::QueueRemove(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(x.tier);
  Queue& q = queues_[t][x.queued_priority];
  if (x.lru_prev == kNoNode) {
    q.head = x.lru_next;
  } else {
    nodes_[x.lru_prev].lru_next = x.lru_next;
  }
  if (x.lru_next == kNoNode) {
    q.tail = x.lru_prev;
  } else {
    nodes_[x.lru_next].lru_prev = x.lru_prev;
  }
  if (q.head == kNoNode) nonempty_[t][x.queued_priority / 64] &= ~(uint64_t{1} << (x.queued_priority % 64));
  x.queued = false;
  x.lru_prev = x.lru_next = kNoNode;
  --queued_[t];
}

NodeId BlockPool::Front(int t) const {
  for (int w = 0; w < 2; ++w) {
    if (nonempty_[t][w] != 0) return queues_[t][w * 64 + std::countr_zero(nonempty_[t][w])].head;
  }
  return kNoNode;
}

// ---------------------------------------------------------------- eviction

uint32_t BlockPool::EvictDevice(uint32_t n, std::vector<BlockCopy>* copies, std::vector<EvictedBlock>* out) {
  uint32_t done = 0;
  while (done < n && EvictOneDevice(copies, out)) ++done;
  return done;
}

bool BlockPool::MakeHostRoom(uint8_t priority) {
  if (!options_.enable_offload || alloc_[kHost].num_blocks() == 0 || priority < options_.offload_min_priority) {
    return false;
  }
  if (alloc_[kHost].num_free() > 0) return true;
  // Only a host block of lower or equal priority gives way to this one.
  const NodeId victim = Front(kHost);
  if (victim == kNoNode || nodes_[victim].priority > priority) return false;
  return EvictOneHost();
}

bool BlockPool::EvictOneDevice(std::vector<BlockCopy>* copies, std::vector<EvictedBlock>* out) {
  const NodeId n = Front(kDev);
  if (n == kNoNode) return false;
  Node& x = nodes_[n];
  PrefetchNextVictims(x);
  const uint8_t prio = x.priority;
  ++evictions_[kDev][prio];
  if (MakeHostRoom(prio)) {
    const BlockId db = x.block;
    const BlockId hb = alloc_[kHost].AllocateOne();
    copies->push_back({index_, Tier::kDevice, db, Tier::kHost, hb});
    QueueRemove(n);
    block_node_[kDev][db] = kNoNode;
    alloc_[kDev].Free(db);
    --unpinned_cached_[kDev];
    x.tier = Tier::kHost;
    x.block = hb;
    block_node_[kHost][hb] = n;
    ++unpinned_cached_[kHost];
    if (x.parent != kNoNode) {
      --nodes_[x.parent].num_device_children;
      QueueUpdate(x.parent);
    }
    QueueUpdate(n);
    ++offloads_;
    ++version_;
    EmitUpdated(n, Tier::kHost, std::nullopt);
    if (out) out->push_back({index_, x.hash, prio, true});
    return true;
  }
  const BlockHash h = x.hash;
  DropHostDescendants(n);
  RemoveNode(n);
  if (out) out->push_back({index_, h, prio, false});
  return true;
}

void BlockPool::PrefetchNextVictims(const Node& x) const {
  // The next victim is usually x's parent (a chain is evicted leaf first) or the next in
  // x's queue; start loading their index slots, the one cache miss of a removal.
  if (x.parent != kNoNode) PrefetchSlot(nodes_[x.parent].hash);
  if (x.lru_next != kNoNode) PrefetchSlot(nodes_[x.lru_next].hash);
}

bool BlockPool::EvictOneHost() {
  const NodeId n = Front(kHost);
  if (n == kNoNode) return false;
  PrefetchNextVictims(nodes_[n]);
  ++evictions_[kHost][nodes_[n].priority];
  RemoveNode(n);
  return true;
}

void BlockPool::DropHostDescendants(NodeId top) {
  // Post-order walk: every node below `top` is on the host (invariant 5) and unreferenced.
  NodeId c = nodes_[top].first_child;
  while (c != kNoNode) {
    if (nodes_[c].first_child != kNoNode) {
      c = nodes_[c].first_child;
      continue;
    }
    const NodeId parent = nodes_[c].parent;
    ++evictions_[kHost][nodes_[c].priority];
    RemoveNode(c);
    c = parent == top ? nodes_[top].first_child : parent;
  }
}

void BlockPool::RemoveNode(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(x.tier);
  KVF_DCHECK(x.num_children == 0 && refcount_[t][x.block] == 0);
  if (x.queued) QueueRemove(n);
  const NodeId parent = x.parent;
  UnlinkChild(n);
  IndexErase(x.hash);
  block_node_[t][x.block] = kNoNode;
  alloc_[t].Free(x.block);
  --unpinned_cached_[t];
  EmitRemoved(x.hash, x.tier);
  x.live = false;
  ++x.expiry_stamp;
  --live_nodes_;
  free_nodes_.push_back(n);
  ++version_;
  if (parent != kNoNode) QueueUpdate(parent);
}

void BlockPool::ProcessExpired(TimeNs now) {
  while (!expiry_.empty() && expiry_.top().at <= now) {
    const ExpiryEntry e = expiry_.top();
    expiry_.pop();
    Node& x = nodes_[e.node];
    if (!x.live || x.expiry_stamp != e.stamp || x.expires_at == 0) continue;
    if (x.expires_at > now) {  // used since: wait for the new deadline
      expiry_.push({x.expires_at, e.node, ++x.expiry_stamp});
      continue;
    }
    x.expires_at = 0;
    x.duration = 0;
    if (x.priority != kDefaultPriority) {
      x.priority = kDefaultPriority;
      EmitUpdated(e.node, std::nullopt, x.priority);
      QueueUpdate(e.node);
    }
  }
}

void BlockPool::Clear() {
  for (NodeId n = 0; n < nodes_.size(); ++n) {
    Node& x = nodes_[n];
    if (!x.live) continue;
    const int t = Idx(x.tier);
    KVF_CHECK_EQ(refcount_[t][x.block], 0u) << "Clear() with a held block";
    block_node_[t][x.block] = kNoNode;
    alloc_[t].Free(x.block);
    x.live = false;
    x.queued = false;
    ++x.expiry_stamp;
  }
  free_nodes_.clear();
  for (uint32_t i = static_cast<uint32_t>(nodes_.size()); i > 0; --i) free_nodes_.push_back(i - 1);
  std::fill(index_slots_.begin(), index_slots_.end(), Slot{0, kNoNode});
  queues_ = {};
  nonempty_ = {};
  queued_ = {};
  root_first_child_ = kNoNode;
  root_num_children_ = 0;
  live_nodes_ = 0;
  unpinned_cached_ = {};
  ++version_;
  CloseEvents();
  Emit(KvEvent{window_, ClearedEvent{}});
}

// ---------------------------------------------------------------- events

void BlockPool::Emit(KvEvent e) { events_->Push(std::move(e)); }

void BlockPool::CloseEvents() {
  if (pending_) {
    Emit(std::move(*pending_));
    pending_.reset();
  }
  pending_last_ = kNoNode;
}

void BlockPool::EmitStored(NodeId n) {
  if (!events_->enabled()) return;
  const Node& x = nodes_[n];
  StoredBlock b;
  b.hash = x.hash;
  if (options_.include_tokens) b.tokens.assign(TokensOf(n).begin(), TokensOf(n).end());
  b.tier = x.tier;
  b.priority = x.priority;
  const bool extend = pending_ && std::holds_alternative<StoredEvent>(pending_->data) && pending_last_ == x.parent &&
                      x.parent != kNoNode;
  if (!extend) {
    CloseEvents();
    pending_ = KvEvent{window_, StoredEvent{x.parent == kNoNode ? 0 : nodes_[x.parent].hash, {}}};
  }
  std::get<StoredEvent>(pending_->data).blocks.push_back(std::move(b));
  pending_last_ = n;
}

void BlockPool::EmitRemoved(BlockHash h, Tier t) {
  if (!events_->enabled()) return;
  const bool extend = pending_ && std::holds_alternative<RemovedEvent>(pending_->data) &&
                      std::get<RemovedEvent>(pending_->data).tier == t;
  if (!extend) {
    CloseEvents();
    pending_ = KvEvent{window_, RemovedEvent{{}, t}};
  }
  std::get<RemovedEvent>(pending_->data).hashes.push_back(h);
}

void BlockPool::EmitUpdated(NodeId n, std::optional<Tier> tier, std::optional<uint8_t> priority) {
  if (!events_->enabled()) return;
  CloseEvents();
  Emit(KvEvent{window_, UpdatedEvent{nodes_[n].hash, tier, priority}});
}

void BlockPool::Snapshot(std::vector<KvEvent>* out) const {
  for (const Tier tier : {Tier::kDevice, Tier::kHost}) {
    // Pre-order walk: a parent comes before its children. Device nodes form a rooted
    // subtree (invariant 5), so the device pass never needs to look below a host node.
    std::vector<NodeId> stack;
    for (NodeId c = root_first_child_; c != kNoNode; c = nodes_[c].next_sibling) stack.push_back(c);
    StoredEvent* cur = nullptr;
    NodeId last = kNoNode;
    while (!stack.empty()) {
      const NodeId n = stack.back();
      stack.pop_back();
      const Node& x = nodes_[n];
      if (tier == Tier::kDevice && x.tier == Tier::kHost) continue;
      if (x.tier == tier) {
        if (cur == nullptr || last == kNoNode || x.parent != last) {
          out->push_back(KvEvent{window_, StoredEvent{x.parent == kNoNode ? 0 : nodes_[x.parent].hash, {}}});
          cur = &std::get<StoredEvent>(out->back().data);
        }
        StoredBlock b;
        b.hash = x.hash;
        if (options_.include_tokens) b.tokens.assign(TokensOf(n).begin(), TokensOf(n).end());
        b.tier = x.tier;
        b.priority = x.priority;
        cur->blocks.push_back(std::move(b));
        last = n;
      }
      for (NodeId c = x.first_child; c != kNoNode; c = nodes_[c].next_sibling) stack.push_back(c);
    }
  }
}

// ---------------------------------------------------------------- stats and checks

void BlockPool::FillStats(PoolStats* s) const {
  s->window = window_;
  for (int t = 0; t < kNumTiers; ++t) {
    TierStats& ts = s->tiers[t];
    ts.total = alloc_[t].num_blocks();
    ts.free = alloc_[t].num_free();
    ts.cached = unpinned_cached_[t];
    ts.in_use = ts.total - ts.free - ts.cached;
    ts.evictable = unpinned_cached_[t];
    ts.evictions_by_priority = evictions_[t];
  }
  s->offloads = offloads_;
  s->onboards = onboards_;
  s->partial_copies = partial_copies_;
}

size_t BlockPool::MemoryBytes() const {
  size_t bytes = nodes_.capacity() * sizeof(Node) + tokens_.capacity() * sizeof(TokenId) +
                 free_nodes_.capacity() * sizeof(NodeId) + index_slots_.capacity() * sizeof(Slot);
  for (int t = 0; t < kNumTiers; ++t) {
    const size_t n = alloc_[t].num_blocks();
    bytes += block_node_[t].capacity() * sizeof(NodeId) + refcount_[t].capacity() * sizeof(uint32_t) +
             n * (sizeof(BlockId) + 1);  // allocator stack + flag
  }
  return bytes;
}

Status BlockPool::CheckInvariants() const {
  auto fail = [&](const std::string& what) { return Internal("pool " + std::to_string(index_) + ": " + what); };
  for (int t = 0; t < kNumTiers; ++t) KVF_RETURN_IF_ERROR(alloc_[t].CheckInvariants());
  std::array<uint32_t, kNumTiers> cached{};
  std::array<uint32_t, kNumTiers> in_use{};
  // Invariant 2: free iff refcount 0 and outside the tree.
  for (int t = 0; t < kNumTiers; ++t) {
    for (BlockId b = 0; b < alloc_[t].num_blocks(); ++b) {
      const bool free = alloc_[t].IsFree(b);
      const bool in_tree = block_node_[t][b] != kNoNode;
      const uint32_t rc = refcount_[t][b];
      if (free != (rc == 0 && !in_tree)) {
        return fail("invariant 2: block " + std::to_string(b) + " of tier " + TierName(Tier(t)) +
                    " free=" + std::to_string(free) + " refcount=" + std::to_string(rc) +
                    " in_tree=" + std::to_string(in_tree));
      }
      if (rc > 0) ++in_use[t];
      if (rc == 0 && in_tree) ++cached[t];
      if (in_tree) {
        const Node& x = nodes_[block_node_[t][b]];
        if (!x.live || x.block != b || Idx(x.tier) != t) return fail("block/node link broken at block " + std::to_string(b));
      }
    }
    // Invariant 1.
    if (alloc_[t].num_free() + in_use[t] + cached[t] != alloc_[t].num_blocks()) {
      return fail("invariant 1: free + in_use + cached != total");
    }
    if (cached[t] != unpinned_cached_[t]) return fail("cached counter disagrees");
  }
  // Invariant 4: links, counts, index. Invariant 5: device parents.
  uint32_t live = 0;
  uint32_t root_children = 0;
  for (NodeId c = root_first_child_; c != kNoNode; c = nodes_[c].next_sibling) {
    if (nodes_[c].parent != kNoNode) return fail("root child with a parent");
    ++root_children;
  }
  if (root_children != root_num_children_) return fail("root child count");
  for (NodeId n = 0; n < nodes_.size(); ++n) {
    const Node& x = nodes_[n];
    if (!x.live) continue;
    ++live;
    const int t = Idx(x.tier);
    if (block_node_[t][x.block] != n) return fail("node " + std::to_string(n) + " not owning its block");
    if (FindHash(x.hash) != n) return fail("invariant 4: node not in the hash index under its hash");
    uint32_t children = 0;
    uint32_t dev_children = 0;
    NodeId prev = kNoNode;
    for (NodeId c = x.first_child; c != kNoNode; c = nodes_[c].next_sibling) {
      if (!nodes_[c].live || nodes_[c].parent != n || nodes_[c].prev_sibling != prev) {
        return fail("invariant 4: child list broken");
      }
      ++children;
      if (nodes_[c].tier == Tier::kDevice) ++dev_children;
      prev = c;
    }
    if (children != x.num_children || dev_children != x.num_device_children) return fail("invariant 4: child counts");
    if (x.tier == Tier::kDevice && x.parent != kNoNode && nodes_[x.parent].tier != Tier::kDevice) {
      return fail("invariant 5: device node under a host node");
    }
    // Invariant 6 (the pool's part): a held node's parent is held.
    if (refcount_[t][x.block] > 0 && x.parent != kNoNode) {
      const Node& p = nodes_[x.parent];
      if (refcount_[Idx(p.tier)][p.block] == 0) return fail("invariant 6: held node under an unheld parent");
    }
    // Invariant 7.
    const bool want = refcount_[t][x.block] == 0 && (t == kDev ? x.num_device_children == 0 : x.num_children == 0);
    if (want != x.queued) return fail("invariant 7: node " + std::to_string(n) + " eviction-queue membership");
    if (x.queued && x.queued_priority != x.priority) return fail("invariant 7: queued under a stale priority");
  }
  if (live != live_nodes_) return fail("live node count");
  if (live + free_nodes_.size() != nodes_.size()) return fail("node free list");
  for (int t = 0; t < kNumTiers; ++t) {
    uint32_t members = 0;
    for (int p = 0; p <= kMaxPriority; ++p) {
      const Queue& q = queues_[t][p];
      const bool bit = (nonempty_[t][p / 64] >> (p % 64)) & 1;
      if (bit != (q.head != kNoNode)) return fail("invariant 7: non-empty bitmap");
      NodeId prev = kNoNode;
      for (NodeId c = q.head; c != kNoNode; prev = c, c = nodes_[c].lru_next) {
        const Node& y = nodes_[c];
        if (!y.live || !y.queued || Idx(y.tier) != t || y.priority != p || y.lru_prev != prev) {
          return fail("invariant 7: eviction queue links");
        }
        if (prev != kNoNode && nodes_[prev].tick >= y.tick) return fail("invariant 7: queue not in LRU order");
        ++members;
      }
      if (q.tail != prev) return fail("invariant 7: queue tail");
    }
    if (members != queued_[t]) return fail("invariant 7: queue sizes");
  }
  size_t indexed = 0;
  for (const Slot& s : index_slots_) indexed += s.node != kNoNode;
  if (indexed != live) return fail("invariant 4: hash index size");
  return Status::Ok();
}

}  // namespace kvfleet::kv
