// ScriptedKvSource: a small stand-in for the KV cache manager that produces a random but
// well-formed event stream (parents stored before children, leaves removed first, tier
// moves of leaves) and can snapshot what it holds. It has the manager's three event calls
// (TakeEvents, events_dropped, Snapshot), so PublishStep and ServeSnapshots below drive a
// publisher from either. Used by the publisher tests and the benchmarks; the convergence
// test also runs on the real KvCacheManager.
//
// Thread safety: thread-compatible; owned by one "engine" thread.
#pragma once

#include <algorithm>
#include <random>
#include <unordered_map>
#include <utility>
#include <vector>

#include "worker/server/event_publisher.h"

namespace kvfleet::testing {

class ScriptedKvSource {
 public:
  struct Node {
    BlockHash parent = 0;
    kv::Tier tier = kv::Tier::kDevice;
    uint32_t children = 0;
    uint32_t depth = 0;
    uint32_t window = 0;
  };

  explicit ScriptedKvSource(uint64_t seed, uint32_t other_window = 4096) : rng_(seed), other_window_(other_window) {}

  // One engine step's worth of cache changes: about `block_events` block events.
  void Step(size_t block_events) {
    size_t done = 0;
    while (done < block_events) {
      const int op = static_cast<int>(rng_() % 10);
      if (op < 5 || nodes_.size() < 64) {
        done += StoreChain(1 + rng_() % 8);
      } else if (op < 8) {
        done += RemoveLeaf();
      } else {
        done += MoveLeaf();
      }
    }
  }

  // Stores a chain of n new blocks under a random existing node (or the root).
  size_t StoreChain(size_t n) {
    BlockHash parent = 0;
    if (!nodes_.empty() && rng_() % 4 != 0) parent = RandomNode();
    const uint32_t window = (other_window_ && rng_() % 8 == 0) ? other_window_ : 0;
    if (parent != 0 && nodes_[parent].window != window) parent = 0;
    kv::StoredEvent e;
    e.parent_hash = parent;
    // A chain under a host-tier parent is stored on the host too, as offloaded prefixes.
    const kv::Tier tier = parent != 0 ? nodes_[parent].tier : kv::Tier::kDevice;
    uint32_t depth = parent ? nodes_[parent].depth + 1 : 0;
    BlockHash prev = parent;
    for (size_t i = 0; i < n; ++i) {
      BlockHash h = rng_() | 1;
      Node node{prev, tier, 0, depth++, window};
      if (prev) ++nodes_[prev].children;
      nodes_[h] = node;
      keys_.push_back(h);
      e.blocks.push_back(kv::StoredBlock{h, {}, tier, kv::kDefaultPriority});
      prev = h;
    }
    Emit(window, std::move(e));
    return n;
  }

  size_t RemoveLeaf() {
    BlockHash h = RandomLeaf();
    if (!h) return 1;
    Node n = nodes_[h];
    if (n.parent) --nodes_[n.parent].children;
    Erase(h);
    Emit(n.window, kv::RemovedEvent{{h}, n.tier});
    return 1;
  }

  size_t MoveLeaf() {
    BlockHash h = RandomLeaf();
    if (!h) return 1;
    Node& n = nodes_[h];
    n.tier = n.tier == kv::Tier::kDevice ? kv::Tier::kHost : kv::Tier::kDevice;
    kv::UpdatedEvent u;
    u.hash = h;
    u.tier = n.tier;
    Emit(n.window, u);
    return 1;
  }

  // Test hook: events the "manager" lost before they were taken (they still changed the cache).
  void DropNextEvents(bool drop) { dropping_ = drop; }

  // --- as KvCacheManager ---
  std::vector<kv::KvEvent> TakeEvents() { return std::exchange(pending_, {}); }
  uint64_t events_dropped() const { return dropped_; }
  std::vector<kv::KvEvent> Snapshot() const {
    std::vector<std::pair<std::pair<int, uint32_t>, BlockHash>> order;  // (tier, depth)
    order.reserve(nodes_.size());
    for (auto& [h, n] : nodes_) order.push_back({{static_cast<int>(n.tier), n.depth}, h});
    std::sort(order.begin(), order.end());
    std::vector<kv::KvEvent> out;
    out.reserve(order.size());
    for (auto& [key, h] : order) {
      const Node& n = nodes_.at(h);
      kv::StoredEvent e;
      e.parent_hash = n.parent;
      e.blocks.push_back(kv::StoredBlock{h, {}, n.tier, kv::kDefaultPriority});
      out.push_back(kv::KvEvent{n.window, std::move(e)});
    }
    return out;
  }

  // The blocks held on `tier` in pools of window `window`, sorted.
  std::vector<BlockHash> Blocks(kv::Tier tier, uint32_t window = 0) const {
    std::vector<BlockHash> out;
    for (auto& [h, n] : nodes_)
      if (n.tier == tier && n.window == window) out.push_back(h);
    std::sort(out.begin(), out.end());
    return out;
  }
  size_t size() const { return nodes_.size(); }

 private:
  template <typename E>
  void Emit(uint32_t window, E e) {
    if (dropping_) {
      ++dropped_;
      return;
    }
    pending_.push_back(kv::KvEvent{window, std::move(e)});
  }
  BlockHash RandomNode() { return keys_[rng_() % keys_.size()]; }
  BlockHash RandomLeaf() {
    for (int tries = 0; tries < 16 && !keys_.empty(); ++tries) {
      BlockHash h = RandomNode();
      if (nodes_[h].children == 0) return h;
    }
    return 0;
  }
  void Erase(BlockHash h) {
    nodes_.erase(h);
    auto it = std::find(keys_.begin(), keys_.end(), h);
    *it = keys_.back();
    keys_.pop_back();
  }

  std::mt19937_64 rng_;
  uint32_t other_window_;
  std::unordered_map<BlockHash, Node> nodes_;
  std::vector<BlockHash> keys_;
  std::vector<kv::KvEvent> pending_;
  bool dropping_ = false;
  uint64_t dropped_ = 0;
};

// A test's engine thread, as the worker loop drives the publisher (worker/server/worker_loop.h):
// after a step, its events and load; between steps, a snapshot when a router asked for one.
// `Kv` is a KvCacheManager or a ScriptedKvSource.
template <typename Kv>
void PublishStep(events::EventPublisher& publisher, Kv& kv, const events::LoadReport& load = {}) {
  publisher.Publish(kv.TakeEvents(), load, kv.events_dropped());
}
template <typename Kv>
void ServeSnapshots(events::EventPublisher& publisher, Kv& kv) {
  if (!publisher.snapshot_wanted()) return;
  std::vector<kv::KvEvent> events = kv.TakeEvents();  // sealed before the snapshot they lead to
  publisher.PublishSnapshot(std::move(events), kv.events_dropped(), kv.Snapshot());
}

}  // namespace kvfleet::testing
