// DecayedRate: the rate of uncached prefill a router sends its fleet (the kv cost's load ρ).
#include "router/routing/work_rate.h"

#include <cmath>

#include <doctest/doctest.h>

namespace kvfleet::router {
namespace {

TEST_CASE("a steady arrival reads as its rate once a few windows have passed") {
  DecayedRate rate(5 * kNsPerSec);
  TimeNs t = kNsPerSec;
  CHECK(rate.PerSecond(t) == 0);
  // 1,000 tokens every 10 ms: 100,000 tokens/s, for 30 s (6 windows).
  for (int i = 0; i < 3000; ++i) {
    t += 10 * kNsPerMs;
    rate.Add(t, 1000);
  }
  // The decayed sum of a steady stream is its rate times the window, less the part of the
  // last step not yet decayed: within 1%.
  CHECK(rate.PerSecond(t) == doctest::Approx(100'000).epsilon(0.01));
}

TEST_CASE("a fresh rate reads the stream's rate from its first second, not the part of the window filled so far") {
  // Issue 34: read as the decayed sum over the window, a 5 s window read a stream observed
  // for 1 s at 18% of its rate, so a router restarted or new to a model costed a loaded
  // fleet as light (the kv cost's rho) for several seconds.
  DecayedRate rate(5 * kNsPerSec);
  TimeNs t = kNsPerSec;
  rate.Add(t, 1000);  // starts the clock
  for (int i = 0; i < 100; ++i) {  // 1 s of 100,000 tokens/s
    t += 10 * kNsPerMs;
    rate.Add(t, 1000);
  }
  CHECK(rate.PerSecond(t) == doctest::Approx(100'000).epsilon(0.02));
  // After a 0.1 s pause the rate is the stream's 1 s over 1.1 s, decayed a little.
  CHECK(rate.PerSecond(t + 100 * kNsPerMs) == doctest::Approx(100'000 / 1.1).epsilon(0.02));
}

TEST_CASE("the first amount only starts the clock: one request is no rate") {
  DecayedRate rate(5 * kNsPerSec);
  const TimeNs t = 10 * kNsPerSec;
  rate.Add(t, 8000);
  CHECK(rate.PerSecond(t) == 0);
  CHECK(rate.PerSecond(t + 50 * kNsPerMs) == 0);
  // The second, 100 ms after the first: 8,000 per second, not 800 over the 5 s window.
  const TimeNs second = t + 100 * kNsPerMs;
  rate.Add(second, 800);
  CHECK(rate.PerSecond(second) == doctest::Approx(800 / (5 * -std::expm1(-0.1 / 5))));
  CHECK(rate.PerSecond(second) == doctest::Approx(8000).epsilon(0.02));
}

TEST_CASE("with no more arrivals the rate decays by e every window") {
  DecayedRate rate(2 * kNsPerSec);
  const TimeNs t = 100 * kNsPerSec;
  rate.Add(kNsPerSec, 0);  // the clock started long ago: the sum is full-weight
  rate.Add(t, 4000);
  CHECK(rate.PerSecond(t) == doctest::Approx(2000));
  CHECK(rate.PerSecond(t + 2 * kNsPerSec) == doctest::Approx(2000 / std::exp(1.0)));
  CHECK(rate.PerSecond(t + 20 * kNsPerSec) < 1);
}

TEST_CASE("an amount counted at an earlier time than the last (clock reads crossing) counts at the last") {
  DecayedRate rate(kNsPerSec);
  const TimeNs t = 100 * kNsPerSec;
  rate.Add(kNsPerSec, 0);  // the clock started long ago
  rate.Add(t, 100);
  rate.Add(t - kNsPerMs, 100);
  CHECK(rate.PerSecond(t) == doctest::Approx(200));
  CHECK(rate.PerSecond(t - kNsPerSec) == doctest::Approx(200));  // never grows backwards
}

TEST_CASE("follow-ups: continuations per start, 0 before a start") {
  FollowUps f(5 * kNsPerSec);
  TimeNs t = 100 * kNsPerSec;
  CHECK(f.PerStart(t) == 0);
  for (int i = 0; i < 20; ++i, t += 10 * kNsPerMs) f.Count(t, true);  // continuations only: no start seen
  CHECK(f.PerStart(t) == 0);
  // One start for every four continuations, steadily, for 40 s.
  for (int i = 0; i < 4000; ++i, t += 10 * kNsPerMs) f.Count(t, i % 5 != 0);
  CHECK(f.PerStart(t) == doctest::Approx(4).epsilon(0.05));
  // Then starts only (a new trace without later turns): it decays within a few windows.
  for (int i = 0; i < 2000; ++i, t += 10 * kNsPerMs) f.Count(t, false);
  CHECK(f.PerStart(t) < 0.1);
}

}  // namespace
}  // namespace kvfleet::router
