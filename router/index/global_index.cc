#include "router/index/global_index.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "common/check.h"

namespace kvfleet::router {

namespace {

uint8_t TierBit(kv::Tier tier) {
  return tier == kv::Tier::kDevice ? GlobalIndex::kDeviceBit : GlobalIndex::kHostBit;
}
constexpr uint8_t kTierBits = GlobalIndex::kDeviceBit | GlobalIndex::kHostBit;

// Counters written only under their shard's exclusive lock and read lock-free elsewhere:
// a relaxed load + store is enough and avoids a locked read-modify-write per event.
void Bump(std::atomic<uint64_t>& counter, int64_t delta) {
  counter.store(counter.load(std::memory_order_relaxed) + static_cast<uint64_t>(delta), std::memory_order_relaxed);
}

int ShardIndex(BlockHash h) {
  // Hashes are XXH3 outputs; a multiply spreads test-sized small integers too.
  return static_cast<int>((h * 0x9E3779B97F4A7C15ull) >> (64 - config::kShardBits));
}

}  // namespace

// Worker bitsets of a hot block (one held by many workers), so FindMatches can intersect
// 64 workers per instruction instead of walking 64 holders per block.
struct DenseBits {
  static constexpr int kWords = config::kMaxWorkers / 64;
  uint64_t device[kWords];  // holders with the device bit
  uint64_t any[kWords];     // holders with any tier bit
  uint32_t predicted = 0;   // holders with the predicted bit (FindMatches walks those blocks)
};

// The holders of one block: up to kInline in place, more in a heap array; a list that grows
// past kDenseFrom holders also keeps DenseBits in front of its array. Every flag change goes
// through SetFlags/Erase so the bits stay exact.
class GlobalIndex::HolderList {
 public:
  static constexpr uint16_t kInline = 2;
  // Past 16 holders the sparse array is >= 128 bytes, and the 256-byte bitsets pay for
  // themselves in FindMatches time; hot shared prefixes are few, so memory barely moves.
  static constexpr uint16_t kDenseFrom = 16;
  HolderList() = default;
  HolderList(const HolderList&) = delete;
  HolderList& operator=(const HolderList&) = delete;
  HolderList(HolderList&& o) noexcept { MoveFrom(o); }
  HolderList& operator=(HolderList&& o) noexcept {
    if (this != &o) {
      Release();
      MoveFrom(o);
    }
    return *this;
  }
  ~HolderList() { Release(); }

  uint16_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Holder* data() { return capacity_ > kInline ? heap_ : inline_; }
  const Holder* data() const { return capacity_ > kInline ? heap_ : inline_; }
  Holder* begin() { return data(); }
  Holder* end() { return data() + size_; }
  const Holder* begin() const { return data(); }
  const Holder* end() const { return data() + size_; }
  // Non-null once the list has grown past kDenseFrom.
  const DenseBits* dense() const { return capacity_ > kDenseFrom ? Dense() : nullptr; }

  Holder* Find(WorkerId w) {
    for (Holder& h : *this)
      if (h.worker == w) return &h;
    return nullptr;
  }
  // A new holder with no flags (the caller sets them with SetFlags).
  Holder& Add(WorkerId w) {
    if (size_ == std::max<uint16_t>(capacity_, kInline)) Grow();
    Holder& h = data()[size_++];
    h = Holder{static_cast<uint16_t>(w), 0, 0, 0};
    return h;
  }
  void SetFlags(Holder* h, uint8_t flags) {
    if (DenseBits* d = capacity_ > kDenseFrom ? Dense() : nullptr) {
      const uint64_t bit = 1ull << (h->worker % 64);
      uint64_t& dev = d->device[h->worker / 64];
      uint64_t& any = d->any[h->worker / 64];
      dev = (flags & kDeviceBit) ? dev | bit : dev & ~bit;
      any = (flags & (kDeviceBit | kHostBit)) ? any | bit : any & ~bit;
      d->predicted += ((flags & kPredictedBit) ? 1 : 0) - ((h->flags & kPredictedBit) ? 1 : 0);
    }
    h->flags = flags;
  }
  void Erase(Holder* h) {
    SetFlags(h, 0);
    *h = data()[size_ - 1];
    --size_;
  }
  uint64_t HeapBytes() const {
    if (capacity_ <= kInline) return 0;
    return capacity_ * sizeof(Holder) + (capacity_ > kDenseFrom ? sizeof(DenseBits) : 0);
  }

