// The fleet at scale: frames beyond the registration limit never reach the router, a fleet
// bounded by max_workers refuses the rest cleanly instead of running out of sockets, and
// workers that left are forgotten with their sockets, so churn keeps the socket count flat.
#include <cstring>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <zmq.h>
#include <zmq.hpp>

#include "router/fleet/fleet.h"
#include "schema/limits.h"
#include "schema/registration.h"
#include "tests/router/fake_worker.h"

namespace kvfleet::router {

using testing::WaitFor;

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

bool Listed(const Fleet& fleet, const std::string& name) {
  for (const WorkerStatus& w : fleet.Workers()) {
    if (w.info.name == name) return true;
  }
  return false;
}

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
    huge.loras.push_back(LoraAnnounce{"a" + std::to_string(i), i + 1, 8, std::string(wire::limits::kMaxPathBytes, 'p')});
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

}  // namespace kvfleet::router
