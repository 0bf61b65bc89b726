// The gossip channel between routers (router/fleet/gossip.h) on loopback: one router's
// in-flight counts reach the other, a router that stops is forgotten within the ttl, garbage
// and forged frames are refused and counted, and with a gossip key only its holders take part.
// Two Fleets sharing one worker: a request in flight from one is load the other routes on.
// Sent on change: with a heartbeat of 10 s, a change reaches the peer at once, a burst of
// changes goes out in at most two messages, and a peer that goes quiet is still forgotten.
#include "router/fleet/gossip.h"

#include <chrono>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include <doctest/doctest.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/curve_keys.h"
#include "router/fleet/fleet.h"
#include "schema/gossip_codec.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router {
namespace {

using testing::FakeWorker;
using testing::WaitFor;

double Counter(prometheus::Registry& registry, const std::string& name, const std::string& label_name,
               const std::string& label_value) {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      for (const auto& label : m.label) {
        if (label.name == label_name && label.value == label_value) return m.counter.value;
      }
    }
  }
  return 0;
}

double Refused(prometheus::Registry& registry, const std::string& reason) {
  return Counter(registry, "kvfleet_router_gossip_refused_total", "reason", reason);
}

double FramesSent(prometheus::Registry& registry) {
  return Counter(registry, "kvfleet_router_gossip_frames_total", "direction", "sent");
}

// A heartbeat far longer than any wait here: what a peer hears within one was sent on change.
constexpr DurationNs kLongInterval = 10 * kNsPerSec;

// Short periods, so that a router that stops is forgotten within the test's bounded waits.
GossipOptions Options(std::vector<std::string> peers = {}) {
  GossipOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.peers = std::move(peers);
  o.interval = 10 * kNsPerMs;
  o.ttl = 300 * kNsPerMs;
  return o;
}

// A gossip source that says `requests` of this router are in flight on worker "w".
GossipSource Says(const std::atomic<uint32_t>* requests) {
  return [requests](RouterGossip* out) {
    if (requests->load() > 0) out->workers.push_back(GossipWorker{"w", requests->load(), 0, 0, 0});
    out->models.push_back(GossipModel{"m", 250});
  };
}

struct TempKeyPair {
  TempKeyPair() : path("/tmp/kvfleet-gossip-test-" + std::to_string(getpid()) + "-" + std::to_string(++count)) {
    REQUIRE(WriteCurveKeyPair(path, GenerateCurveKeyPair().value()).ok());
  }
  ~TempKeyPair() { std::filesystem::remove(path); }
  std::string path;
  static inline int count = 0;
};

}  // namespace

TEST_CASE("a router's in-flight counts reach its peer; one that stops is forgotten, and heard again when back") {
  std::atomic<uint32_t> requests{3};
  PeerLoads a_peers(300 * kNsPerMs), b_peers(300 * kNsPerMs);
  auto a = Gossip::Start(Options(), Says(&requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a.ok());
  std::atomic<uint32_t> none{0};
  auto b = Gossip::Start(Options({(*a)->endpoint()}), Says(&none), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 3; }));
  CHECK(b_peers.WorkRate("m") == 250);
  requests = 5;
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 5; }));
  CHECK(a_peers.Peers() == 0);  // a lists no peer: it hears nobody
  const std::string a_endpoint = (*a)->endpoint();
  (*a)->Stop();
  CHECK(WaitFor([&] { return b_peers.Peers() == 0; }));
  CHECK(b_peers.Load("w") == OwnLoadCounts{});
  CHECK(b_peers.WorkRate("m") == 0);
  CHECK((*b)->sent() > 0);
  // The router comes back on its endpoint (a new incarnation, its seq from 1): heard again.
  GossipOptions again = Options();
  again.endpoint = a_endpoint;
  requests = 2;
  auto a2 = Gossip::Start(again, Says(&requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a2.ok());
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 2; }));
  b_peers.CheckInvariants();
}

