#include "router/routing/work_rate.h"

#include <cmath>

#include "common/check.h"

namespace kvfleet::router {

DecayedRate::DecayedRate(DurationNs window) : window_s_(static_cast<double>(window) / kNsPerSec) {
  KVF_CHECK(window > 0);
}

double DecayedRate::Decayed(TimeNs now) const {
  if (last_ == 0 || now <= last_) return sum_;
  return sum_ * std::exp(-(static_cast<double>(now - last_) / kNsPerSec) / window_s_);
}

void DecayedRate::Add(TimeNs now, double amount) {
  sum_ = Decayed(now) + amount;
  if (now > last_) last_ = now;
}

double DecayedRate::PerSecond(TimeNs now) const { return Decayed(now) / window_s_; }

}  // namespace kvfleet::router
