#include "router/events/fault_injection.h"

namespace kvfleet::router {

void FaultInjector::Process(WorkerId worker, events::DecodedBatch batch, TimeNs now, std::vector<Delivery>* out) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (u(rng_) < options_.drop_rate) {
    ++dropped_;
    return;
  }
  const bool dup = u(rng_) < options_.duplicate_rate;
  if (dup) ++duplicated_;
  if (options_.reorder_window == 0) {
    if (dup) out->emplace_back(worker, batch);
    out->emplace_back(worker, std::move(batch));
    return;
  }
  if (dup) held_.push_back(Held{{worker, batch}, now});
  held_.push_back(Held{{worker, std::move(batch)}, now});
  while (held_.size() > options_.reorder_window) {
    // Release a random held batch: the others overtake or trail it.
    const size_t i = rng_() % held_.size();
    if (i + 1 != held_.size()) ++reordered_;
    out->push_back(std::move(held_[i].delivery));
    held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  Release(now, false, out);
}

void FaultInjector::Release(TimeNs now, bool all, std::vector<Delivery>* out) {
  size_t keep = 0;
  for (size_t i = 0; i < held_.size(); ++i) {
    if (all || now - held_[i].since >= options_.max_hold) {
      out->push_back(std::move(held_[i].delivery));
    } else {
      if (keep != i) held_[keep] = std::move(held_[i]);
      ++keep;
    }
  }
  held_.resize(keep);
}

}  // namespace kvfleet::router
