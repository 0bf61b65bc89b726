// One simulated worker on loopback, seen from a router's side of Contracts 2 and 3: its
// Hello and Bye on a registration ROUTER, its batches on a SUB, a snapshot from its replay
// socket, and a Generate's stream from its requests socket.
#include "cli/simulate/sim_worker.h"

#include <doctest/doctest.h>

#include <chrono>
#include <iterator>

#include <zmq_addon.hpp>

#include "schema/requests.h"

namespace kvfleet::sim {
namespace {

class Harness {
 public:
  Harness() : registration_(ctx_, zmq::socket_type::router) {
    registration_.set(zmq::sockopt::linger, 0);
    registration_.bind("tcp://127.0.0.1:*");
    SimWorkerOptions o;
    o.name = "w0";
    o.router_endpoint = registration_.get(zmq::sockopt::last_endpoint);
    o.cache.capacity_blocks = 2000;
    o.events_per_s = 2000;
    o.tokens = 3;
    o.token_delay = 2 * kNsPerMs;
    auto w = SimWorker::Start(ctx_, o, Now(), &counters_);
    REQUIRE(w.ok());
    worker_ = std::move(*w);
  }

  // Drives the worker as its shard would, until `done` holds or 3 s pass.
  template <typename Done>
  bool Pump(Done done) {
    const TimeNs end = Now() + 3 * kNsPerSec;
    while (Now() < end) {
      worker_->RunDue(Now(), SystemClock::Default()->WallNs());
      zmq::pollitem_t items[] = {{worker_->replay_handle(), 0, ZMQ_POLLIN, 0},
                                 {worker_->requests_handle(), 0, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(1));
      if (items[0].revents & ZMQ_POLLIN) worker_->OnReplay();
      if (items[1].revents & ZMQ_POLLIN) worker_->OnRequests(Now());
      if (done()) return true;
    }
    return false;
  }

  // The next registration message, read while the worker runs.
  ToRouterMessage NextRegistration() {
    std::vector<zmq::message_t> parts;
    REQUIRE(Pump([&] { return static_cast<bool>(zmq::recv_multipart(registration_, std::back_inserter(parts),
                                                                      zmq::recv_flags::dontwait)); }));
    REQUIRE(parts.size() == 2);
    auto msg = DecodeToRouter(parts[1].data(), parts[1].size());
    REQUIRE(msg.ok());
    return *msg;
  }

  static TimeNs Now() { return SystemClock::Default()->Now(); }

  zmq::context_t ctx_{1};
  zmq::socket_t registration_;
  SimCounters counters_;
  std::unique_ptr<SimWorker> worker_;
};

TEST_CASE("a simulated worker registers, publishes batches and serves a snapshot of what it holds") {
  Harness h;
  const auto hello = std::get<WorkerHello>(h.NextRegistration());
  CHECK(hello.name == "w0");
  CHECK(hello.epoch == h.worker_->stream().epoch());
  CHECK(hello.device_blocks == 2000);

  zmq::socket_t sub(h.ctx_, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, "kv.");
  sub.connect(hello.events_endpoint);
  std::vector<zmq::message_t> batch;
  REQUIRE(h.Pump([&] { return static_cast<bool>(zmq::recv_multipart(sub, std::back_inserter(batch), zmq::recv_flags::dontwait)); }));
  REQUIRE(batch.size() == 2);
  CHECK(batch[0].to_string() == "kv.w0");
  auto decoded = events::DecodeBatch(batch[1].data(), batch[1].size());
  REQUIRE(decoded.ok());
  CHECK(decoded->header.worker_id == "w0");

  zmq::socket_t replay(h.ctx_, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::linger, 0);
  replay.connect(hello.replay_endpoint);
  const std::string request = events::EncodeReplayRequest({.epoch = 0, .from_seq = 0, .request_id = 9});
  replay.send(zmq::buffer(request), zmq::send_flags::none);
  size_t blocks = 0;
  bool last = false;
  uint64_t consistent_seq = 0;
  REQUIRE(h.Pump([&] {
    zmq::message_t m;
    if (!replay.recv(m, zmq::recv_flags::dontwait)) return false;
    auto reply = events::DecodeReplayReply(m.data(), m.size());
    REQUIRE(reply.ok());
    const auto& chunk = std::get<events::SnapshotChunk>(reply->body);
    blocks += events::BlockEventCount(chunk.events);
    consistent_seq = chunk.consistent_seq;
    last = reply->header.last;
    return last;
  }));
  // Filled at start: near its capacity, and never over it. Steps may have run since.
  CHECK(blocks > 1500);
  CHECK(blocks <= 2000);
  CHECK(consistent_seq >= 1);
  CHECK(consistent_seq <= h.worker_->stream().last_seq());
  CHECK(h.counters_.snapshots == 1);
}

TEST_CASE("a simulated worker streams tokens for a Generate and, once leaving, says Bye and refuses the next") {
  Harness h;
  const auto hello = std::get<WorkerHello>(h.NextRegistration());
  zmq::socket_t dealer(h.ctx_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(hello.requests_endpoint);
  GenerateParams params;
  params.tokens = {1, 2, 3, 4};
  params.sampling.max_tokens = 3;
  dealer.send(zmq::buffer(EncodeGenerate(5, params)), zmq::send_flags::none);
  std::vector<WorkerDelta> deltas;
  REQUIRE(h.Pump([&] {
    zmq::message_t m;
    if (!dealer.recv(m, zmq::recv_flags::dontwait)) return false;
    auto msg = DecodeFromWorker(m.data(), m.size());
    REQUIRE(msg.ok());
    deltas.push_back(std::get<WorkerDelta>(*msg));
    return deltas.back().finish != FinishReason::kNone;
  }));
  REQUIRE(deltas.size() == 3);
  CHECK(deltas.back().finish == FinishReason::kLength);
  CHECK(deltas.back().usage.completion_tokens == 3);
  CHECK(deltas.back().usage.prompt_tokens == 4);

  h.worker_->BeginLeave(Harness::Now());
  CHECK(h.worker_->Gone(Harness::Now()));  // nothing in flight
  const auto bye = std::get<WorkerBye>(h.NextRegistration());
  CHECK(bye.name == "w0");
  CHECK(bye.epoch == hello.epoch);
  dealer.send(zmq::buffer(EncodeGenerate(6, params)), zmq::send_flags::none);
  REQUIRE(h.Pump([&] {
    zmq::message_t m;
    if (!dealer.recv(m, zmq::recv_flags::dontwait)) return false;
    auto msg = DecodeFromWorker(m.data(), m.size());
    REQUIRE(msg.ok());
    CHECK(std::get<WorkerError>(*msg).code == WorkerErrorCode::kShuttingDown);
    return true;
  }));
}

}  // namespace
}  // namespace kvfleet::sim
