#include "worker/kv/event_list.h"

#include <utility>

namespace kvfleet::kv {

void EventList::Push(KvEvent event) {
  if (max_size_ == 0) return;
  if (size() == max_size_) {
    events_[head_++] = KvEvent{};  // frees the dropped event's memory now
    ++dropped_;
    // One erase per max_size drops: the vector stays within 2 x max_size slots.
    if (head_ == max_size_) {
      events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  events_.push_back(std::move(event));
}

std::vector<KvEvent> EventList::Take() {
  if (head_ > 0) {
    events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  return std::exchange(events_, {});
}

}  // namespace kvfleet::kv
