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

TEST_CASE("a fresh rate reads low until a window has passed: a new router sees its fleet as light") {
  DecayedRate rate(5 * kNsPerSec);
  TimeNs t = kNsPerSec;
  for (int i = 0; i < 100; ++i) {  // 1 s of 100,000 tokens/s
    t += 10 * kNsPerMs;
    rate.Add(t, 1000);
  }
  const double expected = 100'000 * (1 - std::exp(-1.0 / 5));  // the sum after 1 s of a 5 s window
  CHECK(rate.PerSecond(t) == doctest::Approx(expected).epsilon(0.02));
  CHECK(rate.PerSecond(t) < 100'000 * 0.25);
}

TEST_CASE("with no more arrivals the rate decays by e every window") {
  DecayedRate rate(2 * kNsPerSec);
  const TimeNs t = 10 * kNsPerSec;
  rate.Add(t, 4000);
  CHECK(rate.PerSecond(t) == doctest::Approx(2000));
  CHECK(rate.PerSecond(t + 2 * kNsPerSec) == doctest::Approx(2000 / std::exp(1.0)));
  CHECK(rate.PerSecond(t + 20 * kNsPerSec) < 1);
}

TEST_CASE("an amount counted at an earlier time than the last (clock reads crossing) counts at the last") {
  DecayedRate rate(kNsPerSec);
  const TimeNs t = 10 * kNsPerSec;
  rate.Add(t, 100);
  rate.Add(t - kNsPerMs, 100);
  CHECK(rate.PerSecond(t) == doctest::Approx(200));
  CHECK(rate.PerSecond(t - kNsPerSec) == doctest::Approx(200));  // never grows backwards
}

}  // namespace
}  // namespace kvfleet::router
