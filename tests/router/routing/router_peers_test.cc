// Routing with the fleet's other routers' gossip (router/routing/router.h AddLoad;
// README.md, "Several routers"): their in-flight counts add to this router's own, a load
// report's requests are not counted twice, and their routed work adds to the fleet load.
#include <doctest/doctest.h>

#include "tests/router/routing/router_fixture.h"

namespace kvfleet::router {

using testing::Fixture;

TEST_CASE("without a load report, a worker's load is this router's requests and the peers' together") {
  Fixture f;
  f.fleet.routable = {0};
  f.loads.own[0] = OwnLoadCounts{2, 300, 500, 1};
  f.loads.peers[0] = OwnLoadCounts{3, 700, 900, 2};
  for (Policy policy : {Policy::kKv, Policy::kApprox}) {
    auto d = f.router.Route(f.fleet, f.PromptOf(policy));
    REQUIRE(d.ok());
    const Candidate& c = d->candidates->at(0);
    CHECK(c.running_requests == doctest::Approx(5));
    CHECK(c.queued_prefill_tokens == doctest::Approx(1000));
    CHECK(c.queued_requests == doctest::Approx(5));
    CHECK(c.waiting_requests == doctest::Approx(3));
  }
}

TEST_CASE("a report's requests the peers' gossip already counted are counted once") {
  Fixture f;
  f.fleet.routable = {0};
  WorkerLoad report;
  report.active_requests = 6;
  report.queued_requests = 4;
  report.active_prefill_tokens = 9000;
  report.prefill_tokens_per_second = 20000;
  report.received_at = 777;
  f.loads.reported[0] = report;
  // When the report came: this router had 4 requests there (4,000 prompt tokens, 1 waiting),
  // the peers 5 (3,000, 2 waiting); the 1 request beyond is from a router that does not gossip.
  f.loads.own_then[0] = OwnLoadCounts{4, 1000, 4000, 1};
  f.loads.peers_then[0] = OwnLoadCounts{5, 1500, 3000, 2};
  // Now: this router has 2 (300 uncached), the peers 7 (800 uncached).
  f.loads.own[0] = OwnLoadCounts{2, 300, 2500, 2};
  f.loads.peers[0] = OwnLoadCounts{7, 800, 1200, 3};
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  const Candidate& c = d->candidates->at(0);
  CHECK(c.running_requests == doctest::Approx(2 + 7 + (10 - 4 - 5)));
  CHECK(c.queued_prefill_tokens == doctest::Approx(300 + 800 + (9000 - 4000 - 3000)));
  CHECK(c.queued_requests == doctest::Approx(4));                  // max(reported queued, known - active)
  CHECK(c.waiting_requests == doctest::Approx(2 + 3 + (4 - 1 - 2)));
  // The bound on waiting requests is this router's own: the peers' do not count there.
  RoutingOptions o;
  o.max_waiting_requests = 3;
  Fixture g(o);
  g.fleet.routable = {0};
  g.loads = f.loads;
  CHECK(g.router.Route(g.fleet, g.PromptOf(Policy::kKv)).ok());  // 2 own waiting < 3, the peers' 3 aside
}

TEST_CASE("with the channel lost (no peers), routing is this router's own counts against the report") {
  Fixture f;
  f.fleet.routable = {0};
  WorkerLoad report;
  report.active_requests = 6;
  report.queued_requests = 4;
  report.received_at = 777;
  f.loads.reported[0] = report;
  f.loads.own_then[0] = OwnLoadCounts{4, 0, 0, 1};
  f.loads.own[0] = OwnLoadCounts{2, 0, 0, 2};
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->candidates->at(0).running_requests == doctest::Approx(2 + (10 - 4)));  // today's rule
}

TEST_CASE("the peers' routed work adds to the fleet load this router reads") {
  RoutingOptions o;
  o.fleet_load_window = kNsPerSec;
  Fixture f(o);
  for (WorkerId w : {0u, 1u, 2u}) {
    WorkerLoad report;
    report.prefill_tokens_per_second = 1000;  // the fleet prefills 3,000 tokens/s
    f.loads.reported[w] = report;
  }
  f.loads.peer_work = 1500;  // the other routers send it 1,500 uncached tokens/s
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->route.fleet_load == doctest::Approx(0.5));  // this router has sent nothing yet
  CHECK(f.router.RoutedWork(f.clock.Now()).at("m") == 0);  // the first prompt only starts the clock
}

}  // namespace kvfleet::router
