// Test helpers for the KV cache manager: simulated KV memory that
// proves a sequence only ever sees the KV of its own prefix, and an index that applies
// KV events the way a router would, checking their order.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/check.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/kv_cache_manager.h"
#include "schema/kv_event.h"

namespace kvfleet::kv::testing {

// A config with 1 layer, 1 head, head_dim 1, 1-byte elements: a block costs 2 x B bytes,
// so budgets are easy to state in blocks.
inline KvCacheConfig SmallConfig(uint32_t block_size, uint32_t device_blocks, uint32_t host_blocks = 0) {
  KvCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = {1};
  c.head_dim = 1;
  c.dtype_bytes = 1;
  c.max_seq_len = 1u << 21;
  c.block_size = block_size;
  c.device_bytes = uint64_t{device_blocks} * 2 * block_size;
  c.host_bytes = uint64_t{host_blocks} * 2 * block_size;
  c.events_include_tokens = true;
  return c;
}

// The "KV" of token t of a sequence: a hash of the namespace and tokens[0..t]. Reuse that
// hands a sequence anything else is wrong KV.
inline uint64_t KvValue(uint64_t prev, TokenId t) { return (prev ^ t) * 0x100000001B3ull + 0x9E3779B97F4A7C15ull; }

// Simulated KV memory: one u64 per token slot per (pool, tier).
class FakeKvMemory final : public BlockCopier {
 public:
  FakeKvMemory(const std::vector<PoolLayout>& pools, uint32_t block_size) : B_(block_size) {
    for (const auto& p : pools) {
      mem_.push_back({std::vector<uint64_t>(size_t{p.device_blocks} * B_, 0),
                      std::vector<uint64_t>(size_t{p.host_blocks} * B_, 0)});
    }
  }
  void Copy(std::span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies) {
      log.push_back(c);
      auto& src = mem_[c.pool][static_cast<int>(c.src_tier)];
      auto& dst = mem_[c.pool][static_cast<int>(c.dst_tier)];
      KVF_CHECK((size_t{c.src} + 1) * B_ <= src.size() && (size_t{c.dst} + 1) * B_ <= dst.size());
      std::copy_n(src.begin() + size_t{c.src} * B_, B_, dst.begin() + size_t{c.dst} * B_);
    }
  }
  uint64_t& Device(uint32_t pool, uint64_t slot) { return mem_[pool][0].at(slot); }
  // Overwrites all device KV, as other sequences reusing free blocks would.
  void ScribbleDevice() {
    for (auto& pool : mem_) std::fill(pool[0].begin(), pool[0].end(), 0xdeadbeef);
  }
  std::vector<BlockCopy> log;

 private:
  uint32_t B_;
  std::vector<std::array<std::vector<uint64_t>, 2>> mem_;
};

// Writes the KV of tokens [from, to) of `id` (what a forward pass does), given the
// sequence's tokens.
inline void WriteKv(KvCacheManager& m, FakeKvMemory& mem, SequenceId id, const std::vector<TokenId>& tokens,
                    uint32_t from, uint32_t to) {
  uint64_t v = 0;
  for (uint32_t t = 0; t < to; ++t) {
    v = KvValue(v, tokens[t]);
    if (t < from) continue;
    for (uint32_t p = 0; p < m.pools().size(); ++p) {
      const auto slot = m.SlotOf(id, p, t);
      if (slot) mem.Device(p, *slot) = v;
    }
  }
}

// Returns the first token in [0, NumComputedTokens) whose slot holds KV of another
// prefix, or -1 when all are right. Tokens dropped by a window are skipped.
inline int64_t FirstWrongKv(KvCacheManager& m, FakeKvMemory& mem, SequenceId id, const std::vector<TokenId>& tokens) {
  uint64_t v = 0;
  for (uint32_t t = 0; t < m.NumComputedTokens(id); ++t) {
    v = KvValue(v, tokens[t]);
    for (uint32_t p = 0; p < m.pools().size(); ++p) {
      const auto slot = m.SlotOf(id, p, t);
      if (slot && mem.Device(p, *slot) != v) return t;
    }
  }
  return -1;
}

// Applies KV events like a router's index does and checks the ordering contract.
class EventIndex {
 public:
  struct Entry {
    BlockHash parent = 0;
    Tier tier = Tier::kDevice;
    uint8_t priority = 0;
    std::vector<TokenId> tokens;
    bool operator==(const Entry&) const = default;
  };
  using Key = std::pair<uint32_t, BlockHash>;  // (window, hash)

  // Returns "" or what was wrong with the event.
  std::string Apply(const KvEvent& e) {
    if (std::holds_alternative<StoredEvent>(e.data)) {
      const auto& s = std::get<StoredEvent>(e.data);
      BlockHash parent = s.parent_hash;
      for (const StoredBlock& b : s.blocks) {
        if (parent != 0 && !entries.count({e.window_size, parent})) return "stored before its parent";
        if (entries.count({e.window_size, b.hash})) return "stored twice";
        entries[{e.window_size, b.hash}] = Entry{parent, b.tier, b.priority, b.tokens};
        parent = b.hash;
      }
    } else if (std::holds_alternative<RemovedEvent>(e.data)) {
      const auto& r = std::get<RemovedEvent>(e.data);
      for (BlockHash h : r.hashes) {
        auto it = entries.find({e.window_size, h});
        if (it == entries.end()) return "removed an unknown block";
        if (it->second.tier != r.tier) return "removed from the wrong tier";
        for (const auto& [k, v] : entries) {
          if (k.first == e.window_size && v.parent == h) return "parent removed before its child";
        }
        entries.erase(it);
      }
    } else if (std::holds_alternative<UpdatedEvent>(e.data)) {
      const auto& u = std::get<UpdatedEvent>(e.data);
      auto it = entries.find({e.window_size, u.hash});
      if (it == entries.end()) return "updated an unknown block";
      if (u.tier) it->second.tier = *u.tier;
      if (u.priority) it->second.priority = *u.priority;
    } else if (std::holds_alternative<ClearedEvent>(e.data)) {
      std::erase_if(entries, [&](const auto& kv) { return kv.first.first == e.window_size; });
    }
    return "";
  }
  std::string ApplyAll(const std::vector<KvEvent>& events) {
    for (const auto& e : events) {
      std::string err = Apply(e);
      if (!err.empty()) return err;
    }
    return "";
  }
  size_t Count(Tier t) const {
    size_t n = 0;
    for (const auto& [k, v] : entries) n += v.tier == t;
    return n;
  }
  std::map<Key, Entry> entries;
};

}  // namespace kvfleet::kv::testing