TEST_CASE("with the gossip channel down each router goes on alone, and merges its peers' counts again once it is up") {
  // Two routers, each with requests in flight on worker "w" and listing the other. The outage
  // is one channel: both ends drop what they would send and what they read.
  auto faults = std::make_shared<GossipFaults>();
  GossipOptions a_options = Options();
  a_options.faults = faults;
  std::atomic<uint32_t> a_requests{3}, b_requests{2};
  PeerLoads a_peers(300 * kNsPerMs), b_peers(300 * kNsPerMs);
  auto a = Gossip::Start(a_options, Says(&a_requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a.ok());
  GossipOptions b_options = Options({(*a)->endpoint()});
  b_options.faults = faults;
  auto b = Gossip::Start(b_options, Says(&b_requests), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  // b's endpoint is known only now: a comes back on its own endpoint with b in its list.
  a_options.endpoint = (*a)->endpoint();
  a_options.peers = {(*b)->endpoint()};
  a->reset();  // its context ends with it: the port is free
  auto a_again = Gossip::Start(a_options, Says(&a_requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE_MESSAGE(a_again.ok(), a_again.status().ToString());
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 3 && a_peers.Load("w").requests == 2; }));

  faults->SetDown(true);
  // Within the ttl both forget the other: each routes on its own counts, as one router does.
  CHECK(WaitFor([&] { return a_peers.Peers() == 0 && b_peers.Peers() == 0; }));
  CHECK(a_peers.Load("w") == OwnLoadCounts{});
  CHECK(b_peers.WorkRate("m") == 0);
  a_requests = 4;  // what changes meanwhile is told once the channel is back
  const uint64_t applied = (*b)->applied();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ten intervals: nothing gets through
  CHECK((*b)->applied() == applied);
  CHECK(b_peers.Peers() == 0);

  faults->SetDown(false);
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 4 && a_peers.Load("w").requests == 2; }));
  CHECK(b_peers.WorkRate("m") == 250);
  CHECK(faults->dropped() > 0);
  a_peers.CheckInvariants();
  b_peers.CheckInvariants();
}

TEST_CASE("sent on change: a peer hears a change at once, not at the next heartbeat") {
  std::atomic<uint32_t> requests{0}, none{0};
  PeerLoads a_peers(30 * kNsPerSec), b_peers(30 * kNsPerSec);
  GossipOptions ao = Options();
  ao.interval = kLongInterval;
  auto a = Gossip::Start(ao, Says(&requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a.ok());
  GossipOptions bo = Options({(*a)->endpoint()});
  bo.interval = kLongInterval;
  auto b = Gossip::Start(bo, Says(&none), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  // a's first heartbeat went out before b subscribed: b hears a only by what a sends on change.
  REQUIRE(WaitFor([&] {
    (*a)->OwnStateChanged(false);
    return b_peers.Peers() == 1;
  }));
  requests = 3;
  (*a)->OwnStateChanged(false);  // a first token or an end: the gossip thread sends it
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 3; }));
  requests = 4;
  (*a)->OwnStateChanged(true);  // a decision: sent on this thread, or after the gap by the gossip thread
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 4; }));
  // A worker a has nothing on is left out of its message; the peer drops it with that message.
  requests = 0;
  (*a)->OwnStateChanged(false);
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 0; }));
  CHECK(b_peers.Peers() == 1);
  CHECK((*b)->applied() >= 4);
  b_peers.CheckInvariants();
}

TEST_CASE("a burst of changes within the gap goes out in at most two messages, the newest state last") {
  prometheus::Registry registry;
  std::atomic<uint32_t> requests{0}, none{0};
  PeerLoads a_peers(30 * kNsPerSec), b_peers(30 * kNsPerSec);
  GossipOptions ao = Options();
  ao.interval = kLongInterval;
  ao.min_gap = kNsPerSec;  // far longer than the burst takes
  auto a = Gossip::Start(ao, Says(&requests), &a_peers, SystemClock::Default(), &registry);
  REQUIRE(a.ok());
  GossipOptions bo = Options({(*a)->endpoint()});
  bo.interval = kLongInterval;
  auto b = Gossip::Start(bo, Says(&none), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  REQUIRE(WaitFor(
      [&] {
        (*a)->OwnStateChanged(false);
        return b_peers.Peers() == 1;
      },
      20000));
  const double sent = FramesSent(registry);
  const uint64_t applied = (*b)->applied();
  // Decisions, first tokens and ends: the first may go out at once, the others wait for the
  // gap's end and go out together.
  for (uint32_t i = 1; i <= 1000; ++i) {
    requests = i;
    (*a)->OwnStateChanged(i % 3 == 0);
  }
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 1000; }));
  CHECK(FramesSent(registry) - sent >= 1);
  CHECK(FramesSent(registry) - sent <= 2);
  CHECK((*b)->applied() - applied <= 2);
  CHECK(static_cast<double>((*a)->sent()) == FramesSent(registry));
}

