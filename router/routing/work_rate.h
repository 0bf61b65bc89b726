// DecayedRate: how fast some amount arrives, here the uncached prefill tokens this router
// sends a model's fleet (router.h: the fleet's load, README.md "The kv cost model"). Each
// amount counts exp(−age / window): a sum that forgets at the rate a load changes, read as
// a rate by dividing by the window. Cheap: one exp per Add or read, no ring of samples.
//
// Until a window has passed since the first Add the rate reads low (the sum has not filled):
// a fresh router sees its fleet as lighter than it is, which errs toward the light-load cost.
//
// Thread safety: thread-compatible; the Router guards its rates with a mutex.
#pragma once

#include "common/clock.h"

namespace kvfleet::router {

class DecayedRate {
 public:
  // REQUIRES: window > 0.
  explicit DecayedRate(DurationNs window);

  // Counts `amount` at `now`. A `now` earlier than the last one (two threads' clock reads
  // crossing) counts as the last one.
  void Add(TimeNs now, double amount);
  // Amount per second at `now`: the decayed sum over the window.
  double PerSecond(TimeNs now) const;

 private:
  double Decayed(TimeNs now) const;

  double window_s_;
  TimeNs last_ = 0;  // when sum_ was last brought up to date; 0: nothing added
  double sum_ = 0;
};

}  // namespace kvfleet::router
