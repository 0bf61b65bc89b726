// DecayedRate: how fast some amount arrives, here the uncached prefill tokens this router
// sends a model's fleet (router.h: the fleet's load, README.md "The kv cost model"). Each
// amount counts exp(−age / window): a sum that forgets at the rate a load changes, read as
// a rate by dividing by the window. Cheap: one exp per Add or read, no ring of samples.
//
// The sum of a steady stream observed for t holds 1 - exp(-t / window) of its full weight,
// so the rate divides by that share: a fresh router reads its fleet's load from its first
// seconds, not a fraction of it that fills over the window (README.md, "The kv cost model").
// The first amount only starts the clock.
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
  bool started_ = false;  // an amount was added
  TimeNs first_ = 0;      // the first Add
  TimeNs last_ = 0;       // when sum_ was last brought up to date
  double sum_ = 0;
};

// FollowUps: how many requests tied to a holder follow each request free to be placed, as this
// router has seen them: the requests that came with more than half of their prompt held somewhere
// in the fleet (a conversation's next turn, an agent's next call, a first turn whose shared system
// prompt is held: they go where that prefix is) over those that did not, each a DecayedRate over
// the same window. Only the free requests spread the load, so each one is priced for the tied ones
// that follow (Picker::CostWithTtft, README.md "A conversation stays where it starts"). Not a
// conversation's later turns per first turn: the README says why that count spread load worse.
//
// Thread safety: thread-compatible, as DecayedRate.
class FollowUps {
 public:
  // REQUIRES: window > 0.
  explicit FollowUps(DurationNs window);

  void Count(TimeNs now, bool continues);
  // Continuations per start at `now`; 0 before a start has been counted.
  double PerStart(TimeNs now) const;

 private:
  DecayedRate starts_;
  DecayedRate continuations_;
};

}  // namespace kvfleet::router
