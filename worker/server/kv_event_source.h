// KvEventSource: the EventPublisher's view of a KvCacheManager (events::EventSource).
//
// The engine builds one beside its manager and passes it to the publisher's two calls:
//   publisher.Flush(source, load); publisher.ServiceSnapshots(source);
//
// Thread safety: thread-compatible; engine thread only, like the manager.
#pragma once

#include "worker/kv/kv_cache_manager.h"
#include "worker/server/event_publisher.h"

namespace kvfleet::events {

class KvEventSource final : public EventSource {
 public:
  // REQUIRES: manager outlives the source.
  explicit KvEventSource(kv::KvCacheManager* manager) : manager_(manager) {}
  void FlushEvents() override { manager_->FlushEvents(); }
  uint64_t DroppedEvents() const override { return manager_->Stats().events_dropped; }
  std::vector<kv::KvEvent> Snapshot() const override { return manager_->Snapshot(); }

 private:
  kv::KvCacheManager* manager_;
};

}  // namespace kvfleet::events
