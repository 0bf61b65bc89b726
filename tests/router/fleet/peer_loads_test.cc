// PeerLoads (router/fleet/peer_loads.h): the other routers' counts merged per worker, each
// message replacing its sender's, stale ones refused, silent peers forgotten.
#include "router/fleet/peer_loads.h"

#include <map>
#include <random>
#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::router {
namespace {

constexpr DurationNs kTtl = kNsPerSec;

RouterGossip From(const std::string& router, uint64_t seq, std::vector<GossipWorker> workers,
                  std::vector<GossipModel> models = {}, uint64_t incarnation = 1) {
  return RouterGossip{router, incarnation, seq, std::move(workers), std::move(models)};
}

GossipWorker On(const std::string& worker, uint32_t requests, uint32_t waiting = 0, uint64_t tokens = 0) {
  return GossipWorker{worker, requests, waiting, tokens, tokens};
}

}  // namespace

TEST_CASE("two peers' counts on one worker add up, and each new message replaces its sender's") {
  PeerLoads p(kTtl);
  CHECK(p.Load("w") == OwnLoadCounts{});
  REQUIRE(p.Apply(From("a", 1, {On("w", 2, 1, 100)}), 10) == GossipRefusal::kNone);
  REQUIRE(p.Apply(From("b", 1, {On("w", 3), On("x", 1)}), 20) == GossipRefusal::kNone);
  CHECK(p.Load("w").requests == 5);
  CHECK(p.Load("w").waiting == 1);
  CHECK(p.Load("w").prefill_tokens == 100);
  CHECK(p.Load("x").requests == 1);
  // b's next message no longer lists x: none of b's requests are there any more.
  REQUIRE(p.Apply(From("b", 2, {On("w", 1)}), 30) == GossipRefusal::kNone);
  CHECK(p.Load("w").requests == 3);
  CHECK(p.Load("x") == OwnLoadCounts{});
  p.CheckInvariants();
}

TEST_CASE("LoadAt gives the peers' sum as it stood when a load report arrived") {
  PeerLoads p(kTtl);
  p.Apply(From("a", 1, {On("w", 2)}), 100);
  p.Apply(From("a", 2, {On("w", 5)}), 200);
  CHECK(p.LoadAt("w", 50).requests == 0);  // before any gossip: nothing known
  CHECK(p.LoadAt("w", 150).requests == 2);
  CHECK(p.LoadAt("w", 250).requests == 5);
  CHECK(p.LoadAt("unknown", 250) == OwnLoadCounts{});
}

TEST_CASE("an older or repeated message is refused as stale; a new incarnation replaces the peer") {
  PeerLoads p(kTtl);
  REQUIRE(p.Apply(From("a", 5, {On("w", 4)}), 10) == GossipRefusal::kNone);
  CHECK(p.Apply(From("a", 5, {On("w", 9)}), 20) == GossipRefusal::kStale);
  CHECK(p.Apply(From("a", 3, {On("w", 9)}), 20) == GossipRefusal::kStale);
  CHECK(p.Load("w").requests == 4);
  // The router restarted: a new incarnation starts its seq again.
  REQUIRE(p.Apply(From("a", 1, {On("w", 1)}, {}, 2), 30) == GossipRefusal::kNone);
  CHECK(p.Load("w").requests == 1);
  CHECK(p.Peers() == 1);
  p.CheckInvariants();
}

TEST_CASE("a peer not heard for the ttl is forgotten with its counts and its work") {
  PeerLoads p(kTtl);
  p.Apply(From("a", 1, {On("w", 2)}, {{"m", 1000}}), 0);
  p.Apply(From("b", 1, {On("w", 3)}, {{"m", 500}}), kTtl / 2);
  CHECK(p.WorkRate("m") == 1500);
  p.Expire(kTtl);  // a is exactly ttl old: kept
  CHECK(p.Peers() == 2);
  p.Expire(kTtl + 1);
  CHECK(p.Peers() == 1);
  CHECK(p.Load("w").requests == 3);
  CHECK(p.WorkRate("m") == 500);
  CHECK(p.LoadAt("w", kTtl).requests == 5);  // a report read before a went still counted it
  p.Expire(3 * kTtl);
  CHECK(p.Peers() == 0);
  CHECK(p.Load("w") == OwnLoadCounts{});
  CHECK(p.WorkRate("m") == 0);
  p.CheckInvariants();
}