  uint32_t lru_ms = 0;  // last store, prediction or match; relaxed atomic_ref on the read path

 private:
  DenseBits* Dense() const { return reinterpret_cast<DenseBits*>(heap_) - 1; }
  void Grow() {
    const uint16_t cap = std::max<uint16_t>(capacity_, kInline);
    const uint16_t next = static_cast<uint16_t>(cap * 2);
    const bool dense = next > kDenseFrom;
    // One allocation: [DenseBits][Holder x next] when dense, else [Holder x next].
    const size_t bytes = next * sizeof(Holder) + (dense ? sizeof(DenseBits) : 0);
    char* raw = static_cast<char*>(::operator new(bytes));
    Holder* fresh = reinterpret_cast<Holder*>(raw + (dense ? sizeof(DenseBits) : 0));
    std::memcpy(fresh, data(), size_ * sizeof(Holder));
    if (dense) {
      DenseBits* d = reinterpret_cast<DenseBits*>(raw);
      *d = DenseBits{};
      for (uint16_t i = 0; i < size_; ++i) {
        const Holder& h = fresh[i];
        const uint64_t bit = 1ull << (h.worker % 64);
        if (h.flags & kDeviceBit) d->device[h.worker / 64] |= bit;
        if (h.flags & (kDeviceBit | kHostBit)) d->any[h.worker / 64] |= bit;
        if (h.flags & kPredictedBit) ++d->predicted;
      }
    }
    Release();
    heap_ = fresh;
    capacity_ = next;
  }
  void Release() {
    if (capacity_ > kInline) {
      char* raw = reinterpret_cast<char*>(heap_) - (capacity_ > kDenseFrom ? sizeof(DenseBits) : 0);
      ::operator delete(raw);
    }
    capacity_ = 0;
  }
  void MoveFrom(HolderList& o) {
    size_ = o.size_;
    capacity_ = o.capacity_;
    lru_ms = o.lru_ms;
    if (o.capacity_ > kInline) {
      heap_ = o.heap_;
    } else {
      std::memcpy(inline_, o.inline_, sizeof(inline_));
    }
    o.size_ = 0;
    o.capacity_ = 0;
  }

  union {
    Holder inline_[kInline];
    Holder* heap_;
  };
  uint16_t size_ = 0;
  uint16_t capacity_ = 0;  // 0 or <= kInline: inline
};

static_assert(sizeof(GlobalIndex::Holder) == 8);

struct alignas(64) GlobalIndex::Shard {
  struct PerWorker {
    boost::unordered_flat_set<BlockHash> blocks;  // every hash with a holder of this worker
    std::atomic<uint64_t> tier_count[kv::kNumTiers] = {};
  };
  struct Predicted {
    BlockHash hash;
    uint32_t expiry_ms;
    uint16_t worker;
  };

