#include "router/index/global_index.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <sys/mman.h>

#include <boost/container/small_vector.hpp>
#include <boost/unordered/unordered_flat_map.hpp>
#include <boost/unordered/unordered_flat_set.hpp>

#include "common/check.h"

namespace kvfleet::router {

namespace {

constexpr int kWords = config::kMaxWorkers / 64;  // 64-worker groups
static_assert(config::kInlineWorkers == 64, "slots hold exactly one 64-bit mask per tier");
static_assert(config::kShards <= 64);
constexpr uint8_t kDev = 1, kHostBit = 2;  // tier bits of a (block, worker) pair

uint8_t TierBit(kv::Tier tier) { return tier == kv::Tier::kDevice ? kDev : kHostBit; }

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

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

constexpr uint64_t kNpos = ~0ull;
// Tables start at 1,024 slots (32 KiB) and double past 3/4 full.
constexpr uint64_t kInitialSlots = 1024;
// A worker's reverse list is compacted once it holds this many times its live pairs (plus
// the slack): each compaction then pays for itself over the appends since the last one.
constexpr size_t kCompactFactor = 4;
constexpr size_t kCompactSlack = 32;
// Apply prefetches the home slots of the ops this far ahead, so their cache misses overlap.
constexpr size_t kPrefetchAhead = 12;

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

}  // namespace

// A shard's slot array. Arrays of 2 MiB and more are 2 MiB aligned and asked to be backed by
// huge pages: a million-block index is tens of MiB of random probes, and with 4 KiB pages
// nearly every probe would also miss the TLB.
struct GlobalIndex::Table {
  explicit Table(uint64_t capacity) : mask(capacity - 1), bytes(capacity * sizeof(Slot)) {
    const bool huge = bytes >= kHugePage;
    void* p = std::aligned_alloc(huge ? kHugePage : 64, bytes);
    KVF_CHECK(p != nullptr) << "index table of " << bytes << " bytes";
#if defined(MADV_HUGEPAGE)
    if (huge) (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    slots = static_cast<Slot*>(p);
    for (uint64_t i = 0; i < capacity; ++i) new (&slots[i]) Slot();  // all zero: unused
  }
  ~Table() { std::free(slots); }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  static constexpr size_t kHugePage = 2u << 20;
  const uint64_t mask;
  const size_t bytes;
  Slot* slots;
};
static_assert(std::is_trivially_destructible_v<Slot>);

namespace {

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
constexpr size_t kInlineHolders = 1;
using PredList = boost::container::small_vector<PredHolder, kInlineHolders>;
struct MixHash {
  size_t operator()(BlockHash h) const { return Mix(h); }
};

}  // namespace

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
  Table* Grow() {
    Table* old = T();
    auto* fresh = new Table((old->mask + 1) * 2);
    for (uint64_t i = 0; i <= old->mask; ++i) {
      const Slot& s = old->slots[i];
      if (Ld(s.lru_ms) == 0) continue;
      const BlockHash h = Ld(s.hash);
      for (uint64_t j = Mix(h) & fresh->mask;; j = (j + 1) & fresh->mask) {
        Slot& d = fresh->slots[j];
        if (Ld(d.lru_ms) != 0) continue;
        St(d.hash, h);
        St(d.device, Ld(s.device));
        St(d.host, Ld(s.host));
        St(d.predicted, Ld(s.predicted));
        St(d.overflow, Ld(s.overflow));
        St(d.lru_ms, Ld(s.lru_ms));
        break;
      }
    }
    // seq_cst: pairs with ReclaimRetired's check of the reader count.
    table.store(fresh, std::memory_order_seq_cst);
    return old;
  }
  // Frees slot i, shifting later slots of its probe run back (no tombstones).
  void Erase(uint64_t i) {
    Table* t = T();
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & t->mask;; j = (j + 1) & t->mask) {
      Slot& s = t->slots[j];
      if (Ld(s.lru_ms) == 0) break;
      const uint64_t home = Mix(Ld(s.hash)) & t->mask;
      if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
        Slot& d = t->slots[hole];
        St(d.hash, Ld(s.hash));
        St(d.device, Ld(s.device));
        St(d.host, Ld(s.host));
        St(d.predicted, Ld(s.predicted));
        St(d.overflow, Ld(s.overflow));
        St(d.lru_ms, Ld(s.lru_ms));
        hole = j;
      }
    }
    Slot& d = t->slots[hole];
    St(d.lru_ms, uint32_t{0});
    St(d.hash, uint64_t{0});
    St(d.device, uint64_t{0});
    St(d.host, uint64_t{0});
    St(d.predicted, uint16_t{0});
    St(d.overflow, uint16_t{0});
    --used;
  }
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
  bool HasState(BlockHash h, WorkerId w) const {
    const uint64_t i = Find(h, Mix(h));
    if (i == kNpos) return false;
    const Slot& s = T()->slots[i];
    if (Bits(s, h, w) != 0) return true;
    if (Ld(s.predicted) == 0) return false;
    auto it = predicted.find(h);
    return it != predicted.end() &&
           std::any_of(it->second.begin(), it->second.end(), [&](const PredHolder& p) { return p.worker == w; });
  }
  // Drops stale and duplicate hashes from w's reverse list. The lookups are prefetched a
  // window ahead; the sort runs only when a pair was lost and regained (a duplicate).
  void Compact(WorkerId w) {
    auto& list = workers[w].blocks;
    constexpr size_t kAhead = 8;
    const Table* t = T();
    size_t keep = 0;
    for (size_t k = 0; k < list.size(); ++k) {
      if (k + kAhead < list.size()) __builtin_prefetch(&t->slots[Mix(list[k + kAhead]) & t->mask]);
      if (HasState(list[k], w)) list[keep++] = list[k];
    }
    list.resize(keep);
    if (list.size() > workers[w].live) {
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
    }
    if (list.capacity() > 2 * list.size() + kCompactSlack) list.shrink_to_fit();
  }
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
  void DropSlot(uint64_t i) {
    Slot& s = T()->slots[i];
    const BlockHash h = Ld(s.hash);
    int64_t dropped = 0;
    auto drop_word = [&](uint64_t dev, uint64_t host, WorkerId base) {
      for (uint64_t m = dev | host; m; m &= m - 1) {
        const int b = std::countr_zero(m);
        auto& pw = workers[base + b];
        if (dev >> b & 1) Bump(pw.tier_count[0], -1);
        if (host >> b & 1) Bump(pw.tier_count[1], -1);
        --pw.live;
        ++dropped;
      }
    };
    drop_word(Ld(s.device), Ld(s.host), 0);
    for (uint32_t g = 1; Ld(s.overflow) != 0 && g < kWords; ++g) {
      auto it = overflow.find(OverflowKey{h, g});
      if (it == overflow.end()) continue;
      drop_word(it->second.device, it->second.host, g * 64);
      overflow.erase(it);
      St(s.overflow, static_cast<uint16_t>(Ld(s.overflow) - 1));
    }
    if (Ld(s.predicted) != 0) {
      auto it = predicted.find(h);
      for (const PredHolder& p : it->second) {
        --workers[p.worker].live;
        ++dropped;
      }
      predicted.erase(it);
    }
    Bump(entries, -dropped);
    Erase(i);
  }
  uint32_t Holders(const Slot& s) const {
    uint32_t n = static_cast<uint32_t>(std::popcount(Ld(s.device) | Ld(s.host))) + Ld(s.predicted);
    for (uint32_t g = 1; Ld(s.overflow) != 0 && g < kWords; ++g)
      if (auto it = overflow.find(OverflowKey{Ld(s.hash), g}); it != overflow.end())
        n += static_cast<uint32_t>(std::popcount(it->second.device | it->second.host));
    return n;
  }
};

