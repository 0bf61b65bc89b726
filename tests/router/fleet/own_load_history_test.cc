#include "router/fleet/own_load_history.h"

#include <random>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "common/clock.h"

namespace kvfleet::router {
namespace {

OwnLoadCounts Counts(double requests) { return OwnLoadCounts{requests, requests * 10, requests * 100}; }

TEST_CASE("At gives the counts after the last change at or before the time asked") {
  OwnLoadHistory<8> h;
  const OwnLoadCounts current = Counts(7);
  CHECK(h.At(100, current) == OwnLoadCounts{});  // nothing ever recorded: nothing in flight
  h.Record(10, Counts(1));
  h.Record(20, Counts(2));
  h.Record(20, Counts(3));  // two changes at one time: the later one counts
  h.Record(30, Counts(1));
  CHECK(h.At(9, current) == OwnLoadCounts{});  // before the first change: zero
  CHECK(h.At(10, current) == Counts(1));
  CHECK(h.At(19, current) == Counts(1));
  CHECK(h.At(20, current) == Counts(3));
  CHECK(h.At(29, current) == Counts(3));
  CHECK(h.At(1000, current) == Counts(1));
}

TEST_CASE("once the ring has dropped changes, a time before every kept one gives the current counts") {
  OwnLoadHistory<4> h;
  for (int i = 1; i <= 6; ++i) h.Record(i * 10, Counts(i));  // keeps 30, 40, 50, 60
  const OwnLoadCounts current = Counts(9);
  CHECK(h.At(29, current) == current);  // unknown: what dropped samples held
  CHECK(h.At(30, current) == Counts(3));
  CHECK(h.At(55, current) == Counts(5));
  CHECK(h.At(60, current) == Counts(6));
}

TEST_CASE("At answers as a scan of every change ever recorded would, within the ring, at random times") {
  OwnLoadHistory<16> h;
  std::vector<std::pair<TimeNs, OwnLoadCounts>> all;  // the model: every change, oldest first
  std::mt19937 rng(5);
  TimeNs now = 0;
  for (int step = 0; step < 2000; ++step) {
    now += static_cast<TimeNs>(rng() % 3);  // now and then two changes at one time
    all.emplace_back(now, Counts(static_cast<double>(rng() % 9)));
    h.Record(all.back().first, all.back().second);
    const OwnLoadCounts current = all.back().second;
    const TimeNs at = now - static_cast<TimeNs>(rng() % 40);
    OwnLoadCounts want;  // the last change at or before `at`; `current` when the ring dropped it
    const size_t first_kept = all.size() > 16 ? all.size() - 16 : 0;
    bool found = false;
    for (size_t i = all.size(); i-- > first_kept;) {
      if (all[i].first <= at) {
        want = all[i].second;
        found = true;
        break;
      }
    }
    if (!found && first_kept > 0) want = current;
    REQUIRE(h.At(at, current) == want);
  }
}


TEST_CASE("a counter's published counts and newest sample answer as its history does, at random times") {
  // The routing table's rows (routing_table.h) read the slot without the counter's lock: Now()
  // and At() from it must equal what the history ring gives under the lock.
  ManualClock clock;
  OwnLoadSlot slot;
  std::mt19937 rng(11);
  for (int worker = 0; worker < 3; ++worker) {  // a new counter on the slot: a reused worker id
    OwnLoadCounter<8> counter(&slot);
    CHECK(slot.Read().changes == 0);
    CHECK(counter.Now() == OwnLoadCounts{});
    CHECK(counter.At(clock.Now()) == OwnLoadCounts{});
    OwnLoadCounts sum;  // the model: every delta added up
    std::vector<TimeNs> times;
    for (int step = 0; step < 500; ++step) {
      clock.Advance(static_cast<DurationNs>(rng() % 3));
      OwnLoadDelta d;
      d.requests = static_cast<int64_t>(rng() % 5) - 2;
      d.waiting = static_cast<int64_t>(rng() % 3) - 1;
      d.prefill_tokens = static_cast<int64_t>(rng() % 200) - 100;
      d.prompt_tokens = static_cast<int64_t>(rng() % 300) - 100;
      counter.Add(&clock, d);
      sum.requests += static_cast<double>(d.requests);
      sum.waiting += static_cast<double>(d.waiting);
      sum.prefill_tokens += static_cast<double>(d.prefill_tokens);
      sum.prompt_tokens += static_cast<double>(d.prompt_tokens);
      // Prefill tokens that left the pending set (a first token, an end), cumulative.
      sum.left_prefill_tokens += static_cast<double>(std::max<int64_t>(0, -d.prefill_tokens));
      times.push_back(clock.Now());
      REQUIRE(counter.Now() == sum);
      REQUIRE(slot.Read().counts == sum);
      REQUIRE(slot.Read().changed_at == clock.Now());
      REQUIRE(counter.requests() == static_cast<int64_t>(sum.requests));
      const TimeNs at = clock.Now() - static_cast<TimeNs>(rng() % 12);
      REQUIRE(counter.At(at) == counter.FromHistory(at));
    }
  }
}

}  // namespace
}  // namespace kvfleet::router