  mutable std::shared_mutex mu;
  boost::unordered_flat_map<BlockHash, HolderList> map;
  std::unique_ptr<PerWorker[]> workers{new PerWorker[config::kMaxWorkers]};
  std::vector<Predicted> predicted;  // insertion order; swept when expired
  std::atomic<uint64_t> entries{0};  // (block, worker) entries in this shard; written under mu
  uint64_t heap_bytes = 0;           // overflow holder arrays
};

GlobalIndex::GlobalIndex(const GlobalIndexOptions& options, Clock* clock)
    : options_(options), clock_(clock), base_ns_(clock->Now()), shards_(new Shard[config::kShards]) {}

GlobalIndex::~GlobalIndex() = default;

GlobalIndex::Shard& GlobalIndex::ShardOf(BlockHash h) const { return shards_[ShardIndex(h)]; }

uint32_t GlobalIndex::NowMs() const {
  // +1 so that 0 never means "now" for an entry stamped at construction.
  return static_cast<uint32_t>((clock_->Now() - base_ns_) / kNsPerMs) + 1;
}

namespace {
// Per-thread scratch for FindMatches, so the hot path allocates nothing. Workers are bits:
// `active` still match, `dev_run` are active and still in their leading device run.
struct MatchScratch {
  static constexpr int kWords = DenseBits::kWords;
  uint64_t active[kWords] = {};
  uint64_t dev_run[kWords] = {};
  uint64_t blk_any[kWords] = {};
  uint64_t blk_dev[kWords] = {};
  uint32_t total_len[config::kMaxWorkers] = {};
  uint32_t dev_len[config::kMaxWorkers] = {};
};
thread_local MatchScratch t_scratch;

template <typename F>
void ForEachBit(uint64_t bits, int word, F f) {
  while (bits) {
    f(static_cast<WorkerId>(word * 64 + __builtin_ctzll(bits)));
    bits &= bits - 1;
  }
}
}  // namespace

void GlobalIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<WorkerMatch>* out) const {
  out->clear();
  if (hashes.empty()) return;
  MatchScratch& s = t_scratch;
  const uint32_t now_ms = NowMs();
  uint64_t locked = 0;  // bit i: shard i is held shared by this call
  static_assert(config::kShards <= 64);
  auto find = [&](BlockHash h) -> const HolderList* {
    const int si = ShardIndex(h);
    const Shard& shard = shards_[si];
    if (!(locked & (1ull << si))) {
      shard.mu.lock_shared();
      locked |= 1ull << si;
    }
    auto it = shard.map.find(h);
    return it == shard.map.end() ? nullptr : &it->second;
  };
  auto touch = [&](const HolderList& list) {
    // Relaxed: the stamp only orders trimming; a lost update costs nothing.
    std::atomic_ref<uint32_t> lru(const_cast<HolderList&>(list).lru_ms);
    if (lru.load(std::memory_order_relaxed) != now_ms) lru.store(now_ms, std::memory_order_relaxed);
  };

  // Block 0 decides who takes part.
  const HolderList* first = find(hashes[0]);
  int lo = MatchScratch::kWords, hi = -1;  // the words that hold active workers
  auto live = [&](const Holder& h) {
    return (h.flags & kTierBits) || ((h.flags & kPredictedBit) && h.expiry_ms > now_ms);
  };
  if (first != nullptr) {
    for (const Holder& h : *first) {
      if (!live(h)) continue;
      lo = std::min(lo, h.worker / 64);
      hi = std::max(hi, h.worker / 64);
    }
    for (int w = lo; w <= hi; ++w) s.active[w] = s.dev_run[w] = 0;
    for (const Holder& h : *first) {
      if (!live(h)) continue;
      const uint64_t bit = 1ull << (h.worker % 64);
      s.active[h.worker / 64] |= bit;
      if ((h.flags & kDeviceBit) || (h.flags & kPredictedBit && h.expiry_ms > now_ms)) {
        s.dev_run[h.worker / 64] |= bit;
      } else {
        s.dev_len[h.worker] = 0;
      }
      out->push_back(WorkerMatch{h.worker, 0, 0});
    }
    touch(*first);
  }

  uint32_t i = 1;
  for (; i < hashes.size() && hi >= lo; ++i) {
    const HolderList* list = find(hashes[i]);
    if (list == nullptr) break;
    const uint64_t* any;
    const uint64_t* dev;
    const DenseBits* dense = list->dense();
    if (dense != nullptr && dense->predicted == 0) {
      any = dense->any;
      dev = dense->device;
    } else {
      for (int w = lo; w <= hi; ++w) s.blk_any[w] = s.blk_dev[w] = 0;
      for (const Holder& h : *list) {
        const int word = h.worker / 64;
        if (word < lo || word > hi) continue;
        const bool predicted_live = (h.flags & kPredictedBit) && h.expiry_ms > now_ms;
        const uint64_t bit = 1ull << (h.worker % 64);
        if ((h.flags & kTierBits) || predicted_live) s.blk_any[word] |= bit;
        if ((h.flags & kDeviceBit) || predicted_live) s.blk_dev[word] |= bit;
      }
      any = s.blk_any;
      dev = s.blk_dev;
    }
    bool still = false;
    for (int w = lo; w <= hi; ++w) {
      const uint64_t a = s.active[w];
      if (!a) continue;
      const uint64_t stay = a & any[w];
      const uint64_t run = s.dev_run[w];
      const uint64_t run_stay = run & dev[w] & stay;
      ForEachBit(a & ~stay, w, [&](WorkerId id) { s.total_len[id] = i; });
      ForEachBit(run & ~run_stay, w, [&](WorkerId id) { s.dev_len[id] = i; });
      s.active[w] = stay;
      s.dev_run[w] = run_stay;
      still |= stay != 0;
    }
    touch(*list);
    if (!still) {
      hi = -1;  // early stop: nobody matches any more
      break;
    }
  }
  for (int w = lo; w <= hi; ++w) {
    ForEachBit(s.active[w], w, [&](WorkerId id) { s.total_len[id] = i; });
    ForEachBit(s.dev_run[w], w, [&](WorkerId id) { s.dev_len[id] = i; });
  }
  for (WorkerMatch& m : *out) {
    m.device_blocks = s.dev_len[m.worker];
    m.host_blocks = s.total_len[m.worker] - m.device_blocks;
  }
  while (locked) {
    const int si = __builtin_ctzll(locked);
    shards_[si].mu.unlock_shared();
    locked &= locked - 1;
  }
}