// An internal op: a BlockOp or a prediction, with the hash's mix computed once.
struct GlobalIndex::Op {
  BlockHash hash;
  uint64_t mix;
  uint32_t expiry_ms;  // kPredict only
  uint8_t kind;        // BlockOp::Kind or kPredict
  uint8_t tier_bit;
  static constexpr uint8_t kPredict = 3;
};

namespace {

// A slot as one lock-free reader saw it.
struct SlotView {
  const Slot* slot = nullptr;  // null: absent
  uint64_t device = 0, host = 0;
  uint32_t lru_ms = 0;
  uint16_t predicted = 0, overflow = 0;
};

// Registers a lock-free reader for the duration of a call (see ReclaimRetired).
class ReaderGuard {
 public:
  explicit ReaderGuard(std::atomic<uint64_t>& readers) : readers_(readers) { readers_.fetch_add(1); }
  ~ReaderGuard() { readers_.fetch_sub(1); }

 private:
  std::atomic<uint64_t>& readers_;
};

// Reads h's slot without a lock: retries while a writer has the shard (seqlock).
// REQUIRES: a ReaderGuard is live.
SlotView ReadSlot(const GlobalIndex::Shard& shard, BlockHash h, uint64_t mix) {
  // A write section lasts well under a microsecond unless its thread was preempted; then
  // spinning only keeps it off the core, so the reader yields after a short spin.
  constexpr int kSpinsBeforeYield = 128;
  for (int spins = 0;; ++spins) {
    const uint64_t s0 = shard.seq.load(std::memory_order_acquire);
    if (s0 & 1) {
      if (spins < kSpinsBeforeYield) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
      continue;
    }
    const GlobalIndex::Table* t = shard.table.load(std::memory_order_acquire);
    SlotView v;
    uint64_t i = mix & t->mask;
    for (uint64_t n = 0; n <= t->mask; ++n, i = (i + 1) & t->mask) {
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
      break;
    }
    // The slot loads above are acquires: this load cannot move before them, and it sees an
    // odd or newer number if any of them read a store of a later write section.
    if (shard.seq.load(std::memory_order_relaxed) == s0) return v;
  }
}

// Per-thread scratch, so FindMatches and Apply allocate nothing once warm.
struct MatchScratch {
  uint64_t active[kWords] = {};   // still matching
  uint64_t dev_run[kWords] = {};  // still matching and in their leading device run
  uint64_t blk_any[kWords] = {};
  uint64_t blk_dev[kWords] = {};
  uint32_t total_len[config::kMaxWorkers] = {};
  uint32_t dev_len[config::kMaxWorkers] = {};
};
thread_local MatchScratch t_match;

template <typename F>
void ForEachBit(uint64_t bits, int word, F f) {
  while (bits) {
    f(static_cast<WorkerId>(word * 64 + std::countr_zero(bits)));
    bits &= bits - 1;
  }
}

}  // namespace

