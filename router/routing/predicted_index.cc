#include "router/routing/predicted_index.h"

#include <algorithm>

namespace kvfleet::router {

PredictedIndex::PredictedIndex(const Clock* clock, size_t max_entries) : clock_(clock), max_entries_(max_entries) {}

void PredictedIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const {
  TimeNs now = clock_->Now();
  out->clear();
  const size_t first = 0;
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
      for (size_t m = first; m < out->size(); ++m) {
        if ((*out)[m].worker == e.worker && (*out)[m].device_blocks == i) {
          (*out)[m].device_blocks = static_cast<uint32_t>(i + 1);
          any = true;
        }
      }
    }
    if (!any) break;  // no worker still matches
  }
}

void PredictedIndex::InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) {
  TimeNs now = clock_->Now();
  TimeNs expires = now + ttl;
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now);
  if (entries_ + hashes.size() > max_entries_) return;
  for (BlockHash h : hashes) {
    Holders& holders = map_[h];
    auto it = std::find_if(holders.begin(), holders.end(), [&](const Entry& e) { return e.worker == worker; });
    if (it != holders.end()) {
      if (it->expires >= expires) continue;
      it->expires = expires;
    } else {
      holders.push_back({worker, expires});
      ++entries_;
    }
    expiry_.push_back({expires, h, worker});
  }
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
}

size_t PredictedIndex::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void PredictedIndex::ExpireLocked(TimeNs now) {
  while (!expiry_.empty() && expiry_.front().expires < now) {
    const Expiry& x = expiry_.front();
    auto it = map_.find(x.hash);
    if (it != map_.end()) {
      Holders& holders = it->second;
      auto e = std::find_if(holders.begin(), holders.end(), [&](const Entry& h) { return h.worker == x.worker; });
      // A refreshed pair has a later record of its own; this one is stale.
      if (e != holders.end() && e->expires == x.expires) {
        holders.erase(e);
        --entries_;
        if (holders.empty()) map_.erase(it);
      }
    }
    expiry_.pop_front();
  }
}

}  // namespace kvfleet::router
