// BlockPool, part 2: the eviction queues, retention expiry and eviction (drop or offload
// to the host tier). block_pool.h describes the pool; block_pool.cc holds its tree
// queries, references, allocation, child lists, events and checks.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#include "worker/kv/block_pool.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "common/check.h"

namespace kvfleet::kv {

namespace {
constexpr int kDev = 0;
constexpr int kHost = 1;
}  // namespace

// ---------------------------------------------------------------- eviction queues

void BlockPool::QueueUpdate(NodeId n) {
  Node& x = nodes_[n];
  const bool want = x.live && x.refcount == 0 && (IsDevice(n) ? !HasDeviceChild(x) : x.first_child == kNoNode);
  if (x.queued) {
    if (want) return;
    QueueRemove(n);
  }
  if (want) QueueInsert(n);
}

void BlockPool::SetPriority(NodeId n, uint8_t p) {
  Node& x = nodes_[n];
  if (x.queued) QueueRemove(n);  // the queue is per priority
  x.priority = p;
  QueueUpdate(n);
}

void BlockPool::QueueInsert(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(tier(n));
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
  x.queued = 1;
  nonempty_[t][x.priority / 64] |= uint64_t{1} << (x.priority % 64);
  ++queued_[t];
}

void BlockPool::QueueRemove(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(tier(n));
  Queue& q = queues_[t][x.priority];
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
  if (q.head == kNoNode) nonempty_[t][x.priority / 64] &= ~(uint64_t{1} << (x.priority % 64));
  x.queued = 0;
  x.lru_prev = x.lru_next = kNoNode;
  --queued_[t];
}

NodeId BlockPool::Front(int t) const {
  for (int w = 0; w < 2; ++w) {
    if (nonempty_[t][w] != 0) return queues_[t][w * 64 + std::countr_zero(nonempty_[t][w])].head;
  }
  return kNoNode;
}

// ---------------------------------------------------------------- expiry

uint32_t BlockPool::NowTicks(TimeNs now) const {
  return static_cast<uint32_t>(static_cast<uint64_t>(now - options_.epoch) / config::kExpiryTickNs);
}

uint32_t BlockPool::Deadline(TimeNs now, uint32_t slot) const {
  // Rounded up, so a block never falls back early.
  const uint64_t since = static_cast<uint64_t>(now - options_.epoch) + static_cast<uint64_t>(durations_[slot]);
  return static_cast<uint32_t>((since + config::kExpiryTickNs - 1) / config::kExpiryTickNs);
}

uint32_t BlockPool::InternDuration(DurationNs d) {
  if (d <= 0) return 0;
  d = std::min<DurationNs>(d, DurationNs{config::kMaxDurationTicks} * config::kExpiryTickNs);
  uint32_t free_slot = 0;
  uint32_t longer = 0;   // the shortest duration in use that is longer than d
  uint32_t longest = 0;  // the longest duration in use
  for (uint32_t s = 1; s <= config::kMaxDurationSlots; ++s) {
    if (duration_uses_[s] == 0) {
      if (free_slot == 0) free_slot = s;
      continue;
    }
    if (durations_[s] == d) {
      ++duration_uses_[s];
      return s;
    }
    if (durations_[s] > d && (longer == 0 || durations_[s] < durations_[longer])) longer = s;
    if (longest == 0 || durations_[s] > durations_[longest]) longest = s;
  }
  const uint32_t s = free_slot != 0 ? free_slot : (longer != 0 ? longer : longest);
  durations_[s] = free_slot != 0 ? d : durations_[s];
  ++duration_uses_[s];
  return s;
}

void BlockPool::ReleaseDuration(Node& x) {
  if (x.duration == 0) return;
  --duration_uses_[x.duration];
  x.duration = 0;
}

void BlockPool::PushExpiry(NodeId n) {
  // This entry now speaks for n; older entries of n find heap_at changed and drop out.
  Node& x = nodes_[n];
  x.heap_at = x.expires_at;
  expiry_.push_back({x.expires_at, n});
  std::push_heap(expiry_.begin(), expiry_.end(),
                 [](const ExpiryEntry& a, const ExpiryEntry& b) { return Before(b.at, a.at); });
}

void BlockPool::ProcessExpired(TimeNs now) {
  const uint32_t now_ticks = NowTicks(now);
  const auto later = [](const ExpiryEntry& a, const ExpiryEntry& b) { return Before(b.at, a.at); };
  while (!expiry_.empty() && !Before(now_ticks, expiry_.front().at)) {
    std::pop_heap(expiry_.begin(), expiry_.end(), later);
    const ExpiryEntry e = expiry_.back();
    expiry_.pop_back();
    Node& x = nodes_[e.node];
    if (!x.live || x.duration == 0 || x.heap_at != e.at) continue;  // stale
    if (Before(now_ticks, x.expires_at)) {  // used since: wait for the new deadline
      PushExpiry(e.node);
      continue;
    }
    ReleaseDuration(x);
    if (x.priority != kDefaultPriority) {
      SetPriority(e.node, kDefaultPriority);
      EmitUpdated(e.node, std::nullopt, kDefaultPriority);
    }
  }
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
  PrefetchNextVictims(nodes_[n]);
  const uint8_t prio = priority(n);
  const BlockHash h = nodes_[n].hash;
  ++evictions_[kDev][prio];
  if (MakeHostRoom(prio)) {
    const BlockId hb = alloc_[kHost].AllocateOne();
    if (alloc_[kHost].num_free() > 0) {  // the next offload writes this entry: start loading it
      const NodeId next = Id(Tier::kHost, alloc_[kHost].PeekOne());
      PrefetchAddress(&nodes_[next]);
      PrefetchAddress(tokens_.data(next));
      PrefetchAddress(tokens_.data(next) + tokens_.stride() - 1);
    }
    const NodeId m = Id(Tier::kHost, hb);
    copies->push_back({index_, Tier::kDevice, n, Tier::kHost, hb});
    QueueRemove(n);
    --unpinned_cached_[kDev];
    MoveNode(n, m);
    alloc_[kDev].Free(n);
    ++unpinned_cached_[kHost];
    QueueUpdate(m);
    ++offloads_;
    ++version_;
    EmitUpdated(m, Tier::kHost, std::nullopt);
    if (out) out->push_back({index_, h, prio, true});
    return true;
  }
  DropHostDescendants(n);
  RemoveNode(n);
  if (out) out->push_back({index_, h, prio, false});
  return true;
}

void BlockPool::PrefetchNextVictims(const Node& x) const {
  // A chain is evicted leaf first: the next victim is usually x's parent p, then p's parent.
  // p's node was prefetched one eviction ago, so its hash is at hand: start loading p's
  // index bucket and its parent's node now, two steps of misses in flight. The next in x's
  // queue is the other likely victim.
  PrefetchSlot(x.hash);  // needed at once; in flight already when x was the parent
  if (x.parent != kNoNode) {
    const Node& p = nodes_[x.parent];
    PrefetchSlot(p.hash);
    if (p.parent != kNoNode) PrefetchAddress(&nodes_[p.parent]);
  }
  if (x.lru_next != kNoNode) PrefetchAddress(&nodes_[x.lru_next]);
}

bool BlockPool::EvictOneHost() {
  const NodeId n = Front(kHost);
  if (n == kNoNode) return false;
  PrefetchNextVictims(nodes_[n]);
  ++evictions_[kHost][priority(n)];
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
    ++evictions_[kHost][priority(c)];
    RemoveNode(c);
    c = parent == top ? nodes_[top].first_child : parent;
  }
}

