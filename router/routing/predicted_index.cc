#include "router/routing/predicted_index.h"

#include <algorithm>

#include "common/check.h"

namespace kvfleet::router {

PredictedIndex::PredictedIndex(const Clock* clock, size_t max_entries) : clock_(clock), max_entries_(max_entries) {}

void PredictedIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const {
  TimeNs now = clock_->Now();
  out->clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = map_.find(hashes[i]);
    if (it == map_.end()) break;
    bool any = false;
    for (const Entry& e : it->second) {
      if (e.expires < now) continue;
      if (i == 0) {
        out->push_back({e.worker, 1, 0});
        any = true;
        continue;
      }
      // Only workers that held every earlier block extend their match.
      for (PrefixMatch& m : *out) {
        if (m.worker == e.worker && m.device_blocks == i) {
          m.device_blocks = static_cast<uint32_t>(i + 1);
          any = true;
        }
      }
    }
    if (!any) break;  // no worker still matches
  }
  for (PrefixMatch& m : *out) m.held_blocks = m.device_blocks;  // predictions are all it knows
}

void PredictedIndex::InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) {
  TimeNs now = clock_->Now();
  TimeNs expires = now + ttl;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  if (entries_ + hashes.size() > max_entries_) return;
  WorkerCache& cache = workers_[worker];
  // Last block first, so that block 0 ends most recent (the header says why).
  for (auto h = hashes.rbegin(); h != hashes.rend(); ++h) {
    Holders& holders = map_[*h];
    auto it = std::find_if(holders.begin(), holders.end(), [&](const Entry& e) { return e.worker == worker; });
    if (it != holders.end()) {
      cache.lru.splice(cache.lru.begin(), cache.lru, it->lru);
      if (it->expires >= expires) continue;
      it->expires = expires;
    } else {
      cache.lru.push_front(*h);
      holders.push_back({worker, expires, cache.lru.begin()});
      ++entries_;
    }
    expiry_.push_back({expires, *h, worker});
  }
  if (cache.capacity == 0) return;
  // The worker's LRU: beyond its capacity the least recent blocks are gone. Their expiry
  // records become stale (invariant 3).
  while (cache.lru.size() > cache.capacity) EraseLocked(cache.lru.back(), worker);
}

void PredictedIndex::SetCapacity(WorkerId worker, uint64_t blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  workers_[worker].capacity = blocks;
}

void PredictedIndex::RemoveWorker(WorkerId worker) {
  std::lock_guard<std::mutex> lock(mu_);
  // Its records stay in expiry_ and are skipped when popped (invariant 3).
  boost::unordered::erase_if(map_, [&](auto& kv) {
    Holders& holders = kv.second;
    auto gone = std::remove_if(holders.begin(), holders.end(), [&](const Entry& e) { return e.worker == worker; });
    entries_ -= static_cast<size_t>(holders.end() - gone);
    holders.erase(gone, holders.end());
    return holders.empty();
  });
  workers_.erase(worker);
}

size_t PredictedIndex::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

size_t PredictedIndex::entries(WorkerId worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(worker);
  return it == workers_.end() ? 0 : it->second.lru.size();
}

void PredictedIndex::EraseLocked(BlockHash hash, WorkerId worker) {
  auto it = map_.find(hash);
  KVF_CHECK(it != map_.end());
  Holders& holders = it->second;
  auto e = std::find_if(holders.begin(), holders.end(), [&](const Entry& h) { return h.worker == worker; });
  KVF_CHECK(e != holders.end());
  workers_[worker].lru.erase(e->lru);
  holders.erase(e);
  --entries_;
  if (holders.empty()) map_.erase(it);
}

void PredictedIndex::ExpireLocked(TimeNs now) {
  while (!expiry_.empty() && expiry_.front().expires < now) {
    const Expiry& x = expiry_.front();
    auto it = map_.find(x.hash);
    if (it != map_.end()) {
      const Holders& holders = it->second;
      auto e = std::find_if(holders.begin(), holders.end(), [&](const Entry& h) { return h.worker == x.worker; });
      // A refreshed pair has a later record of its own; this one is stale.
      if (e != holders.end() && e->expires == x.expires) EraseLocked(x.hash, x.worker);
    }
    expiry_.pop_front();
  }
}

void PredictedIndex::CheckInvariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t pairs = 0;
  for (const auto& [hash, holders] : map_) {
    KVF_CHECK(!holders.empty());
    for (const Entry& e : holders) {
      ++pairs;
      auto w = workers_.find(e.worker);
      KVF_CHECK(w != workers_.end());
      KVF_CHECK(*e.lru == hash);
    }
  }
  KVF_CHECK(pairs == entries_);
  size_t listed = 0;
  for (const auto& [id, cache] : workers_) {
    const WorkerId worker = id;  // clang before 16 cannot capture a structured binding (P1091)
    listed += cache.lru.size();
    for (BlockHash h : cache.lru) {
      auto it = map_.find(h);
      KVF_CHECK(it != map_.end());
      KVF_CHECK(std::count_if(it->second.begin(), it->second.end(), [&](const Entry& e) { return e.worker == worker; }) ==
                1);
    }
  }
  KVF_CHECK(listed == entries_);
}

}  // namespace kvfleet::router
