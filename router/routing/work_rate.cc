#include "router/routing/work_rate.h"

#include <cmath>

#include "common/check.h"

namespace kvfleet::router {

DecayedRate::DecayedRate(DurationNs window) : window_s_(static_cast<double>(window) / kNsPerSec) {
  KVF_CHECK(window > 0);
}

double DecayedRate::Decayed(TimeNs now) const {
  if (now <= last_) return sum_;
  return sum_ * std::exp(-(static_cast<double>(now - last_) / kNsPerSec) / window_s_);
}

void DecayedRate::Add(TimeNs now, double amount) {
  if (!started_) {
    started_ = true;
    // The first amount starts the clock: it came after no observed interval, so it is not
    // counted (n amounts over the time since the first are n - 1 arrivals' worth).
    first_ = last_ = now;
    return;
  }
  sum_ = Decayed(now) + amount;
  if (now > last_) last_ = now;
}

double DecayedRate::PerSecond(TimeNs now) const {
  if (!started_ || now <= first_) return 0;
  // The weight the sum has had time to gather: a steady stream observed for t has filled
  // 1 - exp(-t / window) of its full decayed sum. Dividing by it reads the rate since the
  // first amount while t is under a few windows, and the plain decayed sum after.
  const double observed_s = static_cast<double>(now - first_) / kNsPerSec;
  const double filled = -std::expm1(-observed_s / window_s_);
  return Decayed(now) / (window_s_ * filled);
}

}  // namespace kvfleet::router
