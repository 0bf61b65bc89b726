// Workers that share a device (their Hellos name one deviceId): a candidate's predicted first
// token waits for the prefill queued on the others too, since the device computes both
// (router/routing/README.md, "Workers sharing a device").
#include <doctest/doctest.h>

#include <algorithm>

#include "tests/router/routing/router_fixture.h"

namespace kvfleet::router {

using testing::Fixture;

namespace {

RoutingOptions WithAdmission(double ttft_s) {
  RoutingOptions o;
  o.admission_ttft_s = ttft_s;
  return o;
}

bool Admitted(const Decision& d, WorkerId w) {
  return std::any_of(d.candidates->begin(), d.candidates->end(), [&](const Candidate& c) { return c.worker == w; });
}

}  // namespace

TEST_CASE("a worker sharing its device with a busy one is predicted to wait for the other's prefill") {
  // Workers 0 and 2 idle, worker 1 with 8,000 uncached prompt tokens queued; every one
  // prefills 10,000 tokens/s. A 40-token prompt, admitted within 0.5 s.
  Fixture f(WithAdmission(0.5));
  for (WorkerId w : {0u, 1u, 2u}) f.loads.announced[w] = 10'000;
  f.loads.own[1] = OwnLoadCounts{1, 8'000, 8'000, 1};

  SUBCASE("on separate devices, the idle workers are admitted") {
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK(Admitted(*d, 0));
    CHECK(Admitted(*d, 2));
    CHECK_FALSE(Admitted(*d, 1));  // 0.805 s: its own queue
  }
  SUBCASE("0 on the busy one's device waits 0.8 s for its prefill, and is not admitted") {
    f.loads.mates[0] = {1};
    f.loads.mates[1] = {0};
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(Admitted(*d, 0));
    CHECK_FALSE(Admitted(*d, 1));  // its device mate is idle: its own queue alone
    REQUIRE(Admitted(*d, 2));
    CHECK(d->worker == 2);
    CHECK(d->candidates->at(0).device_prefill_s == 0);
  }
  SUBCASE("without admission the shared device's wait is in the estimate every policy gets") {
    Fixture g;
    for (WorkerId w : {0u, 1u, 2u}) g.loads.announced[w] = 10'000;
    g.loads.own[1] = OwnLoadCounts{1, 8'000, 8'000, 1};
    g.loads.mates[0] = {1};
    g.loads.mates[1] = {0};
    g.fleet.routable = {0};
    auto d = g.router.Route(g.fleet, g.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK(d->candidates->at(0).device_prefill_s == doctest::Approx(0.8));
    CHECK(d->estimated_ttft_s == doctest::Approx(0.804));
  }
}

TEST_CASE("a device mate's queue counts at its own rate, its report blended as a candidate's") {
  Fixture f;
  f.fleet.routable = {0};
  f.loads.announced[0] = 10'000;
  f.loads.mates[0] = {5};  // a worker of another model on the same GPU
  WorkerLoad report;
  report.active_requests = 2;
  report.active_prefill_tokens = 3'000;
  report.prefill_tokens_per_second = 2'000;  // a larger model: slower per token
  f.loads.reported[5] = report;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->candidates->at(0).device_prefill_s == doctest::Approx(1.5));
}

TEST_CASE("the fleet's load counts a shared device's compute once") {
  // Three workers at 10,000 tokens/s each; the other routers send 15,000 uncached tokens/s.
  Fixture f;
  for (WorkerId w : {0u, 1u, 2u}) f.loads.announced[w] = 10'000;
  f.loads.peer_work = 15'000;
  SUBCASE("three devices: 30,000 tokens/s of capacity") {
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK(d->route.fleet_load == doctest::Approx(0.5));
  }
  SUBCASE("0 and 1 on one device: two devices, 20,000 tokens/s") {
    f.loads.mates[0] = {1};
    f.loads.mates[1] = {0};
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK(d->route.fleet_load == doctest::Approx(0.75));
  }
}

}  // namespace kvfleet::router