TEST_CASE("a peer that sends on change and then goes quiet is forgotten at the ttl, and heard at its next change") {
  std::atomic<uint32_t> requests{2}, none{0};
  PeerLoads a_peers(300 * kNsPerMs), b_peers(300 * kNsPerMs);
  GossipOptions ao = Options();
  ao.interval = kLongInterval;  // a's heartbeat never comes within the test: a dead router's silence
  auto a = Gossip::Start(ao, Says(&requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a.ok());
  auto b = Gossip::Start(Options({(*a)->endpoint()}), Says(&none), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  REQUIRE(WaitFor([&] {
    (*a)->OwnStateChanged(false);
    return b_peers.Load("w").requests == 2;
  }));
  CHECK(WaitFor([&] { return b_peers.Peers() == 0; }));  // b expires it every 10 ms
  CHECK(b_peers.Load("w") == OwnLoadCounts{});
  requests = 5;
  (*a)->OwnStateChanged(true);
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 5; }));
  b_peers.CheckInvariants();
}

TEST_CASE("a router finds its peers through a DNS name and hears their counts, a restarted one's too") {
  std::atomic<uint32_t> requests{3}, none{0};
  PeerLoads a_peers(300 * kNsPerMs), b_peers(300 * kNsPerMs);
  auto a = Gossip::Start(Options(), Says(&requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a.ok());
  const std::string a_endpoint = (*a)->endpoint();  // tcp://127.0.0.1:PORT
  GossipOptions b_options = Options();
  b_options.peers_dns = a_endpoint.substr(std::string("tcp://").size());  // "127.0.0.1:PORT" answers a's address
  b_options.dns_interval = 50 * kNsPerMs;
  auto b = Gossip::Start(b_options, Says(&none), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 3; }));
  // a restarts on its address: the name still answers it, and b hears the new incarnation.
  (*a)->Stop();
  CHECK(WaitFor([&] { return b_peers.Peers() == 0; }));
  GossipOptions again = Options();
  again.endpoint = a_endpoint;
  requests = 7;
  auto a2 = Gossip::Start(again, Says(&requests), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(a2.ok());
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 7; }));
}

TEST_CASE("--debug-drop-gossip's outage: AT_S:FOR_S, the channel down from AT_S for FOR_S seconds") {
  auto outage = ParseGossipOutage("5:10");
  REQUIRE(outage.ok());
  CHECK(outage->after == 5 * kNsPerSec);
  CHECK(outage->length == 10 * kNsPerSec);
  const GossipFaults faults(100 + outage->after, outage->length);
  CHECK_FALSE(faults.Down(100));
  CHECK(faults.Down(100 + 5 * kNsPerSec));
  CHECK(faults.Down(100 + 15 * kNsPerSec - 1));
  CHECK_FALSE(faults.Down(100 + 15 * kNsPerSec));
  for (const char* bad : {"", "5", "5:", ":10", "5:0", "-1:10", "5:x", "5:10:1", "1e9:1"}) {
    const auto parsed = ParseGossipOutage(bad);
    CHECK_MESSAGE(!parsed.ok(), bad);
    if (!parsed.ok()) CHECK(parsed.status().message().find("--debug-drop-gossip") != std::string::npos);
  }
}

