#include "router/routing/predicted_index.h"

#include <algorithm>

namespace kvfleet::router {

PredictedIndex::PredictedIndex(const Clock* clock, size_t max_entries) : clock_(clock), max_entries_(max_entries) {}

void PredictedIndex::FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const {
  TimeNs now = clock_->Now();
  size_t first = out->size();
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
  TimeNs expires = clock_->Now() + ttl;
  std::lock_guard<std::mutex> lock(mu_);
  // Sweep once the index has doubled since the last sweep (amortized O(1) per entry), or
  // when it is full. Without the doubling rule expired predictions of prompts never seen
  // again stayed until max_entries: a router grew by ~200 bytes a request for hours.
  if (entries_ >= sweep_at_ || entries_ + hashes.size() > max_entries_) {
    SweepLocked(clock_->Now());
    sweep_at_ = std::max(kSweepMinEntries, 2 * entries_);
  }
  if (entries_ + hashes.size() > max_entries_) return;
  for (BlockHash h : hashes) {
    auto& entries = map_[h];
    auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.worker == worker; });
    if (it != entries.end()) {
      it->expires = std::max(it->expires, expires);
    } else {
      entries.push_back({worker, expires});
      ++entries_;
    }
  }
}

void PredictedIndex::RemoveWorker(WorkerId worker) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = map_.begin(); it != map_.end();) {
    entries_ -= std::erase_if(it->second, [&](const Entry& e) { return e.worker == worker; });
    it = it->second.empty() ? map_.erase(it) : std::next(it);
  }
}

size_t PredictedIndex::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void PredictedIndex::SweepLocked(TimeNs now) {
  for (auto it = map_.begin(); it != map_.end();) {
    entries_ -= std::erase_if(it->second, [&](const Entry& e) { return e.expires < now; });
    it = it->second.empty() ? map_.erase(it) : std::next(it);
  }
}

}  // namespace kvfleet::router
