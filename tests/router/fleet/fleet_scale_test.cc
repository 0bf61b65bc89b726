// The fleet at scale: frames beyond the registration limit never reach the router, a fleet
// bounded by max_workers refuses the rest cleanly instead of running out of sockets, and
// workers that left are forgotten with their sockets, so churn keeps the socket count flat.
#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <prometheus/registry.h>
#include <zmq.h>
#include <zmq.hpp>

#include "router/fleet/fleet.h"
#include "router/fleet/lane.h"
#include "router/fleet/poll_loop.h"
#include "schema/limits.h"
#include "schema/registration.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router {

using testing::WaitFor;
using testing::WaitTicking;

namespace {

WorkerHello HelloOf(const std::string& name, int port) {
  WorkerHello h;
  h.name = name;
  h.model = "m";
  h.block_size = 16;
  h.max_context = 4096;
  h.epoch = 1;
  h.backend = "mock";
  // Nobody listens there: the fleet's DEALERs keep trying, as for a worker not yet up.
  h.requests_endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  return h;
}

std::optional<WorkerStatus> StatusOf(const Fleet& fleet, const std::string& name) {
  for (const WorkerStatus& w : fleet.Workers()) {
    if (w.info.name == name) return w;
  }
  return std::nullopt;
}

bool Listed(const Fleet& fleet, const std::string& name) { return StatusOf(fleet, name).has_value(); }

// A worker's registration DEALER, as worker/server/registration.cc connects it.
struct Registrar {
  Registrar(zmq::context_t& ctx, const std::string& router, const std::string& id)
      : socket(ctx, zmq::socket_type::dealer) {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::routing_id, id);
    socket.connect(router);
  }
  void Send(const WorkerHello& hello) { socket.send(zmq::buffer(EncodeHello(hello)), zmq::send_flags::none); }
  zmq::socket_t socket;
};

std::string RouterEndpoint(const Fleet& fleet) {
  std::string ep = fleet.registration_endpoint();
  return "tcp://127.0.0.1:" + ep.substr(ep.rfind(':') + 1);
}

// The workers with a kvfleet_router_inflight series.
std::set<std::string> InflightSeries(prometheus::Registry& registry) {
  std::set<std::string> out;
  for (const auto& family : registry.Collect()) {
    if (family.name != "kvfleet_router_inflight") continue;
    for (const auto& m : family.metric) {
      for (const auto& l : m.label) {
        if (l.name == "worker") out.insert(l.value);
      }
    }
  }
  return out;
}

void OnLoopThread(PollLoop& loop, std::function<void()> fn) {
  std::promise<void> done;
  loop.Post([&] {
    fn();
    done.set_value();
  });
  done.get_future().wait();
}

// A fleet with a registration socket and `lanes` lanes, each on its own thread, as the router
// runs one per HTTP I/O thread.
struct ScaleSetup {
  ScaleSetup(size_t max_workers, DurationNs forget_after, size_t lanes, prometheus::Registry* registry = nullptr,
             const Clock* clock = SystemClock::Default())
      : loops(lanes) {
    FleetOptions o;
    o.on_forgotten = [this](WorkerId, const std::string& worker, bool last_of_name) {
      std::lock_guard<std::mutex> lock(mu);
      if (last_of_name) forgotten.push_back(worker);
    };
    o.registration_endpoint = "tcp://127.0.0.1:*";
    o.max_workers = max_workers;
    o.lanes = lanes;
    o.forget_after = forget_after;
    fleet = std::move(Fleet::Start(o, nullptr, clock, registry)).value();
    lane_of.resize(lanes);
    for (size_t i = 0; i < lanes; ++i) OnLoopThread(loops[i], [&, i] { lane_of[i] = fleet->NewLane(&loops[i]); });
    registrar = std::make_unique<Registrar>(ctx, RouterEndpoint(*fleet), "registrar");
  }
  ~ScaleSetup() {
    for (size_t i = 0; i < loops.size(); ++i) OnLoopThread(loops[i], [&, i] { lane_of[i].reset(); });
    fleet->Stop();
  }
  // DEALERs held by every lane together.
  size_t LaneDealers() {
    size_t n = 0;
    for (size_t i = 0; i < loops.size(); ++i) OnLoopThread(loops[i], [&, i] { n += lane_of[i]->dealers(); });
    return n;
  }
  size_t RefusedFor(const std::string& reason) {
    size_t n = 0;
    for (const RefusedWorker& r : fleet->Refused()) n += r.reason == reason ? 1 : 0;
    return n;
  }
  void Bye(const WorkerHello& h) {
    registrar->socket.send(zmq::buffer(EncodeBye(WorkerBye{h.name, h.epoch})), zmq::send_flags::none);
  }

  std::vector<std::string> Forgotten() {
    std::lock_guard<std::mutex> lock(mu);
    return forgotten;
  }

