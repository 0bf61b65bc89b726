// Who may register: Membership's claims on worker ids and endpoints, the fleet refusing
// forged Hellos and Byes, CURVE on the registration socket admitting only listed worker
// keys, and an unauthenticated registration socket kept off other hosts.
#include <filesystem>
#include <memory>
#include <thread>

#include <doctest/doctest.h>
#include <prometheus/registry.h>

#include "common/curve_keys.h"
#include "router/fleet/discovery.h"
#include "router/fleet/fleet.h"
#include "router/fleet/membership.h"
#include "tests/router/fake_worker.h"
#include "tests/router/fleet/mock_worker_config.h"
#include "worker/server/registration.h"
#include "worker/server/worker.h"

namespace kvfleet::router {
namespace {

namespace fs = std::filesystem;
using testing::FakeWorker;
using testing::WaitFor;

WorkerHello HelloFor(const std::string& name, const std::string& model, const std::string& requests) {
  WorkerHello h;
  h.name = name;
  h.model = model;
  h.block_size = 16;
  h.max_context = 2048;
  h.requests_endpoint = requests;
  h.events_endpoint = requests + "-events";
  h.backend = "mock";
  return h;
}

double Refusals(prometheus::Registry& registry, const std::string& reason) {
  for (const auto& family : registry.Collect()) {
    if (family.name != "kvfleet_router_workers_refused_total") continue;
    for (const auto& m : family.metric) {
      for (const auto& label : m.label) {
        if (label.name == "reason" && label.value == reason) return m.counter.value;
      }
    }
  }
  return 0;
}

// A fleet taking registrations on a loopback port, counting into `registry`.
std::unique_ptr<Fleet> RegistrationFleet(prometheus::Registry& registry) {
  FleetOptions o;
  o.registration_endpoint = "tcp://127.0.0.1:*";
  return std::move(Fleet::Start(o, nullptr, SystemClock::Default(), &registry)).value();
}

bool Routable(Fleet& fleet, const std::string& model) {
  auto m = fleet.FindModel(model);
  return m && !m->routable.empty();
}

}  // namespace

TEST_CASE("Membership: a worker's id and endpoints belong to its peer while its Hellos last") {
  Membership members(10 * kNsPerSec);
  const RegistrationPeer owner{"w1", false}, intruder{"intruder", false};
  WorkerHello hello = HelloFor("w1", "m", "tcp://10.0.0.1:5556");
  REQUIRE(members.AdmitHello(hello, owner, 0).ok());
  CHECK(members.AdmitHello(hello, owner, 2 * kNsPerSec).ok());  // the periodic re-send

  WorkerHello same_id = HelloFor("w1", "other", "tcp://10.6.6.6:5556");
  CHECK(!members.AdmitHello(same_id, intruder, 3 * kNsPerSec).ok());
  WorkerHello same_endpoint = HelloFor("evil", "other", "tcp://10.0.0.1:5556");
  CHECK(!members.AdmitHello(same_endpoint, intruder, 3 * kNsPerSec).ok());
  WorkerHello events_only = HelloFor("evil", "other", "tcp://10.6.6.6:5556");
  events_only.events_endpoint = hello.events_endpoint;
  CHECK(!members.AdmitHello(events_only, intruder, 3 * kNsPerSec).ok());
  // The owner itself may move (a restart with other ports).
  WorkerHello moved = HelloFor("w1", "m", "tcp://10.0.0.1:6556");
  CHECK(members.AdmitHello(moved, owner, 4 * kNsPerSec).ok());
  CHECK(members.AdmitHello(same_endpoint, intruder, 5 * kNsPerSec).ok());  // released by the move

  // Silent past the lease (the worker died): its id may be registered by a new peer.
  CHECK(!members.AdmitHello(same_id, intruder, 13 * kNsPerSec).ok());
  CHECK(members.AdmitHello(same_id, intruder, 14 * kNsPerSec + 1).ok());
}

TEST_CASE("Membership: a Bye counts only from the peer that registered the worker") {
  Membership members(10 * kNsPerSec);
  const RegistrationPeer owner{"KEY-A", true}, other{"KEY-B", true};
  REQUIRE(members.AdmitHello(HelloFor("w1", "m", "tcp://h:1"), owner, 0).ok());
  CHECK(!members.AdmitBye({"w1", 0}, other).ok());
  CHECK(!members.AdmitBye({"nobody", 0}, owner).ok());
  CHECK(members.AdmitBye({"w1", 0}, owner).ok());
  CHECK(members.claims() == 0);
  // After the Bye, the id and endpoint are free for anyone.
  CHECK(members.AdmitHello(HelloFor("w1", "m", "tcp://h:1"), other, 1).ok());
}

TEST_CASE("Membership: a Bye ends only the run that registered") {
  Membership members(10 * kNsPerSec);
  const RegistrationPeer owner{"w1", false};
  WorkerHello hello = HelloFor("w1", "m", "tcp://h:1");
  hello.epoch = 2;
  REQUIRE(members.AdmitHello(hello, owner, 0).ok());
  // The run before it, still shutting down: refused as stale, the claim kept.
  const Status stale = members.AdmitBye({"w1", 1}, owner);
  CHECK(stale.code() == StatusCode::kNotFound);
  CHECK(members.claims() == 1);
  CHECK(members.AdmitBye({"w1", 2}, owner).ok());
  CHECK(members.claims() == 0);
  // A Bye without an epoch (0) ends whichever run holds the claim.
  REQUIRE(members.AdmitHello(hello, owner, 1).ok());
  CHECK(members.AdmitBye({"w1", 0}, owner).ok());
}

TEST_CASE("a registration routing id names its worker before the run's epoch") {
  const std::string id = server::RegistrationRoutingId("worker-7", 0x1234abcdULL);
  CHECK(id == "worker-7#000000001234abcd");
  CHECK(PeerOfRoutingId(id) == "worker-7");
  CHECK(PeerOfRoutingId("worker-7") == "worker-7");  // a worker that sets no epoch
  CHECK(PeerOfRoutingId("a#b#000000001234abcd") == "a#b");
  CHECK(PeerOfRoutingId("w#000000001234ABCD") == "w#000000001234ABCD");  // not ours: kept whole
  CHECK(PeerOfRoutingId("w#00000001234abcd") == "w#00000001234abcd");    // 15 digits
  CHECK(PeerOfRoutingId("#000000001234abcd") == "#000000001234abcd");    // no id before it
  // A ZMQ routing id is at most 255 bytes: a worker id too long for one is refused, named.
  zmq::context_t context;
  server::RegistrationOptions ro;
  ro.router_endpoint = "tcp://127.0.0.1:1";
  CHECK(server::Registration::Start(context, ro, HelloFor(std::string(238, 'w'), "m", "tcp://h:1")).ok());
  auto long_id = server::Registration::Start(context, ro, HelloFor(std::string(239, 'w'), "m", "tcp://h:1"));
  REQUIRE_FALSE(long_id.ok());
  CHECK(long_id.status().message().find("registration takes 1 to 238") != std::string::npos);
}

TEST_CASE("Membership: lapsed claims are forgotten") {
  Membership members(1 * kNsPerSec);
  for (int i = 0; i < 100; ++i) {
    const std::string name = "w" + std::to_string(i);
    REQUIRE(members.AdmitHello(HelloFor(name, "m", "tcp://h:" + std::to_string(i)), {name, false}, 0).ok());
  }
  CHECK(members.claims() == 100);
  REQUIRE(members.AdmitHello(HelloFor("late", "m", "tcp://h:999"), {"late", false}, 2 * kNsPerSec).ok());
  CHECK(members.claims() == 1);
}

TEST_CASE("the fleet refuses a Hello or Bye from a peer that does not own the worker it names") {
  FakeWorker victim;
  prometheus::Registry registry;
  auto fleet = RegistrationFleet(registry);
  const std::string reg = fleet->registration_endpoint();
  FakeWorker::Register(reg, EncodeHello(HelloFor("w1", "m", victim.endpoint())));
  REQUIRE(WaitFor([&] { return Routable(*fleet, "m"); }));

  // Another id on the victim's endpoint, and the victim's id from another peer: refused.
  FakeWorker::Register(reg, EncodeHello(HelloFor("evil", "other", victim.endpoint())), "evil");
  FakeWorker::Register(reg, EncodeHello(HelloFor("w1", "other", victim.endpoint())), "intruder");
  REQUIRE(WaitFor([&] { return Refusals(registry, "hello-not-owner") == 2; }));
  CHECK(!fleet->FindModel("other"));
  CHECK(Routable(*fleet, "m"));

  // A forged Bye leaves the worker in service; its own takes it out at once.
  FakeWorker::Register(reg, EncodeBye({"w1", 0}), "intruder");
  REQUIRE(WaitFor([&] { return Refusals(registry, "bye-not-owner") == 1; }));
  CHECK(Routable(*fleet, "m"));
  FakeWorker::Register(reg, EncodeBye({"w1", 0}));
  CHECK(WaitFor([&] { return !Routable(*fleet, "m"); }));
  fleet->Stop();
}

// A restart's overlap: the run being replaced still has its Bye in its socket (the Bye's
// linger) when its replacement, the same worker id, registers. Each run is its own connection
// (its routing id carries its epoch): the old Bye is refused as stale, and the new run's
// Hellos keep arriving. With one routing id for both, the router's handover gave the id to
// the later connection and left the new run's open but unread, so it never registered.
TEST_CASE("a worker's earlier run saying Bye does not cut off the run that replaced it") {
  FakeWorker target;
  prometheus::Registry registry;
  auto fleet = RegistrationFleet(registry);
  server::RegistrationOptions ro;
  ro.router_endpoint = fleet->registration_endpoint();
  ro.interval = 50 * kNsPerMs;
  zmq::context_t context;
  WorkerHello now = HelloFor("w1", "m", target.endpoint());
  now.epoch = 2;
  auto run = std::move(server::Registration::Start(context, ro, now)).value();
  REQUIRE(WaitFor([&] { return Routable(*fleet, "m"); }));

  {  // The earlier run: connected under its own routing id, its Bye the last thing it sends.
    zmq::socket_t earlier(context, zmq::socket_type::dealer);
    earlier.set(zmq::sockopt::linger, 500);
    earlier.set(zmq::sockopt::routing_id, server::RegistrationRoutingId("w1", 1));
    earlier.connect(ro.router_endpoint);
    earlier.send(zmq::buffer(EncodeBye({"w1", 1})), zmq::send_flags::none);
  }
  REQUIRE(WaitFor([&] { return Refusals(registry, "bye-stale") == 1; }));
  CHECK(Routable(*fleet, "m"));
  // The run in service is still heard: a changed Hello reaches the fleet.
  now.max_context = 4096;
  run->Update(now, true);
  CHECK(WaitFor([&] {
    const std::vector<WorkerStatus> workers = fleet->Workers();
    return workers.size() == 1 && workers[0].info.max_context == 4096;
  }));
  run->Stop(true);
  CHECK(WaitFor([&] { return !Routable(*fleet, "m"); }));
  fleet->Stop();
}

TEST_CASE("an unauthenticated registration socket binds only loopback unless told the network is trusted") {
  CHECK(LocalOnlyEndpoint("tcp://127.0.0.1:5555"));
  CHECK(LocalOnlyEndpoint("tcp://localhost:5555"));
  CHECK(LocalOnlyEndpoint("tcp://[::1]:5555"));
  CHECK(LocalOnlyEndpoint("ipc:///run/kvfleet/registration"));
  CHECK(!LocalOnlyEndpoint("tcp://*:5555"));
  CHECK(!LocalOnlyEndpoint("tcp://0.0.0.0:5555"));
  CHECK(!LocalOnlyEndpoint("tcp://10.1.2.3:5555"));
  FleetOptions o;
  o.registration_endpoint = "tcp://*:0";
  auto refused = Fleet::Start(o, nullptr, SystemClock::Default(), nullptr);
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().find("--registration-authorized-keys") != std::string::npos);
  o.registration_auth.insecure = true;
  auto started = Fleet::Start(o, nullptr, SystemClock::Default(), nullptr);
  REQUIRE_MESSAGE(started.ok(), started.status().ToString());
  (*started)->Stop();
}

