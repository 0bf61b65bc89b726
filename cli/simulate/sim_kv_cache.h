// SimKvCache: a model of one worker's KV cache for the fleet simulator (`kvfleet simulate`).
// It holds up to `capacity_blocks` blocks as real prefix chains (Contract 1's chained hashes)
// and says what a real KV cache would say about them (Contract 2's stored and removed
// events), without any tensors or tokens:
//
//   - a few shared prefixes (system prompts), the same hashes on every worker of the model,
//     stored at retention priority 100 and never evicted;
//   - conversations: each request either starts one on a shared prefix with a fresh suffix,
//     or adds a turn to one of the most recent ones (a child chain of its last block);
//   - eviction is LRU by conversation, newest blocks first, so children always leave
//     before their parents.
//
// Memory is a few dozen bytes per conversation, not per block: a conversation's hashes are
// recomputed from its seed when needed (an eviction, a snapshot).
//
// Invariants (CheckInvariants):
//   1. blocks() == held prefix blocks + the sum of every conversation's blocks.
//   2. blocks() <= capacity() after every Request().
//   3. Every conversation's parent prefix is held.
//
// Thread safety: thread-compatible; owned by the simulator shard that owns its worker.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "schema/kv_event.h"

namespace kvfleet::sim {

struct SimKvCacheOptions {
  uint64_t capacity_blocks = 100'000;  // device blocks
  std::string model = "sim";           // the hash namespace (Contract 1's seed)
  uint32_t shared_prefixes = 8;        // system prompts shared by every worker of the model
  uint32_t prefix_blocks = 16;         // blocks per shared prefix
  uint32_t min_turn_blocks = 1;        // new blocks per request, uniform in [min, max]
  uint32_t max_turn_blocks = 32;
  double continue_probability = 0.5;   // a request continues a recent conversation
  uint32_t recent_conversations = 8;   // ... one of this many most recently used
  uint32_t max_conversation_blocks = 256;  // a longer one is not continued (8 Ki tokens at 32)
};

class SimKvCache {
 public:
  // REQUIRES: capacity_blocks > shared_prefixes * prefix_blocks + max_conversation_blocks
  // + max_turn_blocks; 1 <= min_turn_blocks <= max_turn_blocks.
  SimKvCache(const SimKvCacheOptions& options, uint64_t seed);

  // Fills the cache to `fraction` of its capacity without events: a warm cache that routers
  // learn from a snapshot. REQUIRES: empty, 0 <= fraction <= 1.
  void Fill(double fraction);

  // One request: stores its new blocks, evicting least recently used ones to make room,
  // and appends the events in the order a KV manager emits them (removed, then stored).
  // Returns the block events appended (a stored block or a removed hash each).
  size_t Request(std::vector<kv::KvEvent>* out);

  // Every block held as stored events, parents before children (Contract 2's snapshot).
  std::vector<kv::KvEvent> Snapshot() const;

  uint64_t blocks() const { return held_; }
  uint64_t capacity() const { return options_.capacity_blocks; }
  size_t conversations() const { return lru_.size(); }

  void CheckInvariants() const;

 private:
  struct Conversation {
    uint32_t prefix = 0;  // the shared prefix it starts on
    uint64_t seed = 0;    // its blocks' local hashes derive from it
    uint32_t blocks = 0;  // its own blocks, after the prefix
    BlockHash last = 0;   // its last block's hash
  };

  BlockHash PrefixTail(uint32_t prefix) const { return prefix_hashes_[prefix].back(); }
  // The hashes of `c`'s blocks [0, n), in chain order.
  std::vector<BlockHash> Hashes(const Conversation& c, uint32_t n) const;
  // Stores shared prefix `p` when it is not held; appends its event to `out` when non-null.
  size_t EnsurePrefix(uint32_t p, std::vector<kv::KvEvent>* out);
  // Evicts until `need` more blocks fit; appends removed events to `out` when non-null.
  size_t MakeRoom(uint64_t need, std::vector<kv::KvEvent>* out);
  // Adds `n` blocks to `c`; appends the stored event to `out` when non-null.
  size_t Extend(Conversation* c, uint32_t n, std::vector<kv::KvEvent>* out);
  uint32_t TurnBlocks();

  const SimKvCacheOptions options_;
  std::mt19937_64 rng_;
  uint64_t hash_seed_ = 0;
  std::vector<std::vector<BlockHash>> prefix_hashes_;  // the same on every worker
  std::vector<bool> prefix_held_;
  std::deque<Conversation> lru_;  // front: least recently used
  uint64_t held_ = 0;
};

}  // namespace kvfleet::sim