TEST_CASE("garbage, forged and stale gossip frames are refused and counted, never applied") {
  prometheus::Registry registry;
  PeerLoads peers(kNsPerSec);
  zmq::context_t ctx;
  zmq::socket_t forger(ctx, zmq::socket_type::pub);
  forger.set(zmq::sockopt::linger, 0);
  forger.bind("tcp://127.0.0.1:*");
  const std::string forger_endpoint = forger.get(zmq::sockopt::last_endpoint);
  std::atomic<uint32_t> none{0};
  auto b = Gossip::Start(Options({forger_endpoint}), Says(&none), &peers, SystemClock::Default(), &registry);
  REQUIRE(b.ok());
  // Sends `frame` until the counter of `reason` moves (the SUB may not have joined yet).
  auto refused_as = [&](const std::string& reason, const std::string& frame) {
    const double before = Refused(registry, reason);
    return WaitFor([&] {
      forger.send(zmq::buffer(frame), zmq::send_flags::dontwait);
      return Refused(registry, reason) > before;
    });
  };
  CHECK(refused_as("malformed", "definitely not a capnp message"));
  RouterGossip bad{"forger", 1, 1, {GossipWorker{"w", 1, 2, 0, 0}}, {}};  // more waiting than requests
  CHECK(refused_as("invalid", EncodeGossip(bad)));
  RouterGossip self{(*b)->router_id(), 1, 1, {GossipWorker{"w", 9, 0, 0, 0}}, {}};
  CHECK(refused_as("self", EncodeGossip(self)));
  CHECK(WaitFor([&] {
    forger.send(zmq::str_buffer("two"), zmq::send_flags::sndmore);
    forger.send(zmq::str_buffer("parts"), zmq::send_flags::dontwait);
    return Refused(registry, "multipart") > 0;
  }));
  // A well-formed message is applied once; the same seq again is stale.
  RouterGossip good{"peer", 7, 100, {GossipWorker{"w", 2, 0, 0, 0}}, {}};
  CHECK(WaitFor([&] {
    forger.send(zmq::buffer(EncodeGossip(good)), zmq::send_flags::dontwait);
    return peers.Load("w").requests == 2;
  }));
  CHECK(refused_as("stale", EncodeGossip(good)));
  CHECK(peers.Load("w").requests == 2);
  CHECK((*b)->applied() == 1);
  peers.CheckInvariants();
}

