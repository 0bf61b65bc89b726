#include "common/clock.h"

#include <doctest/doctest.h>

using namespace kvfleet;

TEST_CASE("the manual clock moves only when told") {
  ManualClock c(5 * kNsPerSec);
  CHECK(c.Now() == 5 * kNsPerSec);
  c.AdvanceMs(250);
  CHECK(c.Now() == 5 * kNsPerSec + 250 * kNsPerMs);
  c.Set(10 * kNsPerSec);
  CHECK(c.Now() == 10 * kNsPerSec);
}

TEST_CASE("the system clock is monotonic and its wall time is Unix time") {
  SystemClock* c = SystemClock::Default();
  TimeNs a = c->Now();
  TimeNs b = c->Now();
  CHECK(b >= a);
  // After 2020-01-01 and before 2100-01-01.
  CHECK(c->WallNs() > 1577836800LL * kNsPerSec);
  CHECK(c->WallNs() < 4102444800LL * kNsPerSec);
}
