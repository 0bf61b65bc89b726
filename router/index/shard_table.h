// The shard table of GlobalIndex: one shard's open-addressing slot array with its row refs and
// group versions, its overflow rows (overflow_rows.h), its predicted table and its per-worker
// reverse lists (the layout and the invariants are global_index.h's), with the writer-side
// operations on them, and the lock-free readers' ReadSlot. Internal to router/index: only
// global_index.cc, global_index_match.cc and shard_table.cc include it. The operations on the
// write path of every event and prediction (Find, FindOrInsert, Bits, SetBits, TakePredicted)
// stay inline here; growth, erasure, row changes, compaction, sweeping, trimming and the
// invariant checks live in shard_table.cc.
//
// Owned by GlobalIndex, config::kShards of them. Thread safety: a shard's writers hold its
// `mu`; each op opens the groups of slots it stores to (Open: the group's version turns odd)
// only after its lookups, and closes them (Close) when its stores are done; overflow rows
// change only inside that section, and a writer holds `side_mu` only while it changes the
// predicted table. Lock-free readers (ReadSlot, below) check the versions of the slot groups
// they read (the slots and their rows), and take `side_mu` alone for the predicted table.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <boost/container/small_vector.hpp>
#include <boost/unordered/unordered_flat_map.hpp>

#include "router/index/global_index.h"
#include "router/index/overflow_rows.h"

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
// store of a write section then also sees the odd version of the slot's group (seqlock
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
// A slot group: 2^kGroupBits consecutive slots (1 KiB) sharing one version (a seqlock). A
// writer makes a group's version odd only while it stores to the group's slots, for one op:
// a reader retries (or waits) only when a write touches the very slots it reads, not when
// the writer holds the shard. 8 bytes of versions per 32 slots (0.8% of the table).
inline constexpr int kGroupBits = 5;
// A reader's probe checks the versions of at most this many groups (256 slots; a probe
// run at load <= 3/4 is a few slots); a longer one is read under the shard's mutex.
inline constexpr int kMaxProbeGroups = 8;

// 32 bytes, two per cache line.
struct alignas(32) Slot {
  std::atomic<uint64_t> hash;
  std::atomic<uint64_t> device;      // workers 0..63 holding the block on the device
  std::atomic<uint64_t> host;        // ... on the host
  std::atomic<uint32_t> lru_ms;      // last store, prediction or match; 0 = slot unused
  std::atomic<uint16_t> predicted;   // holders in the shard's predicted table
  std::atomic<uint16_t> overflow;    // groups (bit g: group g >= 1) in its overflow row; 0: none
};
static_assert(sizeof(Slot) == 32);

// A shard's slot array and its groups' versions. Arrays of 2 MiB and more are 2 MiB aligned
// and asked to be backed by huge pages: a million-block index is tens of MiB of random
// probes, and with 4 KiB pages nearly every probe would also miss the TLB. A table is
// written only until it is replaced (Grow), so a reader still on the old one reads a
// consistent, older state.
struct GlobalIndex::Table {
  explicit Table(uint64_t capacity);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  static constexpr size_t kHugePage = 2u << 20;
  static uint64_t Group(uint64_t i) { return i >> kGroupBits; }
  const uint64_t mask;
  const size_t bytes;  // slots, row refs and versions
  Slot* slots;
  std::unique_ptr<std::atomic<uint32_t>[]> row_refs;  // per slot: its overflow row (OverflowRows); 0: none
  std::unique_ptr<std::atomic<uint64_t>[]> versions;  // per group: odd while a writer stores to it
};
static_assert(std::is_trivially_destructible_v<Slot>);

struct Masks {
  uint64_t device = 0, host = 0;
};
static_assert(kWords <= 16, "a slot's overflow field is a 16-bit set of groups");
// The rank of group g in a row of `groups` (its masks are words 2 rank, 2 rank + 1).
inline int GroupRank(uint16_t groups, uint32_t g) { return std::popcount(static_cast<uint32_t>(groups) & ((1u << g) - 1)); }

