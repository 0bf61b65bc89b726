// The shard table of GlobalIndex: one shard's open-addressing slot array, its overflow and
// predicted side tables and its per-worker reverse lists (the layout and the invariants are
// global_index.h's), with the writer-side operations on them. Internal to router/index:
// only global_index.cc and shard_table.cc include it. The operations on the write path of
// every event and prediction (Find, FindOrInsert, Bits, SetBits, TakePredicted) stay inline
// here; growth, erasure, compaction, sweeping, trimming and the invariant checks live in
// shard_table.cc.
//
// Owned by GlobalIndex, config::kShards of them. Thread safety: a shard's writers hold its
// `mu` and bracket table changes with BeginWrite/EndWrite; lock-free readers (global_index.cc,
// ReadSlot) read the slots under the shard's sequence counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include <boost/container/small_vector.hpp>
#include <boost/unordered/unordered_flat_map.hpp>

#include "router/index/global_index.h"

namespace kvfleet::router {


inline constexpr int kWords = config::kMaxWorkers / 64;  // 64-worker groups
static_assert(config::kInlineWorkers == 64, "slots hold exactly one 64-bit mask per tier");
static_assert(config::kShards <= 64);
inline constexpr uint8_t kDev = 1, kHostBit = 2;  // tier bits of a (block, worker) pair

inline uint8_t TierBit(kv::Tier tier) { return tier == kv::Tier::kDevice ? kDev : kHostBit; }

// murmur3's 64-bit finaliser: the top bits pick the shard, the low bits the home slot, so
// both stay uniform for test-sized small integers as well as XXH3 outputs.
inline uint64_t Mix(BlockHash h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}
inline int ShardOfMix(uint64_t mix) { return static_cast<int>(mix >> (64 - config::kShardBits)); }

// Slots are read by lock-free readers while a writer may change them, so every field is an
// atomic. Stores release and loads acquire (plain moves on x86): a reader that sees any
// store of a write section then also sees the section's odd sequence number (seqlock
// without fences, which TSan does not model).
template <typename T>
inline T Ld(const std::atomic<T>& a) {
  return a.load(std::memory_order_acquire);
}
template <typename T>
inline void St(std::atomic<T>& a, T v) {
  a.store(v, std::memory_order_release);
}
// Counters written only under their shard's mutex and read lock-free elsewhere.
inline void Bump(std::atomic<uint64_t>& counter, int64_t delta) {
  counter.store(counter.load(std::memory_order_relaxed) + static_cast<uint64_t>(delta), std::memory_order_relaxed);
}

inline constexpr uint64_t kNpos = ~0ull;
// Tables start at 1,024 slots (32 KiB) and double past 3/4 full.
inline constexpr uint64_t kInitialSlots = 1024;
// A worker's reverse list is compacted once it holds this many times its live pairs (plus
// the slack): each compaction then pays for itself over the appends since the last one.
inline constexpr size_t kCompactFactor = 4;
inline constexpr size_t kCompactSlack = 32;
// Apply prefetches the home slots of the ops this far ahead, so their cache misses overlap.
inline constexpr size_t kPrefetchAhead = 12;

// 32 bytes, two per cache line.
struct alignas(32) Slot {
  std::atomic<uint64_t> hash;
  std::atomic<uint64_t> device;      // workers 0..63 holding the block on the device
  std::atomic<uint64_t> host;        // ... on the host
  std::atomic<uint32_t> lru_ms;      // last store, prediction or match; 0 = slot unused
  std::atomic<uint16_t> predicted;   // holders in the shard's predicted table
  std::atomic<uint16_t> overflow;    // rows in the shard's overflow table (groups >= 1)
};
static_assert(sizeof(Slot) == 32);

// A shard's slot array. Arrays of 2 MiB and more are 2 MiB aligned and asked to be backed by
// huge pages: a million-block index is tens of MiB of random probes, and with 4 KiB pages
// nearly every probe would also miss the TLB.
struct GlobalIndex::Table {
  explicit Table(uint64_t capacity);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  static constexpr size_t kHugePage = 2u << 20;
  const uint64_t mask;
  const size_t bytes;
  Slot* slots;
};
static_assert(std::is_trivially_destructible_v<Slot>);

struct OverflowKey {
  BlockHash hash;
  uint32_t group;  // worker / 64, >= 1
  bool operator==(const OverflowKey&) const = default;
};
struct OverflowKeyHash {
  size_t operator()(const OverflowKey& k) const { return Mix(k.hash ^ (static_cast<uint64_t>(k.group) << 50)); }
};
struct Masks {
  uint64_t device = 0, host = 0;
};
struct PredHolder {
  uint32_t worker;
  uint32_t expiry_ms;
};
// A block's predicted holders. Almost always one (the worker a request was just routed
// to), so one is kept inline: inserting a prediction allocates nothing and touches one
// element of the table, not a separate heap block (the router's HTTP thread inserts a
// prompt's blocks, 256 for 8K tokens, after each send).
inline constexpr size_t kInlineHolders = 1;
using PredList = boost::container::small_vector<PredHolder, kInlineHolders>;
struct MixHash {
  size_t operator()(BlockHash h) const { return Mix(h); }
};

struct alignas(64) GlobalIndex::Shard {
  // Read by lock-free readers.
  std::atomic<uint64_t> seq{0};  // odd while a writer changes `table`
  std::atomic<Table*> table{nullptr};
  alignas(64) mutable std::mutex mu;  // writers; readers of the side tables
  // Below: GUARDED_BY(mu).
  uint64_t used = 0;                   // slots in use
  std::atomic<uint64_t> entries{0};    // (block, worker) entries; read lock-free
  boost::unordered_flat_map<OverflowKey, Masks, OverflowKeyHash> overflow;
  boost::unordered_flat_map<BlockHash, PredList, MixHash> predicted;
  struct PerWorker {
    std::vector<BlockHash> blocks;  // reverse list: hashes the worker gained state on
    uint64_t live = 0;              // (block, this worker) pairs with state
    std::atomic<uint64_t> tier_count[kv::kNumTiers] = {};  // read lock-free
  };
  std::unique_ptr<PerWorker[]> workers{new PerWorker[config::kMaxWorkers]};