TEST_CASE("with authorized keys, only listed workers register") {
  const fs::path dir = fs::temp_directory_path() / ("kvfleet-membership-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto path = [&](const std::string& name) { return (dir / name).string(); };
  auto write = [&](const std::string& name, const std::string& text) {
    FILE* f = std::fopen(path(name).c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  const CurveKeyPair router = *GenerateCurveKeyPair(), worker = *GenerateCurveKeyPair(),
                     stranger = *GenerateCurveKeyPair();
  REQUIRE(WriteCurveKeyPair(path("router.key"), router).ok());
  REQUIRE(WriteCurveKeyPair(path("worker.key"), worker).ok());
  write("router.pub", router.public_key + "\n");
  write("worker.pub", worker.public_key + "\n");
  write("workers", "# fleet members\n" + worker.public_key + "\n");

  prometheus::Registry registry;
  FleetOptions o;
  o.registration_endpoint = "tcp://*:0";  // reachable from other hosts: fine with keys
  o.registration_auth.authorized_keys_file = path("workers");
  o.curve = {path("router.key"), path("worker.pub")};
  auto fleet = std::move(Fleet::Start(o, nullptr, SystemClock::Default(), &registry)).value();
  std::string reg = fleet->registration_endpoint();
  reg = "tcp://127.0.0.1" + reg.substr(reg.rfind(':'));

  // No key at all (the mechanisms differ), and a stranger's key (the authenticator refuses
  // it, counted): the handshake fails and no Hello arrives.
  FakeWorker fake;
  auto send_keyed = [&](const CurveKeyPair& keys) {
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 500);
    REQUIRE(MakeCurveClient(s, keys, router.public_key).ok());
    s.connect(reg);
    s.send(zmq::buffer(EncodeHello(HelloFor("forged", "m", fake.endpoint()))), zmq::send_flags::none);
  };
  FakeWorker::Register(reg, EncodeHello(HelloFor("plain", "m", fake.endpoint())));
  send_keyed(stranger);
  REQUIRE(WaitFor([&] { return Refusals(registry, "unauthenticated") >= 1; }));
  CHECK(!fleet->FindModel("m"));

  // A worker holding a listed key registers (worker/server/registration.h over CURVE).
  zmq::context_t context;
  server::WorkerConfig config = testing::MockWorkerConfig("m");
  config.curve_keypair = path("worker.key");
  config.router = reg;
  config.router_key = path("router.pub");
  auto started = server::Worker::Start(config, context);
  REQUIRE_MESSAGE(started.ok(), started.status().ToString());
  std::unique_ptr<server::Worker> w = std::move(*started);
  std::thread engine([&] { w->Run(); });
  CHECK(WaitFor([&] { return Routable(*fleet, "m"); }));
  REQUIRE(fleet->Workers().size() == 1);  // the forged ones never joined
  CHECK(fleet->Workers()[0].info.name != "forged");
  CHECK(fleet->Workers()[0].info.name != "plain");
  w->RequestStop();
  engine.join();
  fleet->Stop();
  fs::remove_all(dir);
}

}  // namespace kvfleet::router