TEST_CASE("with the fleet's gossip key, holders share their counts and a subscriber without it is refused") {
  if (!CurveAvailable()) return;
  TempKeyPair fleet_key, other_key;
  prometheus::Registry registry;
  std::atomic<uint32_t> requests{4}, none{0};
  PeerLoads a_peers(kNsPerSec), b_peers(kNsPerSec), c_peers(kNsPerSec);
  GossipOptions ao = Options();
  ao.keypair_file = fleet_key.path;
  auto a = Gossip::Start(ao, Says(&requests), &a_peers, SystemClock::Default(), &registry);
  REQUIRE(a.ok());
  GossipOptions bo = Options({(*a)->endpoint()});
  bo.keypair_file = fleet_key.path;
  auto b = Gossip::Start(bo, Says(&none), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(b.ok());
  CHECK(WaitFor([&] { return b_peers.Load("w").requests == 4; }));
  // A router with another gossip key expects another server key: its handshake fails.
  GossipOptions co = Options({(*a)->endpoint()});
  co.keypair_file = other_key.path;
  auto c = Gossip::Start(co, Says(&none), &c_peers, SystemClock::Default(), nullptr);
  REQUIRE(c.ok());
  // A subscriber that knows the fleet's public key but holds another key pair: ZAP refuses it.
  zmq::context_t ctx;
  zmq::socket_t spy(ctx, zmq::socket_type::sub);
  spy.set(zmq::sockopt::linger, 0);
  spy.set(zmq::sockopt::subscribe, "");
  const CurveKeyPair fleet = LoadCurveKeyPair(fleet_key.path).value();
  REQUIRE(MakeCurveClient(spy, LoadCurveKeyPair(other_key.path).value(), fleet.public_key).ok());
  spy.connect((*a)->endpoint());
  CHECK(WaitFor([&] { return Refused(registry, "unauthenticated") > 0; }));
  zmq::message_t frame;
  CHECK(!spy.recv(frame, zmq::recv_flags::dontwait));
  CHECK(c_peers.Peers() == 0);
}

TEST_CASE("gossip without keys binds only loopback unless told the network is trusted") {
  PeerLoads peers(kNsPerSec);
  std::atomic<uint32_t> none{0};
  GossipOptions o = Options({"tcp://127.0.0.1:1"});
  o.endpoint = "tcp://0.0.0.0:*";
  auto refused = Gossip::Start(o, Says(&none), &peers, SystemClock::Default(), nullptr);
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  o.insecure = true;
  CHECK(Gossip::Start(o, Says(&none), &peers, SystemClock::Default(), nullptr).ok());
}

TEST_CASE("two routers sharing a worker: one's request in flight is load the other routes on") {
  FakeWorker worker;
  worker.set_mode(FakeWorker::Mode::kHang);  // the request stays in flight
  PeerLoads a_peers(30 * kNsPerSec), b_peers(30 * kNsPerSec);
  std::atomic<Gossip*> a_tells{nullptr};  // router a's gossip, told of each change of a's counts
  auto start_fleet = [&](PeerLoads* peers, bool tells) {
    FleetOptions o;
    o.registration_endpoint = "";
    o.static_workers = {worker.endpoint()};
    o.static_model = "m";
    o.peers = peers;
    if (tells) {
      o.on_own_load_change = [&a_tells](bool routed) {
        if (Gossip* g = a_tells.load()) g->OwnStateChanged(routed);
      };
    }
    return std::move(Fleet::Start(o, nullptr, SystemClock::Default(), nullptr)).value();
  };
  std::unique_ptr<Fleet> fleet_a = start_fleet(&a_peers, true), fleet_b = start_fleet(&b_peers, false);
  auto routable = [](const Fleet& fleet) {
    auto m = fleet.FindModel("m");
    return m && m->routable.size() == 1;
  };
  REQUIRE(WaitFor([&] { return routable(*fleet_a) && routable(*fleet_b); }));  // else the request fails at once
  auto source_of = [](const Fleet* fleet) {
    return [fleet](RouterGossip* out) {
      for (const auto& [name, own] : fleet->OwnLoadsByName()) out->workers.push_back(ToGossipWorker(name, own));
    };
  };
  // Heartbeats of 10 s: what b hears of a's request within the test, a sent on change.
  GossipOptions ao = Options();
  ao.interval = kLongInterval;
  auto gossip_a = Gossip::Start(ao, source_of(fleet_a.get()), &a_peers, SystemClock::Default(), nullptr);
  REQUIRE(gossip_a.ok());
  a_tells = gossip_a->get();
  GossipOptions bo = Options({(*gossip_a)->endpoint()});
  bo.interval = kLongInterval;
  auto gossip_b = Gossip::Start(bo, source_of(fleet_b.get()), &b_peers, SystemClock::Default(), nullptr);
  REQUIRE(gossip_b.ok());
  REQUIRE(WaitFor([&] {
    (*gossip_a)->OwnStateChanged(false);
    return b_peers.Peers() == 1;
  }));

  ForwardRequest r;
  r.worker = 0;
  r.params.tokens = std::vector<TokenId>(64, 7);
  r.params.sampling.max_tokens = 4;
  r.prefill_tokens = 64;
  struct Ignore final : ResponseSink {
    void OnDelta(WorkerId, const WorkerDelta&) override {}
    void OnError(WorkerId, const Status&, bool) override {}
  };
  r.sink = std::make_shared<Ignore>();
  const uint64_t handle = fleet_a->NewHandle();
  fleet_a->Submit(handle, std::move(r));
  CHECK(WaitFor([&] { return fleet_b->PeerLoad(0).requests == 1; }));
  CHECK(fleet_b->PeerLoad(0).prefill_tokens == 64);
  std::vector<WorkerLoads::LoadView> views;  // what routing reads, every candidate at once
  const WorkerId ids[] = {0};
  fleet_b->Loads(ids, &views);
  REQUIRE(views.size() == 1);
  CHECK(views[0].peers.requests == 1);
  CHECK(views[0].own.requests == 0);
  CHECK(fleet_b->OwnLoad(0).requests == 0);  // router b sent nothing itself
  CHECK(fleet_a->PeerLoad(0).requests == 0);  // a hears no one
  fleet_a->Cancel(handle);
  CHECK(WaitFor([&] { return fleet_b->PeerLoad(0).requests == 0; }));
  (*gossip_b)->Stop();
  (*gossip_a)->Stop();
  a_tells = nullptr;
  fleet_a->Stop();
  fleet_b->Stop();
}

}  // namespace kvfleet::router