  Shard() : table(new Table(kInitialSlots)) {}
  ~Shard() { delete table.load(); }

  // ---- Writer side (mu held) -------------------------------------------------------------
  Table* T() const { return table.load(std::memory_order_relaxed); }
  // Slot stores after BeginWrite are releases, so none is seen before the odd number.
  void BeginWrite() { seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  void EndWrite() { seq.store(seq.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

  uint64_t Find(BlockHash h, uint64_t mix) const {
    const Table* t = T();
    for (uint64_t i = mix & t->mask;; i = (i + 1) & t->mask) {
      const Slot& s = t->slots[i];
      if (Ld(s.lru_ms) == 0) return kNpos;
      if (Ld(s.hash) == h) return i;
    }
  }
  // Returns h's slot, claiming one (stamped now_ms, no holders) when absent. May grow the
  // table; *old receives the replaced table for the caller to retire. REQUIRES: inside a
  // write section (BeginWrite), which it closes and reopens around a growth.
  uint64_t FindOrInsert(BlockHash h, uint64_t mix, uint32_t now_ms, Table** old) {
    Table* t = T();
    for (uint64_t i = mix & t->mask;; i = (i + 1) & t->mask) {
      Slot& s = t->slots[i];
      if (Ld(s.lru_ms) == 0) {
        if ((used + 1) * 4 > (t->mask + 1) * 3) {
          // Readers keep reading the old table while the new one is built (it does not
          // change meanwhile), so the write section is closed for the rebuild.
          EndWrite();
          *old = Grow();
          BeginWrite();
          return FindOrInsert(h, mix, now_ms, old);
        }
        St(s.hash, h);
        St(s.device, uint64_t{0});
        St(s.host, uint64_t{0});
        St(s.predicted, uint16_t{0});
        St(s.overflow, uint16_t{0});
        St(s.lru_ms, now_ms);
        ++used;
        return i;
      }
      if (Ld(s.hash) == h) return i;
    }
  }
  Table* Grow();
  // Frees slot i, shifting later slots of its probe run back (no tombstones).
  void Erase(uint64_t i);
  static bool Empty(const Slot& s) {
    return (Ld(s.device) | Ld(s.host)) == 0 && Ld(s.predicted) == 0 && Ld(s.overflow) == 0;
  }

  uint8_t Bits(const Slot& s, BlockHash h, WorkerId w) const {
    if (w < config::kInlineWorkers) {
      const uint64_t bit = 1ull << w;
      return static_cast<uint8_t>(((Ld(s.device) & bit) ? kDev : 0) | ((Ld(s.host) & bit) ? kHostBit : 0));
    }
    if (Ld(s.overflow) == 0) return 0;
    auto it = overflow.find(OverflowKey{h, w / 64});
    if (it == overflow.end()) return 0;
    const uint64_t bit = 1ull << (w % 64);
    return static_cast<uint8_t>(((it->second.device & bit) ? kDev : 0) | ((it->second.host & bit) ? kHostBit : 0));
  }
  void SetBits(Slot& s, BlockHash h, WorkerId w, uint8_t bits) {
    const uint64_t bit = 1ull << (w % 64);
    auto apply = [&](uint64_t m, uint8_t tier_bit) { return (bits & tier_bit) ? m | bit : m & ~bit; };
    if (w < config::kInlineWorkers) {
      St(s.device, apply(Ld(s.device), kDev));
      St(s.host, apply(Ld(s.host), kHostBit));
      return;
    }
    const OverflowKey key{h, w / 64};
    auto it = overflow.find(key);
    if (it == overflow.end()) {
      if (bits == 0) return;
      it = overflow.emplace(key, Masks{}).first;
      St(s.overflow, static_cast<uint16_t>(Ld(s.overflow) + 1));
    }
    it->second.device = apply(it->second.device, kDev);
    it->second.host = apply(it->second.host, kHostBit);
    if ((it->second.device | it->second.host) == 0) {
      overflow.erase(it);
      St(s.overflow, static_cast<uint16_t>(Ld(s.overflow) - 1));
    }
  }
  // Whether w is a predicted holder of h.
  bool IsPredicted(const Slot& s, BlockHash h, WorkerId w) const {
    if (Ld(s.predicted) == 0) return false;
    auto it = predicted.find(h);
    if (it == predicted.end()) return false;
    for (const auto& p : it->second)
      if (p.worker == w) return true;
    return false;
  }
  // Removes w's predicted holder of h; returns whether there was one.
  bool TakePredicted(Slot& s, BlockHash h, WorkerId w) {
    if (Ld(s.predicted) == 0) return false;
    auto it = predicted.find(h);
    if (it == predicted.end()) return false;
    auto& list = it->second;
    for (size_t k = 0; k < list.size(); ++k) {
      if (list[k].worker != w) continue;
      list[k] = list.back();
      list.pop_back();
      if (list.empty()) predicted.erase(it);
      St(s.predicted, static_cast<uint16_t>(Ld(s.predicted) - 1));
      return true;
    }
    return false;
  }
  bool HasState(BlockHash h, WorkerId w) const;
  // Drops stale and duplicate hashes from w's reverse list. The lookups are prefetched a
  // window ahead; the sort runs only when a pair was lost and regained (a duplicate).
  void Compact(WorkerId w);
  void NoteGained(WorkerId w, BlockHash h) {
    auto& pw = workers[w];
    pw.blocks.push_back(h);
    ++pw.live;
  }
  void MaybeCompact(WorkerId w) {
    const auto& pw = workers[w];
    if (pw.blocks.size() > kCompactFactor * pw.live + kCompactSlack) Compact(w);
  }
  // Removes every holder of slot i (trimming); the reverse lists keep stale hashes.
  void DropSlot(uint64_t i);
  uint32_t Holders(const Slot& s) const;

  // ---- Maintenance (each takes mu) -------------------------------------------------------
  // Drops predicted holders whose expiry has passed; returns how many.
  uint64_t SweepExpired(uint32_t now_ms);
  // Above `cap` entries, drops the least recently used blocks down to
  // cap × config::kTrimTargetFraction.
  void TrimTo(uint64_t cap);
  // KVF_CHECKs global_index.h's invariants for this shard, the `index`th.
  void CheckInvariants(int index) const;
};

}  // namespace kvfleet::router