bool GlobalIndex::Holds(WorkerId worker, BlockHash hash) const {
  const Shard& shard = ShardOf(hash);
  std::shared_lock lock(shard.mu);
  auto it = shard.map.find(hash);
  if (it == shard.map.end()) return false;
  for (const Holder& h : it->second)
    if (h.worker == worker) return (h.flags & kTierBits) != 0;
  return false;
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
    std::shared_lock lock(shards_[i].mu);
    n += shards_[i].map.size();
  }
  return n;
}

uint64_t GlobalIndex::MemoryBytes() const {
  // boost::unordered_flat_* keep one metadata byte per slot (groups of 15 slots + 1 byte).
  constexpr double kMetaPerSlot = 16.0 / 15.0;
  double bytes = 0;
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::shared_lock lock(shard.mu);
    bytes += shard.map.bucket_count() * (sizeof(std::pair<BlockHash, HolderList>) + kMetaPerSlot);
    bytes += shard.heap_bytes;
    bytes += shard.predicted.capacity() * sizeof(Shard::Predicted);
    for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
      bytes += shard.workers[w].blocks.bucket_count() * (sizeof(BlockHash) + kMetaPerSlot);
  }
  return static_cast<uint64_t>(bytes);
}

std::vector<BlockHash> GlobalIndex::BlocksOf(WorkerId worker, kv::Tier tier) const {
  std::vector<BlockHash> out;
  const uint8_t bit = TierBit(tier);
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::shared_lock lock(shard.mu);
    for (BlockHash h : shard.workers[worker].blocks) {
      auto it = shard.map.find(h);
      if (it == shard.map.end()) continue;
      for (const Holder& holder : it->second)
        if (holder.worker == worker && (holder.flags & bit)) out.push_back(h);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void GlobalIndex::Store(WorkerId worker, BlockHash hash, kv::Tier tier) {
  KVF_CHECK(worker < config::kMaxWorkers);
  StoreOne(worker, hash, tier, NowMs());
}

void GlobalIndex::StoreBlocks(WorkerId worker, std::span<const kv::StoredBlock> blocks) {
  KVF_CHECK(worker < config::kMaxWorkers);
  const uint32_t now_ms = NowMs();
  for (const kv::StoredBlock& b : blocks) StoreOne(worker, b.hash, b.tier, now_ms);
}

void GlobalIndex::StoreOne(WorkerId worker, BlockHash hash, kv::Tier tier, uint32_t now_ms) {
  Shard& shard = ShardOf(hash);
  const uint8_t bit = TierBit(tier);
  {
    std::unique_lock lock(shard.mu);
    HolderList& list = shard.map[hash];
    list.lru_ms = now_ms;
    Holder* h = list.Find(worker);
    if (h == nullptr) {
      const uint64_t before = list.HeapBytes();
      h = &list.Add(worker);
      shard.heap_bytes += list.HeapBytes() - before;
      shard.workers[worker].blocks.insert(hash);
      Bump(shard.entries, 1);
    }
    if (!(h->flags & bit)) Bump(shard.workers[worker].tier_count[static_cast<int>(tier)], 1);
    list.SetFlags(h, static_cast<uint8_t>((h->flags & ~kPredictedBit) | bit));  // confirms a prediction
    h->expiry_ms = 0;
  }
  if (options_.max_entries) TrimIfNeeded(shard);
}

void GlobalIndex::Remove(WorkerId worker, BlockHash hash, kv::Tier tier) {
  if (worker >= config::kMaxWorkers) return;
  Shard& shard = ShardOf(hash);
  const uint8_t bit = TierBit(tier);
  std::unique_lock lock(shard.mu);
  auto it = shard.map.find(hash);
  if (it == shard.map.end()) return;
  HolderList& list = it->second;
  Holder* h = list.Find(worker);
  if (h == nullptr || !(h->flags & bit)) return;
  list.SetFlags(h, static_cast<uint8_t>(h->flags & ~bit));
  Bump(shard.workers[worker].tier_count[static_cast<int>(tier)], -1);
  if (h->flags == 0) {
    list.Erase(h);
    shard.workers[worker].blocks.erase(hash);
    Bump(shard.entries, -1);
    if (list.empty()) {
      shard.heap_bytes -= list.HeapBytes();
      shard.map.erase(it);
    }
  }
}

bool GlobalIndex::Move(WorkerId worker, BlockHash hash, kv::Tier tier) {
  if (worker >= config::kMaxWorkers) return false;
  Shard& shard = ShardOf(hash);
  std::unique_lock lock(shard.mu);
  auto it = shard.map.find(hash);
  if (it == shard.map.end()) return false;
  Holder* h = it->second.Find(worker);
  if (h == nullptr || !(h->flags & kTierBits)) return false;
  auto& counts = shard.workers[worker].tier_count;
  if (h->flags & kDeviceBit) Bump(counts[0], -1);
  if (h->flags & kHostBit) Bump(counts[1], -1);
  it->second.SetFlags(h, static_cast<uint8_t>((h->flags & ~kTierBits) | TierBit(tier)));
  Bump(counts[static_cast<int>(tier)], 1);
  return true;
}

void GlobalIndex::InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) {
  KVF_CHECK(worker < config::kMaxWorkers);
  const uint32_t now_ms = NowMs();
  const uint32_t expiry = now_ms + static_cast<uint32_t>(std::max<DurationNs>(ttl, 0) / kNsPerMs);
  for (BlockHash hash : hashes) {
    Shard& shard = ShardOf(hash);
    {
      std::unique_lock lock(shard.mu);
      HolderList& list = shard.map[hash];
      list.lru_ms = now_ms;
      Holder* h = list.Find(worker);
      if (h == nullptr) {
        const uint64_t before = list.HeapBytes();
        h = &list.Add(worker);
        shard.heap_bytes += list.HeapBytes() - before;
        shard.workers[worker].blocks.insert(hash);
        Bump(shard.entries, 1);
      } else if (h->flags & kTierBits) {
        continue;  // already held for real
      }
      list.SetFlags(h, static_cast<uint8_t>(h->flags | kPredictedBit));
      h->expiry_ms = expiry;
      shard.predicted.push_back(Shard::Predicted{hash, expiry, static_cast<uint16_t>(worker)});
    }
    if (options_.max_entries) TrimIfNeeded(shard);
  }
}

void GlobalIndex::RemoveWorker(WorkerId worker) {
  if (worker >= config::kMaxWorkers) return;
  for (int i = 0; i < config::kShards; ++i) {
    Shard& shard = shards_[i];
    std::unique_lock lock(shard.mu);
    auto& pw = shard.workers[worker];
    for (BlockHash hash : pw.blocks) {
      auto it = shard.map.find(hash);
      KVF_CHECK(it != shard.map.end());
      HolderList& list = it->second;
      Holder* h = list.Find(worker);
      KVF_CHECK(h != nullptr);
      list.Erase(h);
      if (list.empty()) {
        shard.heap_bytes -= list.HeapBytes();
        shard.map.erase(it);
      }
    }
    Bump(shard.entries, -static_cast<int64_t>(pw.blocks.size()));
    
    pw.blocks.clear();
    pw.tier_count[0].store(0, std::memory_order_relaxed);
    pw.tier_count[1].store(0, std::memory_order_relaxed);
  }
}

uint64_t GlobalIndex::SweepExpired() {
  const uint32_t now_ms = NowMs();
  uint64_t dropped = 0;
  for (int i = 0; i < config::kShards; ++i) {
    Shard& shard = shards_[i];
    std::unique_lock lock(shard.mu);
    size_t keep = 0;
    for (size_t j = 0; j < shard.predicted.size(); ++j) {
      const Shard::Predicted& p = shard.predicted[j];
      if (p.expiry_ms > now_ms) {
        shard.predicted[keep++] = p;
        continue;
      }
      auto it = shard.map.find(p.hash);
      if (it == shard.map.end()) continue;
      Holder* h = it->second.Find(p.worker);
      // Only the stamp that is still current: a later prediction or a Store supersedes it.
      if (h == nullptr || !(h->flags & kPredictedBit) || h->expiry_ms != p.expiry_ms) continue;
      it->second.SetFlags(h, static_cast<uint8_t>(h->flags & ~kPredictedBit));
      h->expiry_ms = 0;
      ++dropped;
      if (h->flags == 0) {
        it->second.Erase(h);
        shard.workers[p.worker].blocks.erase(p.hash);
        Bump(shard.entries, -1);
        if (it->second.empty()) {
          shard.heap_bytes -= it->second.HeapBytes();
          shard.map.erase(it);
        }
      }
    }
    shard.predicted.resize(keep);
  }
  return dropped;
}

void GlobalIndex::TrimIfNeeded(Shard& shard) {
  const uint64_t cap = std::max<uint64_t>(1, options_.max_entries / config::kShards);
  std::unique_lock lock(shard.mu);
  if (shard.entries.load(std::memory_order_relaxed) <= cap) return;
  // Find the stamp below which the oldest blocks hold (entries - target) entries.
  const uint64_t target = static_cast<uint64_t>(cap * config::kTrimTargetFraction);
  std::vector<std::pair<uint32_t, uint16_t>> stamps;  // (lru_ms, holders)
  stamps.reserve(shard.map.size());
  for (const auto& [hash, list] : shard.map) stamps.emplace_back(list.lru_ms, list.size());
  std::sort(stamps.begin(), stamps.end());
  uint64_t to_drop = shard.entries.load(std::memory_order_relaxed) - target, dropped = 0;
  uint32_t cutoff = 0;
  for (const auto& [stamp, n] : stamps) {
    if (dropped >= to_drop) break;
    cutoff = stamp;
    dropped += n;
  }
  // Remove every block stamped <= cutoff (ties go together, so this may drop a bit more).
  boost::unordered::erase_if(shard.map, [&](auto& entry) {
    if (entry.second.lru_ms > cutoff) return false;
    for (const Holder& h : entry.second) {
      auto& pw = shard.workers[h.worker];
      pw.blocks.erase(entry.first);
      if (h.flags & kDeviceBit) Bump(pw.tier_count[0], -1);
      if (h.flags & kHostBit) Bump(pw.tier_count[1], -1);
      Bump(shard.entries, -1);
    }
    shard.heap_bytes -= entry.second.HeapBytes();
    return true;
  });
}

void GlobalIndex::CheckInvariants() const {
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::shared_lock lock(shard.mu);
    uint64_t entries = 0;
    std::vector<uint64_t> counts(config::kMaxWorkers * kv::kNumTiers, 0);
    for (const auto& [hash, list] : shard.map) {
      KVF_CHECK(!list.empty());                                      // 4
      if (const DenseBits* d = list.dense()) {                       // 5
        DenseBits want{};
        for (const Holder& h : list) {
          if (h.flags & kDeviceBit) want.device[h.worker / 64] |= 1ull << (h.worker % 64);
          if (h.flags & kTierBits) want.any[h.worker / 64] |= 1ull << (h.worker % 64);
          if (h.flags & kPredictedBit) ++want.predicted;
        }
        KVF_CHECK(std::memcmp(want.device, d->device, sizeof(want.device)) == 0);
        KVF_CHECK(std::memcmp(want.any, d->any, sizeof(want.any)) == 0);
        KVF_CHECK(want.predicted == d->predicted);
      }
      KVF_CHECK(ShardIndex(hash) == i);
      for (const Holder& h : list) {
        KVF_CHECK(h.flags != 0);                                     // 1
        KVF_CHECK(shard.workers[h.worker].blocks.contains(hash));    // 2
        if (h.flags & kDeviceBit) ++counts[h.worker * kv::kNumTiers];
        if (h.flags & kHostBit) ++counts[h.worker * kv::kNumTiers + 1];
        ++entries;
      }
    }
    KVF_CHECK(entries == shard.entries.load());
    uint64_t reverse = 0;
    for (WorkerId w = 0; w < config::kMaxWorkers; ++w) {
      reverse += shard.workers[w].blocks.size();
      for (int t = 0; t < kv::kNumTiers; ++t)                        // 3
        KVF_CHECK(shard.workers[w].tier_count[t].load() == counts[w * kv::kNumTiers + t]);
    }
    KVF_CHECK(reverse == entries);                                   // 2, the other way
  }
}

}  // namespace kvfleet::router
