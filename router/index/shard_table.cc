#include "router/index/shard_table.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include <boost/unordered/unordered_flat_set.hpp>

#include "common/check.h"

namespace kvfleet::router {

GlobalIndex::Table::~Table() { std::free(slots); }

GlobalIndex::Table* GlobalIndex::Shard::Grow() {
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
      St(fresh->row_refs[j], Ld(old->row_refs[i]));
      break;
    }
  }
  // seq_cst: pairs with ReclaimRetired's check of the reader count.
  table.store(fresh, std::memory_order_seq_cst);
  return old;
}

void GlobalIndex::Shard::Erase(uint64_t i) {
  Table* t = T();
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & t->mask;; j = (j + 1) & t->mask) {
    Slot& s = t->slots[j];
    if (Ld(s.lru_ms) == 0) break;
    const uint64_t home = Mix(Ld(s.hash)) & t->mask;
    if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
      Slot& d = t->slots[hole];
      Open(hole);
      St(d.hash, Ld(s.hash));
      St(d.device, Ld(s.device));
      St(d.host, Ld(s.host));
      St(d.predicted, Ld(s.predicted));
      St(d.overflow, Ld(s.overflow));
      St(d.lru_ms, Ld(s.lru_ms));
      St(t->row_refs[hole], Ld(t->row_refs[j]));
      hole = j;
    }
  }
  Slot& d = t->slots[hole];
  Open(hole);
  St(d.lru_ms, uint32_t{0});
  St(d.hash, uint64_t{0});
  St(d.device, uint64_t{0});
  St(d.host, uint64_t{0});
  St(d.predicted, uint16_t{0});
  St(d.overflow, uint16_t{0});
  St(t->row_refs[hole], uint32_t{0});
  --used;
}

void GlobalIndex::Shard::SetRowMasks(Slot& s, uint32_t g, Masks m) {
  const uint16_t groups = Ld(s.overflow);
  std::atomic<uint32_t>& ref = T()->row_refs[IndexOf(s)];
  const uint32_t old = Ld(ref);
  const int n = std::popcount(groups);
  const bool has = groups >> g & 1, keep = (m.device | m.host) != 0;
  if (has && keep) {
    std::atomic<uint64_t>* row = overflow.MutableWords(old, 2 * static_cast<uint32_t>(n));
    const int r = GroupRank(groups, g);
    St(row[2 * r], m.device);
    St(row[2 * r + 1], m.host);
    return;
  }
  if (!has && !keep) return;
  const uint16_t next = static_cast<uint16_t>(keep ? groups | (1u << g) : groups & ~(1u << g));
  const int fresh_n = std::popcount(next);
  uint32_t fresh = 0;
  if (fresh_n != 0) {
    fresh = overflow.Allocate(fresh_n);
    std::atomic<uint64_t>* to = overflow.MutableWords(fresh, 2 * static_cast<uint32_t>(fresh_n));
    const std::atomic<uint64_t>* from = n != 0 ? overflow.Words(old, 2 * static_cast<uint32_t>(n)) : nullptr;
    int r = 0;
    for (uint32_t bits = next; bits; bits &= bits - 1, ++r) {
      const uint32_t h = static_cast<uint32_t>(std::countr_zero(bits));
      const int k = GroupRank(groups, h);
      const Masks masks = h == g ? m : Masks{Ld(from[2 * k]), Ld(from[2 * k + 1])};
      St(to[2 * r], masks.device);
      St(to[2 * r + 1], masks.host);
    }
  }
  St(ref, fresh);
  St(s.overflow, next);
  if (n != 0) overflow.Free(old, n);
}

void GlobalIndex::Shard::DropRow(Slot& s) {
  const uint16_t groups = Ld(s.overflow);
  if (groups == 0) return;
  std::atomic<uint32_t>& ref = T()->row_refs[IndexOf(s)];
  overflow.Free(Ld(ref), std::popcount(groups));
  St(ref, uint32_t{0});
  St(s.overflow, uint16_t{0});
}

bool GlobalIndex::Shard::HasState(BlockHash h, WorkerId w) const {
  const uint64_t i = Find(h, Mix(h));
  if (i == kNpos) return false;
  const Slot& s = T()->slots[i];
  if (Bits(s, h, w) != 0) return true;
  if (Ld(s.predicted) == 0) return false;
  auto it = predicted.find(h);
  return it != predicted.end() &&
         std::any_of(it->second.begin(), it->second.end(), [&](const PredHolder& p) { return p.worker == w; });
}