GlobalIndex::GlobalIndex(const GlobalIndexOptions& options, Clock* clock)
    : options_(options), clock_(clock), base_ns_(clock->Now()), shards_(new Shard[config::kShards]) {}

GlobalIndex::~GlobalIndex() {
  for (Table* t : retired_) delete t;
}

GlobalIndex::Shard& GlobalIndex::ShardAt(int i) const { return shards_[i]; }

uint32_t GlobalIndex::NowMs() const {
  // +1 so that 0 (an unused slot) never is a stamp.
  return static_cast<uint32_t>((clock_->Now() - base_ns_) / kNsPerMs) + 1;
}

void GlobalIndex::Retire(Table* table) {
  std::lock_guard lock(retired_mu_);
  retired_.push_back(table);
  has_retired_.store(true, std::memory_order_relaxed);
}

void GlobalIndex::ReclaimRetired() {
  if (!has_retired_.load(std::memory_order_relaxed)) return;
  std::vector<Table*> doomed;
  {
    std::lock_guard lock(retired_mu_);
    // Every table in retired_ was replaced (seq_cst) before this load; a reader that
    // registers after it sees only the replacements.
    if (readers_.load(std::memory_order_seq_cst) != 0) return;
    doomed.swap(retired_);
    has_retired_.store(false, std::memory_order_relaxed);
  }
  for (Table* t : doomed) delete t;
}

// ---- Queries ---------------------------------------------------------------------------

void GlobalIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const {
  out->clear();
  if (hashes.empty()) return;
  ReaderGuard guard(readers_);
  MatchScratch& s = t_match;
  const uint32_t now_ms = NowMs();
  const bool stamp_lru = options_.max_entries != 0;
  auto touch = [&](const SlotView& v) {
    // Relaxed CAS from the stamp read: it never marks a slot a writer has just freed.
    if (!stamp_lru || v.lru_ms == now_ms) return;
    uint32_t expected = v.lru_ms;
    const_cast<Slot*>(v.slot)->lru_ms.compare_exchange_strong(expected, now_ms, std::memory_order_relaxed);
  };
  // The block's holders in words lo..hi of blk_any/blk_dev: the slot's masks, plus the
  // predicted and overflow rows (under the shard mutex) when the slot has any.
  auto block_bits = [&](const Shard& shard, BlockHash h, const SlotView& v, int lo, int hi) {
    for (int w = lo; w <= hi; ++w) s.blk_any[w] = s.blk_dev[w] = 0;
    if (lo == 0) {
      s.blk_any[0] = v.device | v.host;
      s.blk_dev[0] = v.device;
    }
    const bool need_overflow = v.overflow != 0 && hi >= 1;
    if (v.predicted == 0 && !need_overflow) return;
    std::lock_guard lock(shard.mu);
    if (v.predicted != 0) {
      if (auto it = shard.predicted.find(h); it != shard.predicted.end()) {
        for (const PredHolder& p : it->second) {
          const int w = static_cast<int>(p.worker / 64);
          if (p.expiry_ms <= now_ms || w < lo || w > hi) continue;
          s.blk_any[w] |= 1ull << (p.worker % 64);
          s.blk_dev[w] |= 1ull << (p.worker % 64);
        }
      }
    }
    if (need_overflow) {
      for (int w = std::max(lo, 1); w <= hi; ++w) {
        auto it = shard.overflow.find(OverflowKey{h, static_cast<uint32_t>(w)});
        if (it == shard.overflow.end()) continue;
        s.blk_any[w] |= it->second.device | it->second.host;
        s.blk_dev[w] |= it->second.device;
      }
    }
  };

  // Block 0 decides who takes part.
  const uint64_t mix0 = Mix(hashes[0]);
  const Shard& shard0 = shards_[ShardOfMix(mix0)];
  const SlotView v0 = ReadSlot(shard0, hashes[0], mix0);
  if (v0.slot == nullptr) return;
  // Workers past 63 can hold block 0 through an overflow row or a prediction.
  const int words0 = v0.overflow != 0 || v0.predicted != 0 ? kWords : 1;
  block_bits(shard0, hashes[0], v0, 0, words0 - 1);
  int lo = kWords, hi = -1;  // the words that hold active workers
  for (int w = 0; w < words0; ++w) {
    s.active[w] = s.blk_any[w];
    s.dev_run[w] = s.blk_dev[w];
    if (s.active[w] == 0) continue;
    lo = std::min(lo, w);
    hi = std::max(hi, w);
    ForEachBit(s.active[w] & ~s.dev_run[w], w, [&](WorkerId id) { s.dev_len[id] = 0; });
    ForEachBit(s.active[w], w, [&](WorkerId id) { out->push_back(PrefixMatch{id, 0, 0}); });
  }
  if (hi < 0) return;  // only expired predictions
  touch(v0);

  // The home slots of the next blocks are prefetched a window ahead, so the cache misses
  // of a long request overlap instead of queueing.
  constexpr size_t kAhead = 16;
  const size_t n = hashes.size();
  auto prefetch = [&](size_t j) {
    const uint64_t m = Mix(hashes[j]);
    const Table* t = shards_[ShardOfMix(m)].table.load(std::memory_order_acquire);
    __builtin_prefetch(&t->slots[m & t->mask]);
  };
  for (size_t j = 1; j < std::min(n, 1 + kAhead); ++j) prefetch(j);

  uint32_t i = 1;
  for (; i < n; ++i) {
    if (i + kAhead < n) prefetch(i + kAhead);
    const uint64_t mix = Mix(hashes[i]);
    const Shard& shard = shards_[ShardOfMix(mix)];
    const SlotView v = ReadSlot(shard, hashes[i], mix);
    if (v.slot == nullptr) break;
    block_bits(shard, hashes[i], v, lo, hi);
    bool still = false;
    for (int w = lo; w <= hi; ++w) {
      const uint64_t a = s.active[w];
      if (!a) continue;
      const uint64_t stay = a & s.blk_any[w];
      const uint64_t run = s.dev_run[w];
      const uint64_t run_stay = run & s.blk_dev[w] & stay;
      ForEachBit(a & ~stay, w, [&](WorkerId id) { s.total_len[id] = i; });
      ForEachBit(run & ~run_stay, w, [&](WorkerId id) { s.dev_len[id] = i; });
      s.active[w] = stay;
      s.dev_run[w] = run_stay;
      still |= stay != 0;
    }
    touch(v);
    if (!still) {
      hi = -1;  // early stop: nobody matches any more
      break;
    }
  }
  for (int w = lo; w <= hi; ++w) {
    ForEachBit(s.active[w], w, [&](WorkerId id) { s.total_len[id] = i; });
    ForEachBit(s.dev_run[w], w, [&](WorkerId id) { s.dev_len[id] = i; });
  }
  for (PrefixMatch& m : *out) {
    m.device_blocks = s.dev_len[m.worker];
    m.host_blocks = s.total_len[m.worker] - m.device_blocks;
  }
}

bool GlobalIndex::Holds(WorkerId worker, BlockHash hash) const {
  if (worker >= config::kMaxWorkers) return false;
  const uint64_t mix = Mix(hash);
  const Shard& shard = shards_[ShardOfMix(mix)];
  if (worker < config::kInlineWorkers) {
    ReaderGuard guard(readers_);
    const SlotView v = ReadSlot(shard, hash, mix);
    return ((v.device | v.host) >> worker) & 1;
  }
  std::lock_guard lock(shard.mu);
  const uint64_t i = shard.Find(hash, mix);
  return i != kNpos && shard.Bits(shard.T()->slots[i], hash, worker) != 0;
}

uint64_t GlobalIndex::BlockCount(WorkerId worker, kv::Tier tier) const {
  if (worker >= config::kMaxWorkers) return 0;
  uint64_t n = 0;
  for (int i = 0; i < config::kShards; ++i)
    n += shards_[i].workers[worker].tier_count[static_cast<int>(tier)].load(std::memory_order_relaxed);
  return n;
}

uint64_t GlobalIndex::EntryCount() const {
  uint64_t n = 0;
  for (int i = 0; i < config::kShards; ++i) n += shards_[i].entries.load(std::memory_order_relaxed);
  return n;
}