  std::mutex mu;
  std::vector<std::string> forgotten;  // GUARDED_BY(mu): on_forgotten's calls
  zmq::context_t ctx{1};
  std::unique_ptr<Fleet> fleet;
  std::vector<PollLoop> loops;
  std::vector<std::unique_ptr<Lane>> lane_of;  // lane_of[i] lives on loops[i]
  std::unique_ptr<Registrar> registrar;
};

}  // namespace

TEST_CASE("a Hello bigger than the registration limit never reaches the fleet; its sender is disconnected") {
  // Regression: an unbounded registration socket buffered a 512 MB frame in full.
  FleetOptions o;
  o.registration_endpoint = "tcp://127.0.0.1:*";
  auto fleet = std::move(Fleet::Start(o, nullptr, SystemClock::Default(), nullptr)).value();
  zmq::context_t ctx(1);

  Registrar big(ctx, RouterEndpoint(*fleet), "big");
  REQUIRE(zmq_socket_monitor(big.socket.handle(), "inproc://big-monitor", ZMQ_EVENT_DISCONNECTED) == 0);
  zmq::socket_t monitor(ctx, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::linger, 0);
  monitor.connect("inproc://big-monitor");
  // A well-formed Hello, only too big: every adapter with a path-long base model.
  WorkerHello huge = HelloOf("big", 1);
  const size_t adapters = wire::limits::kMaxLoraAdapters * 2;
  for (size_t i = 0; i < adapters; ++i) {
    const std::string base_model(wire::limits::kMaxPathBytes, 'p');
    huge.loras.push_back(LoraAnnounce{"a" + std::to_string(i), i + 1, 8, base_model});
  }
  REQUIRE(static_cast<int64_t>(EncodeHello(huge).size()) > wire::limits::kMaxHelloBytes);
  big.Send(huge);

  Registrar small(ctx, RouterEndpoint(*fleet), "small");
  small.Send(HelloOf("small", 2));
  REQUIRE(WaitFor([&] { return Listed(*fleet, "small"); }));
  // ZeroMQ closed the big sender's connection at the frame's header.
  zmq::pollitem_t item{monitor.handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 1);
  zmq::message_t event;
  REQUIRE(monitor.recv(event));
  uint16_t code = 0;
  std::memcpy(&code, event.data(), sizeof(code));
  CHECK(code == ZMQ_EVENT_DISCONNECTED);
  CHECK_FALSE(Listed(*fleet, "big"));
  fleet->Stop();
}

TEST_CASE("300 registrations: the fleet takes max_workers of them with all their sockets, and refuses the rest") {
  // Regression: at ZeroMQ's default of 1,023 sockets a context, the router aborted with "Too
  // many open files" after ~205 workers (5 sockets each with two lanes).
  constexpr size_t kMax = 250, kHellos = 300, kLanes = 2;
  ScaleSetup s(kMax, 60 * kNsPerSec, kLanes);
  for (size_t i = 0; i < kHellos; ++i) s.registrar->Send(HelloOf("w" + std::to_string(i), 20000 + static_cast<int>(i)));
  // Budgets for sanitizer builds; a plain build takes under a second.
  REQUIRE(WaitFor([&] { return s.fleet->Records() == kMax && s.RefusedFor("max-workers") == kHellos - kMax; }, 20000));
  CHECK(s.fleet->Workers().size() == kMax);
  REQUIRE(WaitFor([&] { return s.LaneDealers() == kMax * kLanes; }, 20000));
  CHECK(s.fleet->SocketsOpen() == 1 + kMax * config::kFleetSocketsPerWorker);
  for (const RefusedWorker& r : s.fleet->Refused()) {
    CHECK(r.why.find("--max-workers") != std::string::npos);
  }
}

