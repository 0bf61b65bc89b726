// EventBuffer: a bounded queue of KV events between the KV cache manager and its EventSink.
//
// The manager pushes events as the cache changes; the engine flushes them to the sink once
// per step (KvCacheManager::FlushEvents). When the buffer holds max_size events, pushing
// drops the oldest and counts it: a consumer that sees a gap recovers by snapshot
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
#include <deque>

#include "schema/kv_event.h"

namespace kvfleet::kv {

class EventBuffer {
 public:
  explicit EventBuffer(size_t max_size) : max_size_(max_size) {}

  bool enabled() const { return max_size_ > 0; }
  size_t size() const { return events_.size(); }
  size_t max_size() const { return max_size_; }
  // Events dropped because the buffer was full, since construction.
  uint64_t dropped() const { return dropped_; }

  void Push(KvEvent event);
  // Sends every buffered event to `sink`, oldest first, and empties the buffer.
  // Returns how many were sent. REQUIRES: sink != nullptr.
  size_t Flush(EventSink* sink);
  // Removes every buffered event without sending it (counted as dropped).
  void Discard();

 private:
  size_t max_size_;
  uint64_t dropped_ = 0;
  std::deque<KvEvent> events_;
};

}  // namespace kvfleet::kv
