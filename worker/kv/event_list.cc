#include "worker/kv/event_buffer.h"

#include <utility>

namespace kvfleet::kv {

void EventBuffer::Push(KvEvent event) {
  if (max_size_ == 0) return;
  if (events_.size() == max_size_) {
    events_.pop_front();
    ++dropped_;
  }
  events_.push_back(std::move(event));
}

size_t EventBuffer::Flush(EventSink* sink) {
  const size_t n = events_.size();
  while (!events_.empty()) {
    sink->Emit(std::move(events_.front()));
    events_.pop_front();
  }
  return n;
}

void EventBuffer::Discard() {
  dropped_ += events_.size();
  events_.clear();
}

}  // namespace kvfleet::kv
