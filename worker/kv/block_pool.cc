// BlockPool, part 1: tree queries, references, allocation, child lists, events, snapshots
// and checks. block_pool.h describes the pool; block_pool_eviction.cc holds its eviction
// queues, retention expiry and eviction.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#include "worker/kv/block_pool.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/check.h"

namespace kvfleet::kv {

namespace {
constexpr int kDev = 0;
constexpr int kHost = 1;
}  // namespace

BlockPool::BlockPool(uint32_t index, const PoolLayout& layout, const Options& options, EventList* events)
    : index_(index),
      window_(layout.window),
      options_(options),
      block_size_(options.block_size),
      events_(events),
      alloc_{BlockAllocator(layout.device_blocks), BlockAllocator(layout.host_blocks)},
      num_device_(layout.device_blocks),
      nodes_(size_t{layout.device_blocks} + layout.host_blocks),
      tokens_(layout.device_blocks + layout.host_blocks, options.block_size, options.vocab_size),
      group_end_(options.group_blocks > 1 ? (nodes_.size() + 63) / 64 : 0),
      packed_(tokens_.buffer_bytes()),
      hash_index_(layout.device_blocks + layout.host_blocks),
      tick_(options.first_lru_tick) {
  root_seeds_.assign(nodes_.size(), 0);
}

// ---------------------------------------------------------------- tree queries

bool BlockPool::PrefetchCandidate(BlockHash h) const {
  const NodeId n = hash_index_.Candidate(h);
  if (n == kNoNode) return false;
  __builtin_prefetch(&nodes_[n]);
  const uint8_t* t = tokens_.data(n);
  __builtin_prefetch(t);
  __builtin_prefetch(t + tokens_.stride() - 1);
  return true;
}

bool BlockPool::SameBlock(NodeId n, NodeId parent, std::span<const TokenId> tokens) const {
  return nodes_[n].parent == parent && tokens_.Pack(tokens, packed_.data()) && tokens_.Equals(n, packed_.data());
}

NodeId BlockPool::Find(NodeId parent, BlockHash h, std::span<const TokenId> tokens) const {
  const NodeId n = FindHash(h);
  return n != kNoNode && SameBlock(n, parent, tokens) ? n : kNoNode;
}

uint32_t BlockPool::BestPartial(NodeId parent, std::span<const TokenId> want, uint64_t seed, NodeId* source) const {
  *source = kNoNode;
  uint32_t best = 0;
  NodeId c = parent == kNoNode ? root_first_child_ : nodes_[parent].first_child;
  for (uint32_t scanned = 0; c != kNoNode && scanned < options_.partial_reuse_max_candidates;
       c = nodes_[c].next_sibling, ++scanned) {
    // Another namespace's block (another adapter or cache_salt) holds other KV for the same tokens.
    if (parent == kNoNode && root_seeds_[c] != seed) continue;
    const uint32_t k = tokens_.CommonPrefix(c, want);
    const bool better = k > best || (k == best && k > 0 && IsDevice(c) && !IsDevice(*source));
    if (better) {
      best = k;
      *source = c;
    }
  }
  return best;
}

// ---------------------------------------------------------------- references

void BlockPool::Touch(Node& x, TimeNs now) {
  if (tick_ == UINT32_MAX) RenumberTicks();
  x.tick = ++tick_;
  if (x.duration != 0) x.expires_at = Deadline(now, x.duration);
}

void BlockPool::RenumberTicks() {
  // The 32-bit use counter is about to wrap: renumber live nodes 1..n in use order, which
  // keeps every LRU comparison the same. Once per ~4 billion uses.
  std::vector<std::pair<uint32_t, NodeId>> order;
  order.reserve(live_nodes_);
  for (NodeId n = 0; n < nodes_.size(); ++n) {
    if (nodes_[n].live) order.emplace_back(nodes_[n].tick, n);
  }
  std::sort(order.begin(), order.end());
  tick_ = 0;
  for (const auto& [tick, n] : order) nodes_[n].tick = ++tick_;
}

void BlockPool::Pin(NodeId n, TimeNs now) {
  Node& x = nodes_[n];
  KVF_CHECK_LT(uint32_t{x.refcount}, config::kMaxRefcount) << "too many sequences share block " << n;
  if (x.refcount++ == 0) --unpinned_cached_[Idx(tier(n))];
  Touch(x, now);
  QueueUpdate(n);
}

void BlockPool::Unpin(Tier t, BlockId b, TimeNs now) {
  const NodeId n = Id(t, b);
  Node& x = nodes_[n];
  KVF_DCHECK(x.refcount > 0) << "unpinning a free block " << b;
  if (--x.refcount > 0) return;
  if (!x.live) {
    alloc_[Idx(t)].Free(b);
    return;
  }
  ++unpinned_cached_[Idx(t)];
  Touch(x, now);
  QueueUpdate(n);
}

void BlockPool::Raise(NodeId n, const BlockRetention& r, TimeNs now) {
  Node& x = nodes_[n];
  if (r.priority > x.priority) {
    ReleaseDuration(x);
    x.duration = InternDuration(r.duration);
    if (x.duration != 0) {
      x.expires_at = Deadline(now, x.duration);
      PushExpiry(n);
    }
    SetPriority(n, r.priority);
    EmitUpdated(n, std::nullopt, r.priority);
  } else if (r.priority == x.priority && x.duration != 0) {
    // Same priority: the longer keep wins; no duration means keep for good. The node's
    // expiry entry re-queues itself at a later deadline (ProcessExpired).
    const DurationNs have = durations_[x.duration];
    if (r.duration == 0) {
      ReleaseDuration(x);
    } else if (r.duration > have) {
      ReleaseDuration(x);
      x.duration = InternDuration(r.duration);
      const uint32_t deadline = Deadline(now, x.duration);
      if (Before(x.expires_at, deadline)) x.expires_at = deadline;
      if (Before(x.expires_at, x.heap_at)) PushExpiry(n);  // rounding picked a shorter slot
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
  for (size_t i = first; i < out->size(); ++i) nodes_[(*out)[i]].refcount = 1;
}

BlockId BlockPool::AllocateDeviceAfter(BlockId prev) {
  const BlockId b = alloc_[kDev].AllocateAfter(prev);
  nodes_[b].refcount = 1;
  return b;
}

NodeId BlockPool::Onboard(NodeId n, std::vector<BlockCopy>* copies) {
  KVF_DCHECK(!IsDevice(n) && nodes_[n].refcount > 0);
  KVF_DCHECK(nodes_[n].parent == kNoNode || IsDevice(nodes_[n].parent));
  const BlockId hb = block(n);
  const NodeId d = alloc_[kDev].AllocateOne();
  copies->push_back({index_, Tier::kHost, hb, Tier::kDevice, d});
  MoveNode(n, d);
  alloc_[kHost].Free(hb);
  QueueUpdate(d);
  ++onboards_;
  ++version_;
  EmitUpdated(d, Tier::kDevice, std::nullopt);
  return d;
}

NodeId BlockPool::Store(NodeId parent, BlockHash h, std::span<const TokenId> tokens, BlockId b,
                        const BlockRetention& r, TimeNs now, bool group_end, uint64_t lora_id, uint64_t seed) {
  KVF_DCHECK(FindHash(h) == kNoNode);
  Node& x = nodes_[b];
  KVF_DCHECK(x.refcount > 0 && !x.live);
  if (!tokens_.Pack(tokens, packed_.data())) return kNoNode;
  tokens_.Set(b, packed_.data());
  Node y;  // assembled here and written once
  y.hash = h;
  y.refcount = x.refcount;
  y.priority = r.priority;
  y.duration = r.duration > 0 ? InternDuration(r.duration) : 0;
  y.live = 1;
  x = y;
  if (lora_id != 0 && lora_ids_.empty()) lora_ids_.assign(nodes_.size(), 0);
  if (!lora_ids_.empty()) lora_ids_[b] = lora_id;
  root_seeds_[b] = parent == kNoNode ? seed : 0;
  ++live_nodes_;
  LinkChild(parent, b);
  hash_index_.Insert(h, b);
  ++version_;
  Touch(x, now);
  if (x.duration != 0) PushExpiry(b);
  if (parent != kNoNode) QueueUpdate(parent);
  SetGroupEnd(b, group_end);
  EmitStored(b);
  return b;
}

// ---------------------------------------------------------------- child lists

void BlockPool::LinkChild(NodeId parent, NodeId n) {
  Node& x = nodes_[n];
  x.parent = parent;
  NodeId& head = HeadOf(parent);
  if (head == kNoNode) {
    x.next_sibling = kNoNode;
    x.prev_sibling = n;
    head = n;
  } else if (IsDevice(n)) {  // invariant 9: device children first
    x.next_sibling = head;
    x.prev_sibling = nodes_[head].prev_sibling;
    nodes_[head].prev_sibling = n;
    head = n;
  } else {
    const NodeId tail = nodes_[head].prev_sibling;
    nodes_[tail].next_sibling = n;
    x.prev_sibling = tail;
    x.next_sibling = kNoNode;
    nodes_[head].prev_sibling = n;
  }
}

void BlockPool::UnlinkChild(NodeId n) {
  Node& x = nodes_[n];
  NodeId& head = HeadOf(x.parent);
  if (head == n) {
    head = x.next_sibling;
    if (head != kNoNode) nodes_[head].prev_sibling = x.prev_sibling;
  } else {
    nodes_[x.prev_sibling].next_sibling = x.next_sibling;
    if (x.next_sibling != kNoNode) {
      nodes_[x.next_sibling].prev_sibling = x.prev_sibling;
    } else {
      nodes_[head].prev_sibling = x.prev_sibling;  // n was the tail
    }
  }
  x.next_sibling = x.prev_sibling = kNoNode;
}

void BlockPool::MoveNode(NodeId from, NodeId to) {
  KVF_DCHECK(!nodes_[from].queued && !nodes_[to].live && nodes_[to].refcount == 0);
  const NodeId parent = nodes_[from].parent;
  UnlinkChild(from);
  nodes_[to] = nodes_[from];
  nodes_[from] = Node{};
  tokens_.Copy(from, to);
  if (!lora_ids_.empty()) lora_ids_[to] = std::exchange(lora_ids_[from], 0);
  root_seeds_[to] = std::exchange(root_seeds_[from], 0);
  Node& y = nodes_[to];
  LinkChild(parent, to);
  // Children keep their place; only their parent id changes. They are all on the host
  // (invariant 5 for an onboarded node; invariant 7 for an offloaded one).
  for (NodeId c = y.first_child; c != kNoNode; c = nodes_[c].next_sibling) nodes_[c].parent = to;
  hash_index_.Repoint(y.hash, from, to);
  if (options_.group_blocks > 1) {
    SetGroupEnd(to, IsGroupEnd(from));
    SetGroupEnd(from, false);
  }
  if (y.duration != 0) PushExpiry(to);
  if (parent != kNoNode) QueueUpdate(parent);
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

void BlockPool::SetGroupEnd(NodeId n, bool on) {
  if (options_.group_blocks == 1) return;
  const uint64_t bit = uint64_t{1} << (n % 64);
  group_end_[n / 64] = on ? group_end_[n / 64] | bit : group_end_[n / 64] & ~bit;
}

NodeId BlockPool::GroupParent(NodeId n) const {
  NodeId a = n;
  for (uint32_t i = 0; i < options_.group_blocks && a != kNoNode; ++i) a = nodes_[a].parent;
  return a;
}

StoredBlock BlockPool::MakeStoredBlock(NodeId n) const {
  StoredBlock b;
  b.hash = nodes_[n].hash;
  if (options_.include_tokens && options_.group_blocks == 1) {
    tokens_.Unpack(n, &b.tokens);
  } else if (options_.include_tokens) {
    // A group's tokens are its blocks' tokens, first block first: walk up, then reverse.
    std::vector<TokenId> block;
    NodeId a = n;
    for (uint32_t i = 0; i < options_.group_blocks && a != kNoNode; ++i, a = nodes_[a].parent) {
      tokens_.Unpack(a, &block);
      b.tokens.insert(b.tokens.end(), block.rbegin(), block.rend());
    }
    std::reverse(b.tokens.begin(), b.tokens.end());
  }
  b.tier = tier(n);
  b.priority = priority(n);
  b.lora_id = lora_ids_.empty() ? 0 : lora_ids_[n];
  return b;
}

void BlockPool::EmitStored(NodeId n) {
  if (!events_->enabled() || !IsGroupEnd(n)) return;
  const NodeId parent = GroupParent(n);
  const bool extend = pending_ && std::holds_alternative<StoredEvent>(pending_->data) && pending_last_ == parent &&
                      parent != kNoNode;
  if (!extend) {
    CloseEvents();
    pending_ = KvEvent{window_, StoredEvent{parent == kNoNode ? 0 : nodes_[parent].hash, {}}};
  }
  std::get<StoredEvent>(pending_->data).blocks.push_back(MakeStoredBlock(n));
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
  if (!events_->enabled() || !IsGroupEnd(n)) return;
  CloseEvents();
  Emit(KvEvent{window_, UpdatedEvent{nodes_[n].hash, tier, priority}});
}

void BlockPool::Snapshot(std::vector<KvEvent>* out) const {
  // Pre-order walks, first child first, so a chain comes out as one stored event. The
  // device pass starts at the root and stops at the first host child of each list
  // (invariant 9); the host pass starts at each host node whose parent is on the device
  // (or the root), found by one scan of the host entries.
  std::vector<NodeId> stack;
  StoredEvent* cur = nullptr;
  NodeId last = kNoNode;
  auto walk = [&](NodeId top, bool device) {
    stack.push_back(top);
    while (!stack.empty()) {
      const NodeId n = stack.back();
      stack.pop_back();
      const Node& x = nodes_[n];
      if (IsGroupEnd(n)) {  // routing groups: only group ends are published
        const NodeId parent = GroupParent(n);
        if (cur == nullptr || last == kNoNode || parent != last) {
          out->push_back(KvEvent{window_, StoredEvent{parent == kNoNode ? 0 : nodes_[parent].hash, {}}});
          cur = &std::get<StoredEvent>(out->back().data);
        }
        cur->blocks.push_back(MakeStoredBlock(n));
        last = n;
      }
      // Push children last-first so the first child is walked next and extends the chain.
      const NodeId head = x.first_child;
      if (head == kNoNode || (device && !IsDevice(head))) continue;
      for (NodeId c = nodes_[head].prev_sibling;; c = nodes_[c].prev_sibling) {
        if (!device || IsDevice(c)) stack.push_back(c);
        if (c == head) break;
      }
    }
  };
  for (NodeId c = root_first_child_; c != kNoNode && IsDevice(c); c = nodes_[c].next_sibling) walk(c, true);
  cur = nullptr;
  for (NodeId n = num_device_; n < nodes_.size(); ++n) {
    const Node& x = nodes_[n];
    if (x.live && (x.parent == kNoNode || IsDevice(x.parent))) walk(n, false);
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
  return nodes_.capacity() * sizeof(Node) + tokens_.MemoryBytes() + packed_.capacity() + hash_index_.MemoryBytes() +
         alloc_[kDev].MemoryBytes() + alloc_[kHost].MemoryBytes() + expiry_.capacity() * sizeof(ExpiryEntry);
}

Status BlockPool::CheckInvariants() const {
  auto fail = [&](const std::string& what) { return Internal("pool " + std::to_string(index_) + ": " + what); };
  for (int t = 0; t < kNumTiers; ++t) KVF_RETURN_IF_ERROR(alloc_[t].CheckInvariants());
  std::array<uint32_t, kNumTiers> cached{};
  std::array<uint32_t, kNumTiers> in_use{};
  uint32_t live = 0;
  for (NodeId n = 0; n < nodes_.size(); ++n) {
    const Node& x = nodes_[n];
    const int t = Idx(tier(n));
    // Invariant 2: free iff refcount 0 and outside the tree.
    const bool free = alloc_[t].IsFree(block(n));
    if (free != (x.refcount == 0 && !x.live)) {
      return fail("invariant 2: block " + std::to_string(block(n)) + " of tier " + TierName(tier(n)) +
                  " free=" + std::to_string(free) + " refcount=" + std::to_string(x.refcount) +
                  " in_tree=" + std::to_string(x.live));
    }
    if (x.refcount > 0) ++in_use[t];
    if (x.refcount == 0 && x.live) ++cached[t];
    if (!x.live) {
      if (x.queued || x.first_child != kNoNode) return fail("a free node is queued or has children");
      if (options_.group_blocks > 1 && IsGroupEnd(n)) return fail("invariant 10: a free node is a group end");
      continue;
    }
    ++live;
    // Invariant 4: links and the index. Invariant 5: device parents. Invariant 9: order.
    if (FindHash(x.hash) != n) return fail("invariant 4: node not in the hash index under its hash");
    if (x.parent != kNoNode && !nodes_[x.parent].live) return fail("invariant 4: parent not in the tree");
    bool seen_host = false;
    NodeId prev = kNoNode;
    for (NodeId c = x.first_child; c != kNoNode; c = nodes_[c].next_sibling) {
      if (!nodes_[c].live || nodes_[c].parent != n) return fail("invariant 4: child list broken");
      if (prev != kNoNode && nodes_[c].prev_sibling != prev) return fail("invariant 4: sibling links broken");
      if (IsDevice(c) && seen_host) return fail("invariant 9: a device child after a host child");
      seen_host = seen_host || !IsDevice(c);
      prev = c;
    }
    if (x.first_child != kNoNode && nodes_[x.first_child].prev_sibling != prev) return fail("invariant 4: tail link");
    if (IsDevice(n) && x.parent != kNoNode && !IsDevice(x.parent)) {
      return fail("invariant 5: device node under a host node");
    }
    // Invariant 6 (the pool's part): a held node's parent is held.
    if (x.refcount > 0 && x.parent != kNoNode && nodes_[x.parent].refcount == 0) {
      return fail("invariant 6: held node under an unheld parent");
    }
    // Invariant 7.
    const bool want = x.refcount == 0 && (IsDevice(n) ? !HasDeviceChild(x) : x.first_child == kNoNode);
    if (want != bool(x.queued)) return fail("invariant 7: node " + std::to_string(n) + " eviction-queue membership");
  }
  for (NodeId c = root_first_child_, prev = kNoNode; c != kNoNode; prev = c, c = nodes_[c].next_sibling) {
    if (nodes_[c].parent != kNoNode || !nodes_[c].live) return fail("root child with a parent");
    if (prev != kNoNode && nodes_[c].prev_sibling != prev) return fail("invariant 4: root sibling links broken");
  }
  for (int t = 0; t < kNumTiers; ++t) {
    // Invariant 1.
    if (alloc_[t].num_free() + in_use[t] + cached[t] != alloc_[t].num_blocks()) {
      return fail("invariant 1: free + in_use + cached != total");
    }
    if (cached[t] != unpinned_cached_[t]) return fail("cached counter disagrees");
  }
  if (live != live_nodes_) return fail("live node count");
  if (hash_index_.size() != live || !hash_index_.Check([this](NodeId n) { return nodes_[n].hash; })) {
    return fail("invariant 4: hash index");
  }
  for (int t = 0; t < kNumTiers; ++t) {
    uint32_t members = 0;
    for (int p = 0; p <= kMaxPriority; ++p) {
      const Queue& q = queues_[t][p];
      const bool bit = (nonempty_[t][p / 64] >> (p % 64)) & 1;
      if (bit != (q.head != kNoNode)) return fail("invariant 7: non-empty bitmap");
      NodeId prev = kNoNode;
      for (NodeId c = q.head; c != kNoNode; prev = c, c = nodes_[c].lru_next) {
        const Node& y = nodes_[c];
        if (!y.live || !y.queued || Idx(tier(c)) != t || y.priority != p || y.lru_prev != prev) {
          return fail("invariant 7: eviction queue links");
        }
        if (prev != kNoNode && nodes_[prev].tick >= y.tick) return fail("invariant 7: queue not in LRU order");
        ++members;
      }
      if (q.tail != prev) return fail("invariant 7: queue tail");
    }
    if (members != queued_[t]) return fail("invariant 7: queue sizes");
  }
  uint32_t uses = 0;
  for (NodeId n = 0; n < nodes_.size(); ++n) uses += nodes_[n].live && nodes_[n].duration != 0;
  uint32_t counted = 0;
  for (uint32_t u : duration_uses_) counted += u;
  if (uses != counted) return fail("duration slot use counts");
  return Status::Ok();
}

}  // namespace kvfleet::kv