uint64_t GlobalIndex::HashCount() const {
  uint64_t n = 0;
  for (int i = 0; i < config::kShards; ++i) {
    std::lock_guard lock(shards_[i].mu);
    n += shards_[i].used;
  }
  return n;
}

uint64_t GlobalIndex::MemoryBytes() const {
  // boost::unordered_flat_* keep one metadata byte per slot (groups of 15 slots + 1 byte).
  constexpr double kMetaPerSlot = 16.0 / 15.0;
  double bytes = 0;
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::lock_guard lock(shard.mu);
    bytes += static_cast<double>(shard.T()->bytes + sizeof(Table));
    bytes += static_cast<double>(shard.overflow.bucket_count()) *
             (sizeof(std::pair<OverflowKey, Masks>) + kMetaPerSlot);
    bytes += static_cast<double>(shard.predicted.bucket_count()) *
             (sizeof(std::pair<BlockHash, PredList>) + kMetaPerSlot);
    for (const auto& [h, list] : shard.predicted) {
      if (list.capacity() > kInlineHolders) bytes += static_cast<double>(list.capacity() * sizeof(PredHolder));
    }
    for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
      bytes += static_cast<double>(shard.workers[w].blocks.capacity() * sizeof(BlockHash));
  }
  return static_cast<uint64_t>(bytes);
}

