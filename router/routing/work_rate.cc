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

FollowUps::FollowUps(DurationNs window) : starts_(window), continuations_(window) {}

void FollowUps::Count(TimeNs now, bool continues) {
  // Both rates start their clocks at the first request, so their sums cover the same time.
  starts_.Add(now, continues ? 0.0 : 1.0);
  continuations_.Add(now, continues ? 1.0 : 0.0);
}

double FollowUps::PerStart(TimeNs now) const {
  const double starts = starts_.PerSecond(now);
  return starts > 0 ? continuations_.PerSecond(now) / starts : 0;
}

}  // namespace kvfleet::router