void GlobalIndex::Shard::Compact(WorkerId w) {
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

void GlobalIndex::Shard::DropSlot(uint64_t i) {
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
  ForEachGroup(s, [&](uint32_t g, const Masks& m) { drop_word(m.device, m.host, g * 64); });
  DropRow(s);
  if (Ld(s.predicted) != 0) {
    std::lock_guard side(side_mu);
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

uint32_t GlobalIndex::Shard::Holders(const Slot& s) const {
  uint32_t n = static_cast<uint32_t>(std::popcount(Ld(s.device) | Ld(s.host))) + Ld(s.predicted);
  ForEachGroup(s, [&](uint32_t, const Masks& m) { n += static_cast<uint32_t>(std::popcount(m.device | m.host)); });
  return n;
}

GlobalIndex::Table::Table(uint64_t capacity)
    : mask(capacity - 1),
      bytes(capacity * (sizeof(Slot) + sizeof(std::atomic<uint32_t>)) + (Group(mask) + 1) * sizeof(std::atomic<uint64_t>)),
      row_refs(new std::atomic<uint32_t>[capacity]()),
      versions(new std::atomic<uint64_t>[Group(mask) + 1]()) {
  const size_t slot_bytes = capacity * sizeof(Slot);
  const bool huge = slot_bytes >= kHugePage;
  void* p = std::aligned_alloc(huge ? kHugePage : 64, slot_bytes);
  KVF_CHECK(p != nullptr) << "index table of " << slot_bytes << " bytes";
#if defined(MADV_HUGEPAGE)
  if (huge) (void)madvise(p, slot_bytes, MADV_HUGEPAGE);
#endif
  slots = static_cast<Slot*>(p);
  for (uint64_t i = 0; i < capacity; ++i) new (&slots[i]) Slot();  // all zero: unused
}

uint64_t GlobalIndex::Shard::SweepExpired(uint32_t now_ms) {
  std::lock_guard lock(mu);
  if (predicted.empty()) return 0;
  // The blocks with an expired holder, found without side_mu (only writers change the
  // table, and they hold mu); then one op per block, as in ApplyToShard.
  std::vector<BlockHash> expired;
  for (const auto& [h, list] : predicted)
    if (std::any_of(list.begin(), list.end(), [&](const PredHolder& p) { return p.expiry_ms <= now_ms; }))
      expired.push_back(h);
  uint64_t dropped = 0;
  for (BlockHash h : expired) {
    const uint64_t i = Find(h, Mix(h));
    KVF_CHECK(i != kNpos);
    Slot& s = T()->slots[i];
    Open(i);
    {
      std::lock_guard side(side_mu);
      auto it = predicted.find(h);
      auto& list = it->second;
      size_t keep = 0;
      for (const PredHolder& p : list) {
        if (p.expiry_ms > now_ms) {
          list[keep++] = p;
          continue;
        }
        --workers[p.worker].live;
        ++dropped;
      }
      list.resize(keep);
      St(s.predicted, static_cast<uint16_t>(keep));
      if (keep == 0) predicted.erase(it);
    }
    if (Empty(s)) Erase(i);
    Close();
  }
  Bump(entries, -static_cast<int64_t>(dropped));
  return dropped;
}

void GlobalIndex::Shard::TrimTo(uint64_t cap) {
  if (this->entries.load(std::memory_order_relaxed) <= cap) return;
  std::lock_guard lock(mu);
  const uint64_t held = this->entries.load(std::memory_order_relaxed);
  if (held <= cap) return;
  // Find the stamp below which the oldest blocks hold (held - target) entries.
  const uint64_t target = static_cast<uint64_t>(static_cast<double>(cap) * config::kTrimTargetFraction);
  const Table* t = T();
  std::vector<std::pair<uint32_t, uint32_t>> stamps;  // (lru_ms, holders)
  stamps.reserve(used);
  for (uint64_t i = 0; i <= t->mask; ++i)
    if (const uint32_t lru = Ld(t->slots[i].lru_ms)) stamps.emplace_back(lru, Holders(t->slots[i]));
  std::sort(stamps.begin(), stamps.end());
  const uint64_t to_drop = held - target;
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
  for (BlockHash h : doomed) {  // one op per block, as in ApplyToShard
    const uint64_t i = Find(h, Mix(h));
    if (i == kNpos) continue;
    Open(i);
    DropSlot(i);
    Close();
  }
  for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
    if (!workers[w].blocks.empty()) MaybeCompact(w);
}

void GlobalIndex::Shard::CheckInvariants(int index) const {
  std::lock_guard lock(mu);
  KVF_CHECK(Closed());
  const Table* t = T();
  for (uint64_t g = 0; g <= Table::Group(t->mask); ++g) KVF_CHECK((t->versions[g].load() & 1) == 0);
  uint64_t slots_used = 0, pairs = 0;
  std::vector<uint64_t> counts(config::kMaxWorkers * kv::kNumTiers, 0), live(config::kMaxWorkers, 0);
  std::vector<boost::unordered_flat_set<BlockHash>> reverse(config::kMaxWorkers);
  for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
    reverse[w].insert(workers[w].blocks.begin(), workers[w].blocks.end());
  auto held = [&](WorkerId w, uint8_t bits, BlockHash h) {
    if (bits & kDev) ++counts[w * kv::kNumTiers];
    if (bits & kHostBit) ++counts[w * kv::kNumTiers + 1];
    ++live[w];
    ++pairs;
    KVF_CHECK(reverse[w].contains(h));                                        // 3
  };
  uint64_t row_words = 0, predicted_rows = 0;
  for (uint64_t i = 0; i <= t->mask; ++i) {
    const Slot& s = t->slots[i];
    if (Ld(s.lru_ms) == 0) {
      KVF_CHECK(Ld(t->row_refs[i]) == 0);
      continue;
    }
    ++slots_used;
    const BlockHash h = Ld(s.hash);
    KVF_CHECK(ShardOfMix(Mix(h)) == index);
    KVF_CHECK(Find(h, Mix(h)) == i);                                          // 5
    KVF_CHECK(!Empty(s));                                                     // 1
    for (uint64_t m = Ld(s.device) | Ld(s.host); m; m &= m - 1)
      held(static_cast<WorkerId>(std::countr_zero(m)), Bits(s, h, static_cast<WorkerId>(std::countr_zero(m))), h);
    KVF_CHECK((Ld(s.overflow) != 0) == (Ld(t->row_refs[i]) != 0));            // 1
    KVF_CHECK((Ld(s.overflow) & 1) == 0);  // group 0 lives in the slot
    row_words += 2 * static_cast<uint64_t>(std::popcount(Ld(s.overflow)));
    ForEachGroup(s, [&](uint32_t g, const Masks& masks) {
      KVF_CHECK((masks.device | masks.host) != 0);                            // 1
      for (uint64_t m = masks.device | masks.host; m; m &= m - 1) {
        const WorkerId w = g * 64 + static_cast<WorkerId>(std::countr_zero(m));
        held(w, Bits(s, h, w), h);
      }
    });
    if (Ld(s.predicted) != 0) {
      auto it = predicted.find(h);
      KVF_CHECK(it != predicted.end());
      KVF_CHECK(it->second.size() == Ld(s.predicted));                        // 1
      ++predicted_rows;
      for (const PredHolder& p : it->second) {
        KVF_CHECK(Bits(s, h, p.worker) == 0);                                 // 2
        ++live[p.worker];
        ++pairs;
        KVF_CHECK(reverse[p.worker].contains(h));                             // 3
      }
    } else {
      KVF_CHECK(!predicted.contains(h));
    }
  }
  KVF_CHECK(slots_used == used);
  KVF_CHECK(row_words == overflow.LiveWords());                               // 1: no orphan rows
  KVF_CHECK(predicted_rows == predicted.size());
  KVF_CHECK(pairs == entries.load());
  for (WorkerId w = 0; w < config::kMaxWorkers; ++w) {
    KVF_CHECK(workers[w].live == live[w]);                                    // 3
    for (int tier = 0; tier < kv::kNumTiers; ++tier)                          // 4
      KVF_CHECK(workers[w].tier_count[tier].load() == counts[w * kv::kNumTiers + tier]);
  }
}

}  // namespace kvfleet::router
