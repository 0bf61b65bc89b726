// GlobalIndex's queries (global_index.h): the prefix match of a request, which reads the
// slots lock-free (shard_table.h, ReadSlot), and the one-worker lookups.
#include <algorithm>
#include <bit>
#include <mutex>

#include "router/index/global_index.h"
#include "router/index/shard_table.h"

namespace kvfleet::router {

namespace {

// Per-thread scratch, so FindMatches allocates nothing once warm. Bit w % 64 of word w / 64
// is worker w.
struct MatchScratch {
  uint64_t active[kWords] = {};    // still matching
  uint64_t dev_run[kWords] = {};   // still matching and in their leading device run
  uint64_t held_run[kWords] = {};  // still matching and in their leading run by events
  uint64_t blk_any[kWords] = {};   // the current block's holders, predicted ones included
  uint64_t blk_dev[kWords] = {};   // ... on the device (a predicted holder counts as one)
  uint64_t blk_held[kWords] = {};  // ... by their events (predicted ones excluded)
  uint32_t total_len[config::kMaxWorkers] = {};
  uint32_t dev_len[config::kMaxWorkers] = {};
  uint32_t held_len[config::kMaxWorkers] = {};
  // The latest expiry of a worker's predicted entries seen in this match (NowMs's clock),
  // valid where pred_stamp is this match's `stamp`.
  uint32_t pred_expiry[config::kMaxWorkers] = {};
  uint32_t pred_stamp[config::kMaxWorkers] = {};
  uint32_t stamp = 0;
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

void GlobalIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const {
  out->clear();
  if (hashes.empty()) return;
  ReaderGuard guard(readers_);
  MatchScratch& s = t_match;
  if (++s.stamp == 0) {  // wrapped: no entry may look current
    std::fill(std::begin(s.pred_stamp), std::end(s.pred_stamp), 0);
    s.stamp = 1;
  }
  const uint32_t now_ms = NowMs();
  const bool stamp_lru = options_.max_entries != 0;
  auto touch = [&](const SlotView& v) {
    // Relaxed CAS from the stamp read: it never marks a slot a writer has just freed.
    if (!stamp_lru || v.lru_ms == now_ms) return;
    uint32_t expected = v.lru_ms;
    const_cast<Slot*>(v.slot)->lru_ms.compare_exchange_strong(expected, now_ms, std::memory_order_relaxed);
  };
  // The block's holders in words lo..hi of blk_any/blk_dev/blk_held: the slot's masks and its
  // overflow row (both read lock-free by ReadSlot), plus the predicted holders (under the
  // shard's side_mu) when the slot has any.
  auto block_bits = [&](const Shard& shard, BlockHash h, const SlotView& v, int lo, int hi) {
    for (int w = lo; w <= hi; ++w) s.blk_any[w] = s.blk_dev[w] = s.blk_held[w] = 0;
    if (lo == 0) {
      s.blk_any[0] = s.blk_held[0] = v.device | v.host;
      s.blk_dev[0] = v.device;
    }
    for (uint32_t m = v.overflow & ~1u; m; m &= m - 1) {
      const int w = std::countr_zero(m);
      if (w < lo || w > hi) continue;
      s.blk_any[w] = s.blk_held[w] = v.over_device[w] | v.over_host[w];
      s.blk_dev[w] = v.over_device[w];
    }
    if (v.predicted != 0) {
      const std::unique_lock lock = LockSideTables(shard);
      if (auto it = shard.predicted.find(h); it != shard.predicted.end()) {
        for (const PredHolder& p : it->second) {
          const int w = static_cast<int>(p.worker / 64);
          if (p.expiry_ms <= now_ms || w < lo || w > hi) continue;
          s.blk_any[w] |= 1ull << (p.worker % 64);
          s.blk_dev[w] |= 1ull << (p.worker % 64);
          if (s.pred_stamp[p.worker] != s.stamp) {
            s.pred_stamp[p.worker] = s.stamp;
            s.pred_expiry[p.worker] = p.expiry_ms;
          } else {
            s.pred_expiry[p.worker] = std::max(s.pred_expiry[p.worker], p.expiry_ms);
          }
        }
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
  for (int w = 0; w < words0; ++w) s.active[w] = ~0ull;  // every word may hold block 0
  block_bits(shard0, hashes[0], v0, 0, words0 - 1);
  int lo = kWords, hi = -1;  // the words that hold active workers
  for (int w = 0; w < words0; ++w) {
    s.active[w] = s.blk_any[w];
    s.dev_run[w] = s.blk_dev[w];
    s.held_run[w] = s.blk_held[w];
    if (s.active[w] == 0) continue;
    lo = std::min(lo, w);
    hi = std::max(hi, w);
    ForEachBit(s.active[w] & ~s.dev_run[w], w, [&](WorkerId id) { s.dev_len[id] = 0; });
    ForEachBit(s.active[w] & ~s.held_run[w], w, [&](WorkerId id) { s.held_len[id] = 0; });
    ForEachBit(s.active[w], w, [&](WorkerId id) { out->push_back(PrefixMatch{id, 0, 0}); });
  }
  if (hi < 0) return;  // only expired predictions
  touch(v0);

  // The home slots of the next blocks (with their group versions and row refs) are
  // prefetched a window ahead, so the cache misses of a long request overlap instead of
  // queueing.
  constexpr size_t kAhead = 16;
  const size_t n = hashes.size();
  auto prefetch = [&](size_t j) {
    const uint64_t m = Mix(hashes[j]);
    const Table* t = shards_[ShardOfMix(m)].table.load(std::memory_order_acquire);
    __builtin_prefetch(&t->slots[m & t->mask]);
    __builtin_prefetch(&t->versions[Table::Group(m & t->mask)]);
    __builtin_prefetch(&t->row_refs[m & t->mask]);
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
      const uint64_t held = s.held_run[w];
      const uint64_t held_stay = held & s.blk_held[w];  // within stay: blk_held is within blk_any
      ForEachBit(a & ~stay, w, [&](WorkerId id) { s.total_len[id] = i; });
      ForEachBit(run & ~run_stay, w, [&](WorkerId id) { s.dev_len[id] = i; });
      ForEachBit(held & ~held_stay, w, [&](WorkerId id) { s.held_len[id] = i; });
      s.active[w] = stay;
      s.dev_run[w] = run_stay;
      s.held_run[w] = held_stay;
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
    ForEachBit(s.held_run[w], w, [&](WorkerId id) { s.held_len[id] = i; });
  }
  for (PrefixMatch& m : *out) {
    m.device_blocks = s.dev_len[m.worker];
    m.host_blocks = s.total_len[m.worker] - m.device_blocks;
    m.held_blocks = s.held_len[m.worker];
    if (m.held_blocks < m.device_blocks + m.host_blocks && s.pred_stamp[m.worker] == s.stamp) {
      m.predicted_ms_left = s.pred_expiry[m.worker] - now_ms;  // > 0: only unexpired ones count
    }
  }
}

uint32_t GlobalIndex::HeldRun(WorkerId worker, std::span<const BlockHash> hashes) const {
  uint32_t n = 0;
  while (n < hashes.size() && Holds(worker, hashes[n])) ++n;
  return n;
}

bool GlobalIndex::Holds(WorkerId worker, BlockHash hash) const {
  if (worker >= config::kMaxWorkers) return false;
  const uint64_t mix = Mix(hash);
  const Shard& shard = shards_[ShardOfMix(mix)];
  ReaderGuard guard(readers_);
  const SlotView v = ReadSlot(shard, hash, mix);
  if (worker < config::kInlineWorkers) return ((v.device | v.host) >> worker) & 1;
  const uint32_t group = worker / 64;
  if (!(v.overflow >> group & 1)) return false;
  return ((v.over_device[group] | v.over_host[group]) >> (worker % 64)) & 1;
}

}  // namespace kvfleet::router