static_assert(kWords <= OverflowRows::kMaxGroups);
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
  std::atomic<Table*> table{nullptr};
  alignas(64) mutable std::mutex mu;  // writers; also a reader whose probe is too long to check
  // Readers of the predicted table; writers take it (after mu) only around one change of it
  // (TakePredicted, a prediction, a sweep's block): a reader waits for one op's change at
  // most. Writers read the table without it (they hold mu). The overflow rows need no lock.
  mutable std::mutex side_mu;
  // Below: GUARDED_BY(mu); predicted also changes only under side_mu.
  uint64_t used = 0;                   // slots in use
  std::atomic<uint64_t> entries{0};    // (block, worker) entries; read lock-free
  OverflowRows overflow;  // a row per block with workers >= 64, read lock-free
  boost::unordered_flat_map<BlockHash, PredList, MixHash> predicted;
  struct PerWorker {
    std::vector<BlockHash> blocks;  // reverse list: hashes the worker gained state on
    uint64_t live = 0;              // (block, this worker) pairs with state
    std::atomic<uint64_t> tier_count[kv::kNumTiers] = {};  // read lock-free
  };
  std::unique_ptr<PerWorker[]> workers{new PerWorker[config::kMaxWorkers]};
  boost::container::small_vector<uint64_t, 4> open_;  // the groups the current op opened

  Shard() : table(new Table(kInitialSlots)) {}
  ~Shard() { delete table.load(); }

  // ---- Writer side (mu held) -------------------------------------------------------------
  Table* T() const { return table.load(std::memory_order_relaxed); }
  // Opens slot i's group for this op's stores: its version turns odd (once per op). Slot
  // stores are releases, so none is seen before the odd version.
  void Open(uint64_t i) {
    const uint64_t g = Table::Group(i);
    for (uint64_t o : open_)
      if (o == g) return;
    std::atomic<uint64_t>& v = T()->versions[g];
    v.store(v.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    open_.push_back(g);
  }
  // Ends the op: every group it opened turns even again (a release: a reader that sees the
  // new version sees the op's stores).
  void Close() {
    for (uint64_t g : open_) {
      std::atomic<uint64_t>& v = T()->versions[g];
      v.store(v.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    open_.clear();
  }
  bool Closed() const { return open_.empty(); }

  uint64_t Find(BlockHash h, uint64_t mix) const {
    const Table* t = T();
    for (uint64_t i = mix & t->mask;; i = (i + 1) & t->mask) {
      const Slot& s = t->slots[i];
      if (Ld(s.lru_ms) == 0) return kNpos;
      if (Ld(s.hash) == h) return i;
    }
  }
  // Returns h's slot, opened (Open), claiming one (stamped now_ms, no holders) when absent.
  // May grow the table; *old receives the replaced table for the caller to retire. REQUIRES:
  // no group open (Closed()): readers keep reading the old table while the new one is built.
  uint64_t FindOrInsert(BlockHash h, uint64_t mix, uint32_t now_ms, Table** old) {
    Table* t = T();
    for (uint64_t i = mix & t->mask;; i = (i + 1) & t->mask) {
      Slot& s = t->slots[i];
      if (Ld(s.lru_ms) == 0) {
        if ((used + 1) * 4 > (t->mask + 1) * 3) {
          *old = Grow();
          return FindOrInsert(h, mix, now_ms, old);
        }
        Open(i);
        St(s.hash, h);
        St(s.device, uint64_t{0});
        St(s.host, uint64_t{0});
        St(s.predicted, uint16_t{0});
        St(s.overflow, uint16_t{0});
        St(s.lru_ms, now_ms);
        ++used;
        return i;
      }
      if (Ld(s.hash) == h) {
        Open(i);
        return i;
      }
    }
  }
  Table* Grow();
  // Frees slot i, shifting later slots of its probe run back (no tombstones); opens the
  // groups it stores to.
  void Erase(uint64_t i);
  static bool Empty(const Slot& s) {
    return (Ld(s.device) | Ld(s.host)) == 0 && Ld(s.predicted) == 0 && Ld(s.overflow) == 0;
  }

  uint64_t IndexOf(const Slot& s) const { return static_cast<uint64_t>(&s - T()->slots); }
  // Group g's masks in slot s's overflow row; zero when it has none.
  Masks RowMasks(const Slot& s, uint32_t g) const {
    const uint16_t groups = Ld(s.overflow);
    if (!(groups >> g & 1)) return Masks{};
    const uint32_t n = static_cast<uint32_t>(std::popcount(groups));
    const std::atomic<uint64_t>* row = overflow.Words(Ld(T()->row_refs[IndexOf(s)]), 2 * n);
    const int r = GroupRank(groups, g);
    return Masks{Ld(row[2 * r]), Ld(row[2 * r + 1])};
  }
  // The masks of each group of slot s's overflow row, in group order: f(g, masks).
  template <typename F>
  void ForEachGroup(const Slot& s, F f) const {
    const uint16_t groups = Ld(s.overflow);
    if (groups == 0) return;
    const std::atomic<uint64_t>* row =
        overflow.Words(Ld(T()->row_refs[IndexOf(s)]), 2 * static_cast<uint32_t>(std::popcount(groups)));
    int r = 0;
    for (uint32_t m = groups; m; m &= m - 1, ++r)
      f(static_cast<uint32_t>(std::countr_zero(m)), Masks{Ld(row[2 * r]), Ld(row[2 * r + 1])});
  }
  // Sets group g's masks in slot s's row (its group open); zero masks remove the group. Masks
  // change in place; a new set of groups is a new row, and the old one is freed.
  void SetRowMasks(Slot& s, uint32_t g, Masks m);
  // Frees slot s's row (its group open).
  void DropRow(Slot& s);

  uint8_t Bits(const Slot& s, BlockHash h, WorkerId w) const {
    (void)h;
    if (w < config::kInlineWorkers) {
      const uint64_t bit = 1ull << w;
      return static_cast<uint8_t>(((Ld(s.device) & bit) ? kDev : 0) | ((Ld(s.host) & bit) ? kHostBit : 0));
    }
    if (!(Ld(s.overflow) >> (w / 64) & 1)) return 0;
    const Masks m = RowMasks(s, w / 64);
    const uint64_t bit = 1ull << (w % 64);
    return static_cast<uint8_t>(((m.device & bit) ? kDev : 0) | ((m.host & bit) ? kHostBit : 0));
  }
  void SetBits(Slot& s, BlockHash h, WorkerId w, uint8_t bits) {
    (void)h;
    const uint64_t bit = 1ull << (w % 64);
    auto apply = [&](uint64_t m, uint8_t tier_bit) { return (bits & tier_bit) ? m | bit : m & ~bit; };
    if (w < config::kInlineWorkers) {
      St(s.device, apply(Ld(s.device), kDev));
      St(s.host, apply(Ld(s.host), kHostBit));
      return;
    }
    Masks m = RowMasks(s, w / 64);
    m.device = apply(m.device, kDev);
    m.host = apply(m.host, kHostBit);
    SetRowMasks(s, w / 64, m);
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
      std::lock_guard side(side_mu);
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

// ---- Lock-free readers ------------------------------------------------------------------

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// A slot as one lock-free reader saw it.
struct SlotView {
  const Slot* slot = nullptr;  // null: absent
  uint64_t device = 0, host = 0;
  uint32_t lru_ms = 0;
  uint16_t predicted = 0, overflow = 0;
  // Group g's masks from the overflow row, for each group g in `overflow` (others unset).
  uint64_t over_device[kWords] = {}, over_host[kWords] = {};
};

// Registers a lock-free reader for the duration of a call (GlobalIndex::ReclaimRetired).
class ReaderGuard {
 public:
  explicit ReaderGuard(std::atomic<uint64_t>& readers) : readers_(readers) { readers_.fetch_add(1); }
  ~ReaderGuard() { readers_.fetch_sub(1); }

 private:
  std::atomic<uint64_t>& readers_;
};

// Copies the overflow row at *ref into v (v->overflow set); false when the ref was out of
// bounds (read while a writer changed it).
inline bool ReadRow(const GlobalIndex::Shard& shard, const std::atomic<uint32_t>& ref, SlotView* v) {
  const uint32_t n = static_cast<uint32_t>(std::popcount(v->overflow));
  const std::atomic<uint64_t>* row = shard.overflow.Words(ref.load(std::memory_order_acquire), 2 * n);
  if (row == nullptr) return false;
  int r = 0;
  for (uint32_t m = v->overflow; m; m &= m - 1, ++r) {
    const int g = std::countr_zero(m);
    v->over_device[g] = Ld(row[2 * r]);
    v->over_host[g] = Ld(row[2 * r + 1]);
  }
  return true;
}

// Reads h's slot without a lock: checks the version of each slot group its probe reads
// before and after (a seqlock per group), and retries when one was odd or changed, i.e.
// when a writer stored to those very slots meanwhile. A write to the slots lasts one op's
// stores, so a reader waits only if that writer was preempted within them, and only when
// it reads those slots. REQUIRES: a ReaderGuard is live.
inline SlotView ReadSlot(const GlobalIndex::Shard& shard, BlockHash h, uint64_t mix) {
  constexpr int kSpinsBeforeYield = 128;
  for (int attempt = 0;; ++attempt) {
    const GlobalIndex::Table* t = shard.table.load(std::memory_order_acquire);
    uint64_t groups[kMaxProbeGroups], versions[kMaxProbeGroups];
    int checked = 0;
    bool stable = true, too_long = false;
    SlotView v;
    uint64_t i = mix & t->mask;
    for (uint64_t n = 0; n <= t->mask; ++n, i = (i + 1) & t->mask) {
      const uint64_t g = GlobalIndex::Table::Group(i);
      if (checked == 0 || groups[checked - 1] != g) {
        if (checked == kMaxProbeGroups) {
          too_long = true;
          break;
        }
        const uint64_t version = t->versions[g].load(std::memory_order_acquire);
        if (version & 1) {
          stable = false;
          break;
        }
        groups[checked] = g;
        versions[checked++] = version;
      }
      const Slot& s = t->slots[i];
      const uint32_t lru = Ld(s.lru_ms);
      if (lru == 0) break;
      if (Ld(s.hash) != h) continue;
      v.slot = &s;
      v.device = Ld(s.device);
      v.host = Ld(s.host);
      v.lru_ms = lru;
      v.predicted = Ld(s.predicted);
      v.overflow = Ld(s.overflow);
      if (v.overflow != 0 && !ReadRow(shard, t->row_refs[i], &v)) stable = false;
      break;
    }
    if (too_long) {
      // No writer changes the shard meanwhile; the table is the current one under mu.
      std::lock_guard lock(shard.mu);
      const uint64_t j = shard.Find(h, mix);
      if (j == kNpos) return SlotView{};
      const Slot& s = shard.T()->slots[j];
      SlotView locked{&s, Ld(s.device), Ld(s.host), Ld(s.lru_ms), Ld(s.predicted), Ld(s.overflow), {}, {}};
      if (locked.overflow != 0) ReadRow(shard, shard.T()->row_refs[j], &locked);
      return locked;
    }
    // The slot loads above are acquires: these loads cannot move before them, and see an
    // odd or newer version if any of them read a store of a later write.
    for (int k = 0; stable && k < checked; ++k)
      stable = t->versions[groups[k]].load(std::memory_order_relaxed) == versions[k];
    // Rows are shared by a table and the one that replaces it, and written under the new
    // table's versions only: a row read that saw a write made after a growth also sees the
    // new table here (the writer swapped it in before), and retries.
    if (stable && v.overflow != 0) stable = shard.table.load(std::memory_order_relaxed) == t;
    if (stable) return v;
    if (attempt < kSpinsBeforeYield) {
      CpuRelax();
    } else {
      std::this_thread::yield();  // the writer was preempted within its stores
    }
  }
}

// Locks the shard's side_mu (the predicted table) for a reader: a writer holds it for one
// op's change at most.
inline std::unique_lock<std::mutex> LockSideTables(const GlobalIndex::Shard& shard) {
  return std::unique_lock(shard.side_mu);
}

}  // namespace kvfleet::router