void BlockPool::RemoveNode(NodeId n) {
  Node& x = nodes_[n];
  const int t = Idx(tier(n));
  KVF_DCHECK(x.first_child == kNoNode && x.refcount == 0);
  if (x.queued) QueueRemove(n);
  const NodeId parent = x.parent;
  const BlockHash h = x.hash;
  const bool group_end = IsGroupEnd(n);
  SetGroupEnd(n, false);
  UnlinkChild(n);
  hash_index_.Erase(h, n);
  ReleaseDuration(x);
  x = Node{};
  alloc_[t].Free(block(n));
  --unpinned_cached_[t];
  if (group_end) EmitRemoved(h, tier(n));
  --live_nodes_;
  ++version_;
  if (parent != kNoNode) QueueUpdate(parent);
}

void BlockPool::Clear() {
  for (NodeId n = 0; n < nodes_.size(); ++n) {
    KVF_CHECK_EQ(uint32_t{nodes_[n].refcount}, 0u) << "Clear() with a held block";
  }
  std::fill(nodes_.begin(), nodes_.end(), Node{});
  alloc_ = {BlockAllocator(alloc_[kDev].num_blocks()), BlockAllocator(alloc_[kHost].num_blocks())};
  hash_index_.Clear();
  std::fill(group_end_.begin(), group_end_.end(), 0);
  queues_ = {};
  nonempty_ = {};
  queued_ = {};
  root_first_child_ = kNoNode;
  live_nodes_ = 0;
  unpinned_cached_ = {};
  durations_ = {};
  duration_uses_ = {};
  expiry_.clear();
  ++version_;
  CloseEvents();
  Emit(KvEvent{window_, ClearedEvent{}});
}

}  // namespace kvfleet::kv
