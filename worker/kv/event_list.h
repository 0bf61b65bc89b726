// EventList: the KV events a KvCacheManager and its pools produced since the last
// KvCacheManager::TakeEvents(), oldest first, bounded.
//
// The manager owns it and its pools append to it as the cache changes; the worker loop
// takes the whole list once per engine step and moves it into the event publisher. When
// the list holds max_size events, appending drops the oldest and counts it: the publisher
// sees the count rise and skips a seq, and routers recover by snapshot
// (KvCacheManager::Snapshot). max_size 0 turns events off: nothing is kept or counted.
//
// Invariants:
//   1. size() <= max_size.
//   2. dropped() only grows.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "schema/kv_event.h"

namespace kvfleet::kv {

class EventList {
 public:
  explicit EventList(size_t max_size) : max_size_(max_size) {}

  bool enabled() const { return max_size_ > 0; }
  size_t size() const { return events_.size() - head_; }
  size_t max_size() const { return max_size_; }
  // Events dropped because the list was full, since construction.
  uint64_t dropped() const { return dropped_; }

  void Push(KvEvent event);
  // Every event in the list, oldest first; the list is empty after. O(1) unless events
  // were dropped since the last call.
  std::vector<KvEvent> Take();

 private:
  size_t max_size_;
  uint64_t dropped_ = 0;
  // events_[0, head_) were dropped: emptied at once, their slots reclaimed together.
  size_t head_ = 0;
  std::vector<KvEvent> events_;
};

}  // namespace kvfleet::kv