std::vector<BlockHash> GlobalIndex::BlocksOf(WorkerId worker, kv::Tier tier) const {
  std::vector<BlockHash> out;
  if (worker >= config::kMaxWorkers) return out;
  const uint8_t bit = TierBit(tier);
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::lock_guard lock(shard.mu);
    for (BlockHash h : shard.workers[worker].blocks) {
      const uint64_t j = shard.Find(h, Mix(h));
      if (j != kNpos && (shard.Bits(shard.T()->slots[j], h, worker) & bit)) out.push_back(h);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// ---- Updates ---------------------------------------------------------------------------

void GlobalIndex::ApplyToShard(Shard& shard, WorkerId worker, const Op* ops, size_t n, size_t ahead, uint32_t now_ms) {
  Table* retired = nullptr;
  int64_t d_entries = 0, d_tier[kv::kNumTiers] = {0, 0};
  auto& pw = shard.workers[worker];
  // The slot of op.hash, inserted if new, stamped as used now. A growth replaces the table;
  // more than one per batch is possible, and each old table is retired.
  auto touch = [&](const Op& op) -> Slot& {
    Table* old = nullptr;
    const uint64_t i = shard.FindOrInsert(op.hash, op.mix, now_ms, &old);
    if (old != nullptr) {
      if (retired != nullptr) Retire(retired);
      retired = old;
    }
    Slot& s = shard.T()->slots[i];
    St(s.lru_ms, now_ms);
    return s;
  };
  {
    std::lock_guard lock(shard.mu);
    shard.BeginWrite();
    for (size_t k = 0; k < n; ++k) {
      // ops[n..n + ahead) are the next shards' ops: the window runs across shards.
      if (k + kPrefetchAhead < n + ahead) Prefetch(ops[k + kPrefetchAhead]);
      const Op& op = ops[k];
      switch (op.kind) {
        case BlockOp::kStore: {
          Slot& s = touch(op);
          const uint8_t bits = shard.Bits(s, op.hash, worker);
          const bool was_predicted = shard.TakePredicted(s, op.hash, worker);  // confirms it
          if (bits == 0 && !was_predicted) {
            shard.NoteGained(worker, op.hash);
            ++d_entries;
          }
          if (!(bits & op.tier_bit)) {
            shard.SetBits(s, op.hash, worker, bits | op.tier_bit);
            ++d_tier[op.tier_bit == kDev ? 0 : 1];
          }
          break;
        }
        case BlockOp::kRemove: {
          const uint64_t i = shard.Find(op.hash, op.mix);
          if (i == kNpos) break;
          Slot& s = shard.T()->slots[i];
          const uint8_t bits = shard.Bits(s, op.hash, worker);
          if (!(bits & op.tier_bit)) break;
          shard.SetBits(s, op.hash, worker, bits & ~op.tier_bit);
          --d_tier[op.tier_bit == kDev ? 0 : 1];
          if ((bits & ~op.tier_bit) == 0) {
            --pw.live;  // the reverse list keeps the hash until it is compacted
            --d_entries;
            if (Shard::Empty(s)) shard.Erase(i);
          }
          break;
        }
        case BlockOp::kMove: {
          const uint64_t i = shard.Find(op.hash, op.mix);
          if (i == kNpos) break;
          Slot& s = shard.T()->slots[i];
          const uint8_t bits = shard.Bits(s, op.hash, worker);
          if (bits == 0) break;
          if (bits & kDev) --d_tier[0];
          if (bits & kHostBit) --d_tier[1];
          shard.SetBits(s, op.hash, worker, op.tier_bit);
          ++d_tier[op.tier_bit == kDev ? 0 : 1];
          break;
        }
        case Op::kPredict: {
          Slot& s = touch(op);
          if (shard.Bits(s, op.hash, worker) != 0) break;  // already held for real
          auto& list = shard.predicted[op.hash];
          auto it = std::find_if(list.begin(), list.end(), [&](const PredHolder& p) { return p.worker == worker; });
          if (it != list.end()) {
            it->expiry_ms = op.expiry_ms;
            break;
          }
          list.push_back(PredHolder{worker, op.expiry_ms});
          St(s.predicted, static_cast<uint16_t>(Ld(s.predicted) + 1));
          shard.NoteGained(worker, op.hash);
          ++d_entries;
          break;
        }
      }
    }
    shard.EndWrite();
    Bump(shard.entries, d_entries);
    Bump(pw.tier_count[0], d_tier[0]);
    Bump(pw.tier_count[1], d_tier[1]);
    shard.MaybeCompact(worker);
  }
  if (retired != nullptr) Retire(retired);
  if (options_.max_entries) TrimIfNeeded(shard);
}

void GlobalIndex::Prefetch(const Op& op) const {
  // Another shard's table may be replaced meanwhile; a prefetch into a retired one is
  // harmless. REQUIRES: a ReaderGuard is live, so no retired table is freed.
  const Table* t = shards_[ShardOfMix(op.mix)].table.load(std::memory_order_relaxed);
  __builtin_prefetch(&t->slots[op.mix & t->mask]);
}

void GlobalIndex::ApplyOps(WorkerId worker, Op* ops, size_t n) {
  KVF_CHECK(worker < config::kMaxWorkers);
  if (n == 0) return;
  const uint32_t now_ms = NowMs();
  if (n == 1) {
    ApplyToShard(shards_[ShardOfMix(ops[0].mix)], worker, ops, 1, 0, now_ms);
  } else {
    // Counting sort by shard, stable, so each block's ops keep their order.
    thread_local std::vector<Op> sorted;
    uint32_t start[config::kShards + 1] = {};
    for (size_t k = 0; k < n; ++k) ++start[ShardOfMix(ops[k].mix) + 1];
    for (int i = 0; i < config::kShards; ++i) start[i + 1] += start[i];
    sorted.resize(n);
    uint32_t fill[config::kShards];
    std::memcpy(fill, start, sizeof(fill));
    for (size_t k = 0; k < n; ++k) sorted[fill[ShardOfMix(ops[k].mix)]++] = ops[k];
    // Prefetch reads other shards' tables: registered as a reader, none is freed meanwhile.
    ReaderGuard guard(readers_);
    for (size_t k = 0; k < std::min<size_t>(n, kPrefetchAhead); ++k) Prefetch(sorted[k]);
    for (int i = 0; i < config::kShards; ++i)
      if (start[i + 1] > start[i])
        ApplyToShard(shards_[i], worker, &sorted[start[i]], start[i + 1] - start[i], n - start[i + 1], now_ms);
  }
  ReclaimRetired();
}

void GlobalIndex::Apply(WorkerId worker, std::span<const BlockOp> ops) {
  thread_local std::vector<Op> buf;
  buf.resize(ops.size());
  for (size_t k = 0; k < ops.size(); ++k)
    buf[k] = Op{ops[k].hash, Mix(ops[k].hash), 0, static_cast<uint8_t>(ops[k].kind), TierBit(ops[k].tier)};
  ApplyOps(worker, buf.data(), buf.size());
}

void GlobalIndex::Store(WorkerId worker, BlockHash hash, kv::Tier tier) {
  Op op{hash, Mix(hash), 0, BlockOp::kStore, TierBit(tier)};
  ApplyOps(worker, &op, 1);
}

void GlobalIndex::StoreBlocks(WorkerId worker, std::span<const kv::StoredBlock> blocks) {
  thread_local std::vector<Op> buf;
  buf.resize(blocks.size());
  for (size_t k = 0; k < blocks.size(); ++k)
    buf[k] = Op{blocks[k].hash, Mix(blocks[k].hash), 0, BlockOp::kStore, TierBit(blocks[k].tier)};
  ApplyOps(worker, buf.data(), buf.size());
}

void GlobalIndex::Remove(WorkerId worker, BlockHash hash, kv::Tier tier) {
  if (worker >= config::kMaxWorkers) return;
  Op op{hash, Mix(hash), 0, BlockOp::kRemove, TierBit(tier)};
  ApplyOps(worker, &op, 1);
}

bool GlobalIndex::Move(WorkerId worker, BlockHash hash, kv::Tier tier) {
  if (worker >= config::kMaxWorkers) return false;
  const uint64_t mix = Mix(hash);
  Shard& shard = shards_[ShardOfMix(mix)];
  std::lock_guard lock(shard.mu);
  const uint64_t i = shard.Find(hash, mix);
  if (i == kNpos) return false;
  Slot& s = shard.T()->slots[i];
  const uint8_t bits = shard.Bits(s, hash, worker);
  if (bits == 0) return false;
  auto& counts = shard.workers[worker].tier_count;
  if (bits & kDev) Bump(counts[0], -1);
  if (bits & kHostBit) Bump(counts[1], -1);
  shard.BeginWrite();
  shard.SetBits(s, hash, worker, TierBit(tier));
  shard.EndWrite();
  Bump(counts[static_cast<int>(tier)], 1);
  return true;
}

void GlobalIndex::InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) {
  KVF_CHECK(worker < config::kMaxWorkers);
  const uint32_t expiry = NowMs() + static_cast<uint32_t>(std::max<DurationNs>(ttl, 0) / kNsPerMs);
  thread_local std::vector<Op> buf;
  buf.resize(hashes.size());
  for (size_t k = 0; k < hashes.size(); ++k) buf[k] = Op{hashes[k], Mix(hashes[k]), expiry, Op::kPredict, 0};
  ApplyOps(worker, buf.data(), buf.size());
}

void GlobalIndex::RemoveWorker(WorkerId worker) {
  if (worker >= config::kMaxWorkers) return;
  for (int si = 0; si < config::kShards; ++si) {
    Shard& shard = shards_[si];
    std::lock_guard lock(shard.mu);
    auto& pw = shard.workers[worker];
    if (pw.blocks.empty()) continue;
    shard.BeginWrite();
    int64_t dropped = 0;
    for (BlockHash h : pw.blocks) {
      const uint64_t i = shard.Find(h, Mix(h));
      if (i == kNpos) continue;  // stale: removed or trimmed since
      Slot& s = shard.T()->slots[i];
      if (shard.Bits(s, h, worker) != 0) {
        shard.SetBits(s, h, worker, 0);
        ++dropped;
      }
      if (shard.TakePredicted(s, h, worker)) ++dropped;
      if (Shard::Empty(s)) shard.Erase(i);
    }
    shard.EndWrite();
    Bump(shard.entries, -dropped);
    std::vector<BlockHash>().swap(pw.blocks);
    pw.live = 0;
    pw.tier_count[0].store(0, std::memory_order_relaxed);
    pw.tier_count[1].store(0, std::memory_order_relaxed);
  }
}

uint64_t GlobalIndex::SweepExpired() {
  const uint32_t now_ms = NowMs();
  uint64_t dropped = 0;
  for (int si = 0; si < config::kShards; ++si) {
    Shard& shard = shards_[si];
    std::lock_guard lock(shard.mu);
    if (shard.predicted.empty()) continue;
    shard.BeginWrite();
    int64_t d_entries = 0;
    boost::unordered::erase_if(shard.predicted, [&](auto& entry) {
      auto& list = entry.second;
      size_t keep = 0;
      for (const PredHolder& p : list) {
        if (p.expiry_ms > now_ms) {
          list[keep++] = p;
          continue;
        }
        --shard.workers[p.worker].live;
        --d_entries;
        ++dropped;
      }
      if (keep == list.size()) return false;
      const uint64_t i = shard.Find(entry.first, Mix(entry.first));
      KVF_CHECK(i != kNpos);
      Slot& s = shard.T()->slots[i];
      St(s.predicted, static_cast<uint16_t>(keep));
      list.resize(keep);
      if (keep != 0) return false;
      if (Shard::Empty(s)) shard.Erase(i);
      return true;
    });
    shard.EndWrite();
    Bump(shard.entries, d_entries);
  }
  return dropped;
}

void GlobalIndex::TrimIfNeeded(Shard& shard) {
  const uint64_t cap = std::max<uint64_t>(1, options_.max_entries / config::kShards);
  if (shard.entries.load(std::memory_order_relaxed) <= cap) return;
  std::lock_guard lock(shard.mu);
  const uint64_t entries = shard.entries.load(std::memory_order_relaxed);
  if (entries <= cap) return;
  // Find the stamp below which the oldest blocks hold (entries - target) entries.
  const uint64_t target = static_cast<uint64_t>(static_cast<double>(cap) * config::kTrimTargetFraction);
  const Table* t = shard.T();
  std::vector<std::pair<uint32_t, uint32_t>> stamps;  // (lru_ms, holders)
  stamps.reserve(shard.used);
  for (uint64_t i = 0; i <= t->mask; ++i)
    if (const uint32_t lru = Ld(t->slots[i].lru_ms)) stamps.emplace_back(lru, shard.Holders(t->slots[i]));
  std::sort(stamps.begin(), stamps.end());
  const uint64_t to_drop = entries - target;
  uint64_t dropped = 0;
  uint32_t cutoff = 0;
  for (const auto& [stamp, holders] : stamps) {
    if (dropped >= to_drop) break;
    cutoff = stamp;
    dropped += holders;
  }
  // Remove every block stamped <= cutoff (ties go together, so this may drop a bit more).
  std::vector<BlockHash> doomed;
  for (uint64_t i = 0; i <= t->mask; ++i) {
    const uint32_t lru = Ld(t->slots[i].lru_ms);
    if (lru != 0 && lru <= cutoff) doomed.push_back(Ld(t->slots[i].hash));
  }
  shard.BeginWrite();
  for (BlockHash h : doomed) {
    const uint64_t i = shard.Find(h, Mix(h));
    if (i != kNpos) shard.DropSlot(i);
  }
  shard.EndWrite();
  for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
    if (!shard.workers[w].blocks.empty()) shard.MaybeCompact(w);
}

void GlobalIndex::CheckInvariants() const {
  for (int si = 0; si < config::kShards; ++si) {
    const Shard& shard = shards_[si];
    std::lock_guard lock(shard.mu);
    KVF_CHECK((shard.seq.load() & 1) == 0);
    const Table* t = shard.T();
    uint64_t used = 0, entries = 0;
    std::vector<uint64_t> counts(config::kMaxWorkers * kv::kNumTiers, 0), live(config::kMaxWorkers, 0);
    std::vector<boost::unordered_flat_set<BlockHash>> reverse(config::kMaxWorkers);
    for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
      reverse[w].insert(shard.workers[w].blocks.begin(), shard.workers[w].blocks.end());
    auto held = [&](WorkerId w, uint8_t bits, BlockHash h) {
      if (bits & kDev) ++counts[w * kv::kNumTiers];
      if (bits & kHostBit) ++counts[w * kv::kNumTiers + 1];
      ++live[w];
      ++entries;
      KVF_CHECK(reverse[w].contains(h));                                   // 3
    };
    uint64_t overflow_rows = 0, predicted_rows = 0;
    for (uint64_t i = 0; i <= t->mask; ++i) {
      const Slot& s = t->slots[i];
      if (Ld(s.lru_ms) == 0) continue;
      ++used;
      const BlockHash h = Ld(s.hash);
      KVF_CHECK(ShardOfMix(Mix(h)) == si);
      KVF_CHECK(shard.Find(h, Mix(h)) == i);                              // 5
      KVF_CHECK(!Shard::Empty(s));                                        // 1
      for (uint64_t m = Ld(s.device) | Ld(s.host); m; m &= m - 1)
        held(static_cast<WorkerId>(std::countr_zero(m)), shard.Bits(s, h, static_cast<WorkerId>(std::countr_zero(m))), h);
      uint16_t rows = 0;
      for (uint32_t g = 1; g < kWords; ++g) {
        auto it = shard.overflow.find(OverflowKey{h, g});
        if (it == shard.overflow.end()) continue;
        ++rows;
        KVF_CHECK((it->second.device | it->second.host) != 0);
        for (uint64_t m = it->second.device | it->second.host; m; m &= m - 1) {
          const WorkerId w = g * 64 + static_cast<WorkerId>(std::countr_zero(m));
          held(w, shard.Bits(s, h, w), h);
        }
      }
      KVF_CHECK(rows == Ld(s.overflow));                                  // 1
      overflow_rows += rows;
      if (Ld(s.predicted) != 0) {
        auto it = shard.predicted.find(h);
        KVF_CHECK(it != shard.predicted.end());
        KVF_CHECK(it->second.size() == Ld(s.predicted));                  // 1
        ++predicted_rows;
        for (const PredHolder& p : it->second) {
          KVF_CHECK(shard.Bits(s, h, p.worker) == 0);                     // 2
          ++live[p.worker];
          ++entries;
          KVF_CHECK(reverse[p.worker].contains(h));                       // 3
        }
      } else {
        KVF_CHECK(!shard.predicted.contains(h));
      }
    }
    KVF_CHECK(used == shard.used);
    KVF_CHECK(overflow_rows == shard.overflow.size());                    // 1: no orphan rows
    KVF_CHECK(predicted_rows == shard.predicted.size());
    KVF_CHECK(entries == shard.entries.load());
    for (WorkerId w = 0; w < config::kMaxWorkers; ++w) {
      KVF_CHECK(shard.workers[w].live == live[w]);                        // 3
      for (int tier = 0; tier < kv::kNumTiers; ++tier)                     // 4
        KVF_CHECK(shard.workers[w].tier_count[tier].load() == counts[w * kv::kNumTiers + tier]);
    }
  }
}

}  // namespace kvfleet::router
