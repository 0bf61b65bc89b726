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

int ShardIndex(BlockHash h) {
  // Hashes are XXH3 outputs; a multiply spreads test-sized small integers too.
  return static_cast<int>((h * 0x9E3779B97F4A7C15ull) >> (64 - config::kShardBits));
}

}  // namespace

// The holders of one block: up to kInline in place, more in a heap array.
class GlobalIndex::HolderList {
 public:
  static constexpr uint16_t kInline = 2;
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

  Holder* Find(WorkerId w) {
    for (Holder& h : *this)
      if (h.worker == w) return &h;
    return nullptr;
  }
  Holder& Add(WorkerId w) {
    if (size_ == std::max<uint16_t>(capacity_, kInline)) Grow();
    Holder& h = data()[size_++];
    h = Holder{static_cast<uint16_t>(w), 0, 0, 0};
    return h;
  }
  void Erase(Holder* h) {
    *h = data()[size_ - 1];
    --size_;
  }
  uint64_t HeapBytes() const { return capacity_ > kInline ? capacity_ * sizeof(Holder) : 0; }

  uint32_t lru_ms = 0;  // last store, prediction or match; guarded by relaxed atomic_ref on reads

 private:
  void Grow() {
    uint16_t cap = std::max<uint16_t>(capacity_, kInline);
    uint16_t next = static_cast<uint16_t>(cap * 2);
    Holder* fresh = new Holder[next];
    std::memcpy(fresh, data(), size_ * sizeof(Holder));
    Release();
    heap_ = fresh;
    capacity_ = next;
  }
  void Release() {
    if (capacity_ > kInline) delete[] heap_;
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
  uint64_t entries = 0;              // (block, worker) entries in this shard
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
// Per-thread scratch for FindMatches: worker -> (call generation, index in *out, phase).
struct MatchScratch {
  uint32_t gen[config::kMaxWorkers] = {};
  uint16_t slot[config::kMaxWorkers] = {};
  uint32_t last_block[config::kMaxWorkers] = {};
  bool in_host[config::kMaxWorkers] = {};
  uint32_t generation = 0;
};
thread_local MatchScratch t_scratch;
}  // namespace

void GlobalIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<WorkerMatch>* out) const {
  out->clear();
  if (hashes.empty()) return;
  MatchScratch& s = t_scratch;
  if (++s.generation == 0) {  // wrapped: forget every stale stamp
    std::fill(std::begin(s.gen), std::end(s.gen), 0);
    s.generation = 1;
  }
  const uint32_t gen = s.generation;
  const uint32_t now_ms = NowMs();
  uint64_t locked = 0;  // bit i: shard i is held shared by this call
  static_assert(config::kShards <= 64);

  for (uint32_t i = 0; i < hashes.size(); ++i) {
    const int si = ShardIndex(hashes[i]);
    const Shard& shard = shards_[si];
    if (!(locked & (1ull << si))) {
      shard.mu.lock_shared();
      locked |= 1ull << si;
    }
    auto it = shard.map.find(hashes[i]);
    if (it == shard.map.end()) break;
    const HolderList& list = it->second;
    uint32_t extended = 0;
    for (const Holder& h : list) {
      const bool predicted_live = (h.flags & kPredictedBit) && h.expiry_ms > now_ms;
      const uint8_t tiers = h.flags & kTierBits;
      if (!tiers && !predicted_live) continue;
      const WorkerId w = h.worker;
      if (i == 0) {
        s.gen[w] = gen;
        s.slot[w] = static_cast<uint16_t>(out->size());
        s.last_block[w] = 0;
        s.in_host[w] = false;
        if ((tiers & kDeviceBit) || predicted_live) {
          out->push_back(WorkerMatch{w, 1, 0});
        } else {
          s.in_host[w] = true;
          out->push_back(WorkerMatch{w, 0, 1});
        }
        ++extended;
        continue;
      }
      if (s.gen[w] != gen || s.last_block[w] != i - 1) continue;  // not matching any more
      WorkerMatch& m = (*out)[s.slot[w]];
      s.last_block[w] = i;
      ++extended;
      if (!s.in_host[w] && ((tiers & kDeviceBit) || predicted_live)) {
        ++m.device_blocks;
      } else {
        s.in_host[w] = true;
        ++m.host_blocks;
      }
    }
    if (extended > 0) {
      // Relaxed: the stamp only orders trimming; a lost update costs nothing.
      std::atomic_ref<uint32_t> lru(const_cast<HolderList&>(list).lru_ms);
      if (lru.load(std::memory_order_relaxed) != now_ms) lru.store(now_ms, std::memory_order_relaxed);
    }
    if (extended == 0) break;
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

uint64_t GlobalIndex::EntryCount() const { return entries_.load(std::memory_order_relaxed); }

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
  Shard& shard = ShardOf(hash);
  const uint8_t bit = TierBit(tier);
  const uint32_t now_ms = NowMs();
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
      ++shard.entries;
      entries_.fetch_add(1, std::memory_order_relaxed);
    }
    h->flags &= static_cast<uint8_t>(~kPredictedBit);  // confirmed
    h->expiry_ms = 0;
    if (!(h->flags & bit)) {
      h->flags |= bit;
      shard.workers[worker].tier_count[static_cast<int>(tier)].fetch_add(1, std::memory_order_relaxed);
    }
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
  h->flags &= static_cast<uint8_t>(~bit);
  shard.workers[worker].tier_count[static_cast<int>(tier)].fetch_sub(1, std::memory_order_relaxed);
  if (h->flags == 0) {
    list.Erase(h);
    shard.workers[worker].blocks.erase(hash);
    --shard.entries;
    entries_.fetch_sub(1, std::memory_order_relaxed);
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
  if (h->flags & kDeviceBit) counts[0].fetch_sub(1, std::memory_order_relaxed);
  if (h->flags & kHostBit) counts[1].fetch_sub(1, std::memory_order_relaxed);
  h->flags = static_cast<uint8_t>((h->flags & ~kTierBits) | TierBit(tier));
  counts[static_cast<int>(tier)].fetch_add(1, std::memory_order_relaxed);
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
        ++shard.entries;
        entries_.fetch_add(1, std::memory_order_relaxed);
      } else if (h->flags & kTierBits) {
        continue;  // already held for real
      }
      h->flags |= kPredictedBit;
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
    shard.entries -= pw.blocks.size();
    entries_.fetch_sub(pw.blocks.size(), std::memory_order_relaxed);
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
      h->flags &= static_cast<uint8_t>(~kPredictedBit);
      h->expiry_ms = 0;
      ++dropped;
      if (h->flags == 0) {
        it->second.Erase(h);
        shard.workers[p.worker].blocks.erase(p.hash);
        --shard.entries;
        entries_.fetch_sub(1, std::memory_order_relaxed);
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
  if (shard.entries <= cap) return;
  // Find the stamp below which the oldest blocks hold (entries - target) entries.
  const uint64_t target = static_cast<uint64_t>(cap * config::kTrimTargetFraction);
  std::vector<std::pair<uint32_t, uint16_t>> stamps;  // (lru_ms, holders)
  stamps.reserve(shard.map.size());
  for (const auto& [hash, list] : shard.map) stamps.emplace_back(list.lru_ms, list.size());
  std::sort(stamps.begin(), stamps.end());
  uint64_t to_drop = shard.entries - target, dropped = 0;
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
      if (h.flags & kDeviceBit) pw.tier_count[0].fetch_sub(1, std::memory_order_relaxed);
      if (h.flags & kHostBit) pw.tier_count[1].fetch_sub(1, std::memory_order_relaxed);
      --shard.entries;
      entries_.fetch_sub(1, std::memory_order_relaxed);
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
      KVF_CHECK(ShardIndex(hash) == i);
      for (const Holder& h : list) {
        KVF_CHECK(h.flags != 0);                                     // 1
        KVF_CHECK(shard.workers[h.worker].blocks.contains(hash));    // 2
        if (h.flags & kDeviceBit) ++counts[h.worker * kv::kNumTiers];
        if (h.flags & kHostBit) ++counts[h.worker * kv::kNumTiers + 1];
        ++entries;
      }
    }
    KVF_CHECK(entries == shard.entries);
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