TEST_CASE("a worker that says bye is forgotten after the grace, with its sockets; one back within it is kept") {
  // The fleet's clock is the test's: a registered worker not yet connected is gone since its
  // Hello, so on a loaded machine a real-time grace could forget one before its connection
  // was seen. Here the grace passes only when the test moves the clock.
  const DurationNs grace = 2 * kNsPerSec;
  ManualClock clock;
  prometheus::Registry registry;
  ScaleSetup s(8, grace, 1, &registry, &clock);
  testing::FakeWorker leaving_worker, returning_worker;  // reachable: only a Bye makes them gone
  WorkerHello leaving = HelloOf("leaving", 1), returning = HelloOf("returning", 2), later = HelloOf("later", 3);
  leaving.requests_endpoint = leaving_worker.endpoint();
  returning.requests_endpoint = returning_worker.endpoint();
  s.registrar->Send(leaving);
  s.registrar->Send(returning);
  auto connected = [&](const std::string& name) {
    const auto w = StatusOf(*s.fleet, name);
    return w && w->connected;
  };
  REQUIRE(WaitTicking(clock, [&] {
    return s.fleet->Records() == 2 && s.LaneDealers() == 2 && connected("leaving") && connected("returning");
  }, grace * 3 / 4));
  // One socket, in order: the second Bye seen means the rest was too.
  s.Bye(returning);
  s.registrar->Send(returning);  // restarted within the grace
  s.Bye(leaving);
  REQUIRE(WaitFor([&] {
    const auto w = StatusOf(*s.fleet, "leaving");
    return w && w->said_bye;
  }));
  REQUIRE(WaitTicking(clock, [&] { return s.fleet->Records() == 1; }, 4 * grace, 10'000, 1));
  CHECK_FALSE(Listed(*s.fleet, "leaving"));
  CHECK(s.Forgotten() == std::vector<std::string>{"leaving"});
  CHECK(InflightSeries(registry) == std::set<std::string>{"returning"});
  CHECK(s.fleet->SocketsOpen() == 1 + config::kFleetSocketsPerWorker);
  CHECK(WaitFor([&] { return s.LaneDealers() == 1; }));
  // Another grace and more: one that says bye now is forgotten, the one back is not.
  s.registrar->Send(later);
  REQUIRE(WaitFor([&] { return Listed(*s.fleet, "later"); }));
  s.Bye(later);
  REQUIRE(WaitTicking(clock, [&] { return s.Forgotten().size() == 2; }, 4 * grace, 10'000, 1));
  CHECK(s.Forgotten() == std::vector<std::string>{"leaving", "later"});
  CHECK(Listed(*s.fleet, "returning"));
  CHECK(s.fleet->Records() == 1);
}

TEST_CASE("a full fleet: a new worker takes the place of the one gone longest, not a refusal") {
  // Regression: a fleet at --max-workers refused replacement pods for the whole grace of the
  // ones they replaced (932 of 1,000 simulated workers live under 10% churn a minute).
  prometheus::Registry registry;
  ScaleSetup s(3, 60 * kNsPerSec, 1, &registry);
  std::vector<testing::FakeWorker> reachable(6);  // only a Bye makes a worker gone
  auto hello = [&](const std::string& name, int i) {
    WorkerHello h = HelloOf(name, static_cast<uint64_t>(i + 1));
    h.requests_endpoint = reachable[i].endpoint();
    return h;
  };
  std::vector<WorkerHello> first;
  for (int i = 0; i < 3; ++i) {
    first.push_back(hello("w" + std::to_string(i), i));
    s.registrar->Send(first.back());
  }
  auto all_connected = [&] {
    const std::vector<WorkerStatus> workers = s.fleet->Workers();
    return std::all_of(workers.begin(), workers.end(), [](const WorkerStatus& w) { return w.connected; });
  };
  REQUIRE(WaitFor([&] { return s.fleet->Records() == 3 && all_connected(); }));
  s.Bye(first[1]);
  s.registrar->Send(hello("new", 3));
  REQUIRE(WaitFor([&] { return Listed(*s.fleet, "new"); }));
  CHECK(s.fleet->Records() == 3);
  CHECK(s.Forgotten() == std::vector<std::string>{"w1"});
  CHECK(s.RefusedFor("max-workers") == 0);
  REQUIRE(WaitFor(all_connected));
  // Once more; then none is gone, and the next one is refused.
  s.Bye(first[0]);
  s.registrar->Send(hello("newer", 4));
  REQUIRE(WaitFor([&] { return Listed(*s.fleet, "newer"); }));
  CHECK(s.fleet->Records() == 3);
  CHECK(s.Forgotten() == std::vector<std::string>{"w1", "w0"});
  s.registrar->Send(hello("refused", 5));
  REQUIRE(WaitFor([&] { return s.RefusedFor("max-workers") == 1; }));
  CHECK(Listed(*s.fleet, "w2"));
  CHECK_FALSE(Listed(*s.fleet, "refused"));
}

TEST_CASE("churn: workers come and go, the registry, its ids and its sockets stay bounded") {
  constexpr int kRounds = 5, kPerRound = 20;
  // Nobody listens at these workers' addresses: on a real-time grace, a round's first ones
  // could be forgotten before its last ones registered. The test's clock passes the grace
  // only once the round has said bye.
  ManualClock clock;
  ScaleSetup s(kPerRound, 100 * kNsPerMs, 2, nullptr, &clock);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<WorkerHello> hellos;
    for (int i = 0; i < kPerRound; ++i) {
      hellos.push_back(HelloOf("r" + std::to_string(round) + "w" + std::to_string(i), 21000 + round * kPerRound + i));
      s.registrar->Send(hellos.back());
    }
    REQUIRE(WaitFor([&] { return s.fleet->Workers().size() == kPerRound; }));
    std::set<WorkerId> ids;
    for (const WorkerStatus& w : s.fleet->Workers()) ids.insert(w.id);
    CHECK(*ids.rbegin() < kPerRound);  // forgotten workers' ids are reused
    for (const WorkerHello& h : hellos) s.Bye(h);
    REQUIRE(WaitTicking(clock, [&] { return s.fleet->Records() == 0; }, kNsPerSec, 10'000, 1));
    CHECK(s.fleet->SocketsOpen() == 1);
    CHECK(WaitFor([&] { return s.LaneDealers() == 0; }));
    CHECK(s.RefusedFor("max-workers") == 0);
  }
}

}  // namespace kvfleet::router