TEST_CASE("forged router ids and worker names cannot grow the state without bound") {
  PeerLoads p(kTtl);
  for (size_t i = 0; i < config::kMaxPeerRouters; ++i) {
    REQUIRE(p.Apply(From("r" + std::to_string(i), 1, {}), 1) == GossipRefusal::kNone);
  }
  CHECK(p.Apply(From("one-more", 1, {}), 1) == GossipRefusal::kTooManyPeers);
  std::vector<GossipWorker> many;
  for (size_t i = 0; i < 1024; ++i) many.push_back(On("w" + std::to_string(i), 1));
  REQUIRE(p.Apply(From("r0", 2, many), 2) == GossipRefusal::kNone);
  for (auto& w : many) w.worker += "-other";
  REQUIRE(p.Apply(From("r1", 2, many), 2) == GossipRefusal::kNone);
  for (auto& w : many) w.worker += "-third";
  CHECK(p.Apply(From("r2", 2, many), 2) == GossipRefusal::kTooManyWorkers);
  p.CheckInvariants();
}

TEST_CASE("random messages, stale ones and expiries keep each worker's sum the live peers' sum") {
  PeerLoads p(kTtl);
  std::mt19937 rng(11);
  std::map<std::string, uint64_t> seq;
  TimeNs now = 0;
  for (int step = 0; step < 3000; ++step) {
    now += static_cast<TimeNs>(rng() % (kTtl / 10));
    const std::string router = "r" + std::to_string(rng() % 5);
    if (rng() % 10 == 0) {
      p.Expire(now);
    } else {
      std::vector<GossipWorker> workers;
      for (int w = 0; w < 4; ++w) {
        if (rng() % 2 != 0) workers.push_back(On("w" + std::to_string(w), rng() % 8, 0, 0));
      }
      const uint64_t s = rng() % 8 == 0 ? seq[router] : ++seq[router];  // now and then a repeat
      p.Apply(From(router, s, workers), now);
    }
    if (step % 50 == 0) p.CheckInvariants();
  }
  p.CheckInvariants();
}

}  // namespace kvfleet::router

namespace kvfleet::router {

// Routing reads the peers' sums by worker id (PeerLoads::Reader) to spare a string lookup per
// worker per decision: they must be the sums found by name, through gossip adding and expiring
// names and the fleet naming, renaming and forgetting ids (invariant 4).
TEST_CASE("peer loads found by worker id equal those found by its name, as names come and go") {
  PeerLoads p(kTtl);
  std::mt19937 rng(23);
  std::map<std::string, uint64_t> seq;
  std::vector<std::string> name_of(12);  // the fleet's view: id -> name ("" not named)
  TimeNs now = 0;
  for (int step = 0; step < 4000; ++step) {
    now += static_cast<TimeNs>(rng() % (kTtl / 10));
    const int op = static_cast<int>(rng() % 10);
    if (op == 0) {
      p.Expire(now);
    } else if (op <= 2) {  // a worker joins, is renamed (two ids may share a name) or is forgotten
      const WorkerId id = static_cast<WorkerId>(rng() % name_of.size());
      name_of[id] = rng() % 4 == 0 ? "" : "w" + std::to_string(rng() % 6);
      p.NameWorker(id, name_of[id]);
    } else {
      const std::string router = "r" + std::to_string(rng() % 3);
      std::vector<GossipWorker> workers;
      for (int w = 0; w < 6; ++w) {
        if (rng() % 2 != 0) workers.push_back(On("w" + std::to_string(w), rng() % 8, rng() % 3, rng() % 500));
      }
      p.Apply(From(router, ++seq[router], workers), now);
    }
    const TimeNs at = now - static_cast<TimeNs>(rng() % kTtl);
    std::vector<OwnLoadCounts> want_now, want_then;
    for (const std::string& name : name_of) {
      want_now.push_back(name.empty() ? OwnLoadCounts{} : p.Load(name));
      want_then.push_back(name.empty() ? OwnLoadCounts{} : p.LoadAt(name, at));
    }
    {
      PeerLoads::Reader reader(p);
      for (WorkerId id = 0; id < name_of.size(); ++id) {
        OwnLoadCounts now_by_id, then_by_id;
        reader.NowAndAt(id, at, &now_by_id, &then_by_id);
        REQUIRE(now_by_id == want_now[id]);
        REQUIRE(then_by_id == want_then[id]);
      }
    }
    if (step % 50 == 0) p.CheckInvariants();
  }
  p.CheckInvariants();
}

}  // namespace kvfleet::router
