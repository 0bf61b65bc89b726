#include "router/events/event_plane.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <capnp/message.h>
#include <doctest/doctest.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/curve_keys.h"
#include "router/events/fault_injection.h"
#include "schema/wire.h"
#include "tests/router/events/sim_worker.h"

namespace kvfleet::router {
namespace {

using testing::FromIndex;
using testing::SimWorker;
using testing::TierSets;
using Clock = std::chrono::steady_clock;

// Sanitizers slow everything several-fold; the deadlines below are the figures
// on a normal build.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kSlowdown = 5;
#else
constexpr int kSlowdown = 1;
#endif

double MetricValue(prometheus::Registry& registry, const std::string& name, const std::string& label = "",
                   const std::string& value = "") {
  double total = 0;
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      bool match = label.empty();
      for (const auto& l : m.label)
        if (l.name == label && l.value == value) match = true;
      if (match) total += m.counter.value + m.gauge.value;
    }
  }
  return total;
}

// Polls `done` until it holds or `budget` passes.
template <typename F>
bool Eventually(F done, std::chrono::milliseconds budget) {
  const auto deadline = Clock::now() + budget * kSlowdown;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

void WaitIdle(std::vector<std::unique_ptr<SimWorker>>& workers) {
  for (auto& w : workers)
    while (w && !w->Idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TEST_CASE("the index converges to the live workers' snapshots under drops, duplicates, reordering, a restart "
          "and a death; a router started late converges too") {
  constexpr int kWorkers = 5;
  constexpr WorkerId kRestarted = 1, kKilled = 4;
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int i = 0; i < kWorkers; ++i) {
    workers.push_back(std::make_unique<SimWorker>("w" + std::to_string(i), 100 + i, SimWorker::Kind::kRealKv));
    workers.back()->Start();
  }
  prometheus::Registry registry_a, registry_b;
  EventPlaneOptions options;
  options.heartbeat_timeout = kNsPerSec * kSlowdown;
  FaultOptions faults;  // 10% dropped, 5% duplicated, reordered within 8
  auto injector = std::make_shared<FaultInjector>(faults);
  EventPlaneOptions faulty = options;
  faulty.fault_injector = injector;
  auto router_a = std::make_unique<EventPlane>(faulty, SystemClock::Default(), &registry_a);
  for (int i = 0; i < kWorkers; ++i)
    REQUIRE(router_a->AddWorker(i, workers[i]->name(), workers[i]->endpoints()).ok());
  REQUIRE(router_a->AddWorker(0, workers[0]->name(), workers[0]->endpoints()).ok());  // idempotent

  for (auto& w : workers) w->Run(300);
  WaitIdle(workers);
  workers[kRestarted]->Restart();  // a new epoch on the same ports
  workers[kKilled]->Kill();
  for (int i = 0; i < kWorkers; ++i)
    if (i != kKilled) workers[i]->Run(150);
  // A router that starts while the fleet is busy: a restarted router, as far as the fleet can tell.
  auto router_b = std::make_unique<EventPlane>(options, SystemClock::Default(), &registry_b);
  for (int i = 0; i < kWorkers; ++i)
    if (i != kKilled) REQUIRE(router_b->AddWorker(i, workers[i]->name(), workers[i]->endpoints()).ok());
  for (int i = 0; i < kWorkers; ++i)
    if (i != kKilled) workers[i]->Run(150);
  WaitIdle(workers);

  uint64_t block_events = 0;
  for (auto& w : workers) block_events += w->block_events();
  MESSAGE("block events published: " << block_events << "; injected drops " << injector->dropped() << ", dups "
                                     << injector->duplicated() << ", reorders " << injector->reordered());
  CHECK(block_events >= 50'000);

  std::vector<TierSets> expected(kWorkers);
  for (int i = 0; i < kWorkers; ++i)
    if (i != kKilled) expected[i] = workers[i]->Holdings();
  auto converged = [&](EventPlane& plane) {
    for (int i = 0; i < kWorkers; ++i)
      if (!(FromIndex(plane.index(), i) == expected[i])) return false;
    return plane.State(kKilled) == WorkerState::kDead || &plane == router_b.get();
  };
  // Traffic has stopped: within 2 s each router holds exactly what the live workers hold.
  CHECK(Eventually([&] { return converged(*router_a); }, std::chrono::milliseconds(2000)));
  CHECK(Eventually([&] { return converged(*router_b); }, std::chrono::milliseconds(2000)));
  for (int i = 0; i < kWorkers; ++i) {
    INFO("worker " << i);
    if (i == kKilled) continue;
    // The injector keeps dropping heartbeats after traffic stops, so a worker may be
    // replaying a just-dropped heartbeat at this instant; it must not be syncing or dead.
    auto live_or_replaying = [](WorkerState s) { return s == WorkerState::kLive || s == WorkerState::kReplaying; };
    CHECK(live_or_replaying(router_a->State(i)));
    CHECK(live_or_replaying(router_b->State(i)));
    CHECK(!expected[i].device.empty());
  }
  CHECK(router_a->index().BlockCount(kKilled, kv::Tier::kDevice) == 0);
  router_a->index().CheckInvariants();
  CHECK(injector->dropped() > 0);
  CHECK(MetricValue(registry_a, "kvfleet_router_event_gaps_total") > 0);
  CHECK(MetricValue(registry_a, "kvfleet_router_event_replays_total") > 0);
  CHECK(MetricValue(registry_a, "kvfleet_router_event_epoch_changes_total") >= 1);
  // Every loss showed as a seq gap: the event ids always followed on where the seqs did.
  CHECK(MetricValue(registry_a, "kvfleet_router_event_id_mismatches_total") == 0);
  CHECK(MetricValue(registry_b, "kvfleet_router_event_id_mismatches_total") == 0);
  CHECK(MetricValue(registry_a, "kvfleet_router_events_applied_total", "type", "stored") > 0);
  CHECK(Eventually([&] { return MetricValue(registry_a, "kvfleet_router_worker_state", "state", "dead") == 1; },
                   std::chrono::milliseconds(1000)));
  auto stats = router_a->Stats();
  REQUIRE(stats.size() == kWorkers);
  CHECK(stats[kRestarted].epoch_changes >= 1);
  CHECK(stats[0].last_event_id > 0);  // the ids were there to check
  CHECK(router_a->Load(0).has_value());
  CHECK(router_a->Load(0)->total_blocks[0] > 0);
}

TEST_CASE("a silent worker goes DEAD with all its blocks dropped, and comes back through SYNCING") {
  SimWorker worker("solo", 7, SimWorker::Kind::kScripted);
  worker.Start();
  prometheus::Registry registry;
  EventPlaneOptions options;
  options.heartbeat_timeout = 500 * kNsPerMs * kSlowdown;
  EventPlane plane(options, SystemClock::Default(), &registry);
  REQUIRE(plane.AddWorker(3, "solo", worker.endpoints()).ok());
  worker.Run(50);
  while (!worker.Idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  TierSets before = worker.Holdings();
  REQUIRE(Eventually([&] { return FromIndex(plane.index(), 3) == before; }, std::chrono::milliseconds(2000)));
  CHECK(plane.State(3) == WorkerState::kLive);

  worker.Kill();
  REQUIRE(Eventually([&] { return plane.State(3) == WorkerState::kDead; }, std::chrono::milliseconds(2000)));
  CHECK(plane.index().BlockCount(3, kv::Tier::kDevice) == 0);
  CHECK(plane.index().BlockCount(3, kv::Tier::kHost) == 0);
  CHECK(!plane.Load(3).has_value());

  worker.Start();  // same ports, new epoch, fresh cache
  worker.Run(30);
  while (!worker.Idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  TierSets after = worker.Holdings();
  CHECK(Eventually([&] { return plane.State(3) == WorkerState::kLive && FromIndex(plane.index(), 3) == after; },
                   std::chrono::milliseconds(2000)));
}

TEST_CASE("malformed input is counted and dropped, and the plane keeps working") {
  zmq::context_t ctx(1);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.bind("tcp://127.0.0.1:*");
  const std::string endpoint = pub.get(zmq::sockopt::last_endpoint);
  prometheus::Registry registry;
  EventPlane plane({}, SystemClock::Default(), &registry);
  REQUIRE(plane.AddWorker(1, "bad", {endpoint, "tcp://127.0.0.1:1"}).ok());
  auto malformed = [&](const char* reason) {
    return MetricValue(registry, "kvfleet_router_events_malformed_total", "reason", reason);
  };
  // Garbage under the right topic, until the subscription is live (slow joiner).
  REQUIRE(Eventually(
      [&] {
        pub.send(zmq::str_buffer("kv.bad"), zmq::send_flags::sndmore);
        pub.send(zmq::str_buffer("garbage!"));
        return malformed("decode") > 0;
      },
      std::chrono::milliseconds(3000)));
  // A truncated capnp batch.
  std::string good = events::EncodeBatch({"bad", 5, 1, 0}, {}, {});
  std::string truncated = good.substr(0, good.size() / 2 / 8 * 8);
  pub.send(zmq::str_buffer("kv.bad"), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(truncated));
  // One frame, three frames.
  pub.send(zmq::str_buffer("kv.bad"));
  pub.send(zmq::str_buffer("kv.bad"), zmq::send_flags::sndmore);
  pub.send(zmq::str_buffer("x"), zmq::send_flags::sndmore);
  pub.send(zmq::str_buffer("y"));
  // A topic nobody registered, and a batch of another worker under this topic.
  pub.send(zmq::str_buffer("kv.nobody"), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(good));
  std::string other = events::EncodeBatch({"other", 5, 1, 0}, {}, {});
  pub.send(zmq::str_buffer("kv.bad"), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(other));
  // epoch 0 and seq 0 are not valid batches either.
  pub.send(zmq::str_buffer("kv.bad"), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(events::EncodeBatch({"bad", 0, 0, 0}, {}, {})));
  CHECK(Eventually([&] { return malformed("decode") >= 3 && malformed("frames") >= 2 && malformed("topic") >= 2; },
                   std::chrono::milliseconds(2000)));
  plane.Sync();
  CHECK(plane.index().EntryCount() == 0);
}

TEST_CASE("workers join and leave many times without disturbing each other") {
  SimWorker steady("steady", 9, SimWorker::Kind::kScripted);
  steady.Start();
  prometheus::Registry registry;
  EventPlane plane({}, SystemClock::Default(), &registry);
  REQUIRE(plane.AddWorker(0, "steady", steady.endpoints()).ok());
  CHECK(!plane.AddWorker(config::kMaxWorkers, "x", steady.endpoints()).ok());
  CHECK(!plane.AddWorker(5, "x", {"nonsense", "tcp://127.0.0.1:1"}).ok());
  steady.Run(40);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::unique_ptr<SimWorker>> churn;
    for (int i = 0; i < 6; ++i) {
      churn.push_back(std::make_unique<SimWorker>("c" + std::to_string(round * 10 + i), 50 + i,
                                                  SimWorker::Kind::kScripted));
      churn.back()->Start();
      churn.back()->Run(10);
      REQUIRE(plane.AddWorker(10 + i, churn.back()->name(), churn.back()->endpoints()).ok());
    }
    WaitIdle(churn);
    CHECK(Eventually([&] { return plane.State(12) == WorkerState::kLive; }, std::chrono::milliseconds(2000)));
    for (int i = 0; i < 6; ++i) plane.RemoveWorker(10 + i);
    for (int i = 0; i < 6; ++i) CHECK(plane.index().BlockCount(10 + i, kv::Tier::kDevice) == 0);
  }
  while (!steady.Idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  TierSets held = steady.Holdings();
  CHECK(Eventually([&] { return FromIndex(plane.index(), 0) == held; }, std::chrono::milliseconds(2000)));
  CHECK(plane.Stats().size() == 1);
  plane.index().CheckInvariants();
}

TEST_CASE("with CURVE keys from files, a known router syncs and an unknown one hears nothing") {
  REQUIRE(CurveAvailable());
  const std::string dir = "/tmp/kvfleet-curve-test-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto server = GenerateCurveKeyPair(), known = GenerateCurveKeyPair(), stranger = GenerateCurveKeyPair();
  REQUIRE((server.ok() && known.ok() && stranger.ok()));
  REQUIRE(WriteCurveKeyPair(dir + "/server.key", *server).ok());
  REQUIRE(WriteCurveKeyPair(dir + "/router.key", *known).ok());
  REQUIRE(WriteCurveKeyPair(dir + "/stranger.key", *stranger).ok());
  std::ofstream(dir + "/server.pub") << server->public_key << "\n";
  std::ofstream(dir + "/authorized") << "# routers allowed to subscribe\n" << known->public_key << "\n";
  CHECK(!LoadCurveKeyPair(dir + "/server.pub").ok());  // one line is not a key pair
  CHECK(!LoadCurveKeyPair(dir + "/missing").ok());

  SimWorker worker("secure", 11, SimWorker::Kind::kScripted);
  worker.SetCurve({dir + "/server.key", dir + "/authorized"});
  worker.Start();
  worker.Run(20);
  prometheus::Registry r1, r2;
  EventPlaneOptions good;
  good.curve = {dir + "/router.key", dir + "/server.pub"};
  EventPlaneOptions bad;
  bad.curve = {dir + "/stranger.key", dir + "/server.pub"};
  EventPlane plane(good, SystemClock::Default(), &r1);
  EventPlane intruder(bad, SystemClock::Default(), &r2);
  REQUIRE(plane.AddWorker(0, "secure", worker.endpoints()).ok());
  REQUIRE(intruder.AddWorker(0, "secure", worker.endpoints()).ok());
  while (!worker.Idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  TierSets held = worker.Holdings();
  CHECK(Eventually([&] { return plane.State(0) == WorkerState::kLive && FromIndex(plane.index(), 0) == held; },
                   std::chrono::milliseconds(2000)));
  CHECK(intruder.State(0) != WorkerState::kLive);
  CHECK(intruder.index().EntryCount() == 0);
  CHECK(!intruder.Load(0).has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvfleet::router

namespace kvfleet::router {
namespace {

TEST_CASE("a worker forgotten under its old id leaves its successor of the same name subscribed, with its series") {
  // A restarted pod keeps its name but gets a new address, so the fleet gives it a new id and
  // later forgets the old one: the topic kv.<name> and the per-name gauges are the new id's too.
  SimWorker worker("pod-0", 3, SimWorker::Kind::kScripted);
  worker.Start();
  prometheus::Registry registry;
  EventPlane plane({}, SystemClock::Default(), &registry);
  REQUIRE(plane.AddWorker(0, "pod-0", {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"}).ok());  // the old address
  REQUIRE(plane.AddWorker(1, "pod-0", worker.endpoints()).ok());
  plane.Sync();
  CHECK(plane.replay_sockets() == 2);
  plane.RemoveWorker(0);
  CHECK(plane.replay_sockets() == 1);
  worker.Run(20);
  while (!worker.Idle()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const TierSets held = worker.Holdings();
  CHECK(Eventually([&] { return FromIndex(plane.index(), 1) == held; }, std::chrono::milliseconds(2000)));
  CHECK(plane.State(1) == WorkerState::kLive);
  CHECK(Eventually([&] { return MetricValue(registry, "kvfleet_router_worker_state", "worker", "pod-0") == 1; },
                   std::chrono::milliseconds(2000)));
  CHECK(MetricValue(registry, "kvfleet_router_events_malformed_total", "reason", "topic") == 0);
  plane.RemoveWorker(1);
  CHECK(plane.replay_sockets() == 0);
  CHECK(MetricValue(registry, "kvfleet_router_worker_state", "worker", "pod-0") == 0);
}

}  // namespace
}  // namespace kvfleet::router
