// RequestServer: what a router sees of the worker's own time to first token.
#include "worker/server/request_server.h"

#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>
#include <capnp/message.h>
#include <zmq.hpp>

#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet::server {
namespace {

// Each reading is 1 ms after the one before, whichever thread reads it: a hand-off between
// two readings always shows up as elapsed time.
class SteppingClock final : public Clock {
 public:
  TimeNs Now() const override { return now_.fetch_add(kNsPerMs) + kNsPerMs; }
  TimeNs WallNs() const override { return Now(); }

 private:
  mutable std::atomic<TimeNs> now_{0};
};

std::string GenerateFrame(uint64_t request_id) {
  capnp::MallocMessageBuilder message;
  auto g = message.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(request_id);
  auto tokens = g.initTokens(3);
  for (uint32_t i = 0; i < 3; ++i) tokens.set(i, 10 + i);
  g.initSampling().setMaxTokens(4);
  return wire::Encode(message);
}

struct SentDelta {
  uint64_t request_id = 0;
  size_t tokens = 0;
  uint64_t ttft_us = 0;
};

SentDelta Receive(zmq::socket_t& dealer) {
  zmq::message_t frame;
  REQUIRE(dealer.recv(frame, zmq::recv_flags::none));
  auto decoded = wire::Decode<schema::FromWorker>(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  auto root = (*decoded)->Root<schema::FromWorker>();
  REQUIRE(root.isDelta());
  auto d = root.getDelta();
  return SentDelta{d.getRequestId(), d.getTokens().size(), d.getUsage().getTimeToFirstTokenUs()};
}

engine::RequestOutput Output(size_t tokens, DurationNs engine_ttft, engine::FinishReason finish) {
  engine::RequestOutput out;
  out.new_tokens.assign(tokens, 42);
  out.usage.time_to_first_token = engine_ttft;
  out.finish = finish;
  return out;
}

// A request server on a loopback port and a router's DEALER connected to it.
struct Connected {
  explicit Connected(RequestServerOptions options = {}) {
    options.endpoint = "tcp://127.0.0.1:0";
    auto started = RequestServer::Start(context, options, &clock);
    REQUIRE(started.ok());
    server = std::move(*started);
    dealer.set(zmq::sockopt::routing_id, "router-a");
    dealer.set(zmq::sockopt::rcvtimeo, 5000);
    dealer.connect(server->bound_endpoint());
  }
  void Send(const std::string& frame) { dealer.send(zmq::buffer(frame), zmq::send_flags::none); }

  zmq::context_t context;
  SteppingClock clock;
  std::unique_ptr<RequestServer> server;
  zmq::socket_t dealer{context, zmq::socket_type::dealer};
};

TEST_CASE("the reported time to first token runs until the first token leaves the worker") {
  RequestServerOptions options;
  std::mutex reported_mu;
  std::vector<DurationNs> reported;  // GUARDED_BY(reported_mu): what on_first_token got
  options.on_first_token = [&](DurationNs ttft) {
    std::lock_guard<std::mutex> lock(reported_mu);
    reported.push_back(ttft);
  };
  Connected c(options);
  zmq::socket_t& dealer = c.dealer;
  RequestServer* server = c.server.get();

  for (uint64_t id : {7, 8}) {
    const std::string frame = GenerateFrame(id);
    dealer.send(zmq::buffer(frame), zmq::send_flags::none);
  }
  std::vector<GenerateCommand> got;
  for (int i = 0; i < 100 && got.size() < 2; ++i) {
    for (auto& c : server->Take(100 * kNsPerMs)) got.push_back(std::get<GenerateCommand>(std::move(c)));
  }
  REQUIRE(got.size() == 2);
  const ClientKey a = got[0].key, b = got[1].key;
  CHECK(a.identity == "router-a");

  const DurationNs engine_ttft = 20 * kNsPerMs;
  const uint64_t engine_us = engine_ttft / kNsPerUs;
  // Request a: a Delta before any token, the first token, one more, the last.
  server->SendOutput(a, Output(0, 0, engine::FinishReason::kNone));
  SentDelta none = Receive(dealer);
  CHECK(none.ttft_us == 0);
  server->SendOutput(a, Output(1, engine_ttft, engine::FinishReason::kNone));
  SentDelta first = Receive(dealer);
  CHECK(first.tokens == 1);
  // The outbox wait (at least one clock step) is counted, on top of the engine's figure.
  CHECK(first.ttft_us >= engine_us + 1000);
  server->SendOutput(a, Output(1, engine_ttft, engine::FinishReason::kNone));
  CHECK(Receive(dealer).ttft_us == first.ttft_us);
  server->SendOutput(a, Output(1, engine_ttft, engine::FinishReason::kLength));
  CHECK(Receive(dealer).ttft_us == first.ttft_us);

  // Request b: its first token comes in its last Delta; nothing of a's is carried over.
  server->SendOutput(b, Output(2, 3 * kNsPerMs, engine::FinishReason::kStop));
  SentDelta only = Receive(dealer);
  CHECK(only.request_id == 8);
  CHECK(only.ttft_us >= 3000 + 1000);
  CHECK(only.ttft_us < first.ttft_us);
  server->Stop();
  // The metric hook saw each request once, with the figure its Deltas carried.
  std::lock_guard<std::mutex> lock(reported_mu);
  REQUIRE(reported.size() == 2);
  CHECK(static_cast<uint64_t>(reported[0] / kNsPerUs) == first.ttft_us);
  CHECK(static_cast<uint64_t>(reported[1] / kNsPerUs) == only.ttft_us);
}

std::string LoraFrame(uint64_t request_id, const std::string& name, const char* path) {
  return path != nullptr ? EncodeLoadLora(request_id, LoraControl{name, path}) : EncodeUnloadLora(request_id, name);
}

WorkerLoraResult ReceiveLoraResult(zmq::socket_t& dealer) {
  zmq::message_t frame;
  REQUIRE(dealer.recv(frame, zmq::recv_flags::none));
  auto decoded = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  REQUIRE(std::holds_alternative<WorkerLoraResult>(*decoded));
  return std::get<WorkerLoraResult>(*decoded);
}

TEST_CASE("LoadLora reads the adapter on the loader thread while requests keep flowing; results go back as LoraResult") {
  Connected c;
  zmq::socket_t& dealer = c.dealer;
  RequestServer* server = c.server.get();
  auto take = [&](size_t n) {
    std::vector<Command> got;
    for (int i = 0; i < 100 && got.size() < n; ++i) {
      for (auto& c : server->Take(100 * kNsPerMs)) got.push_back(std::move(c));
    }
    REQUIRE(got.size() == n);
    return got;
  };

  // Before the worker sets a loader (it is starting), LoadLora is refused.
  std::string frame = LoraFrame(1, "sql", "/adapters/sql");
  dealer.send(zmq::buffer(frame), zmq::send_flags::none);
  auto early = take(1);
  auto& refused = std::get<LoadLoraCommand>(early[0]);
  CHECK(refused.adapter == nullptr);
  CHECK(refused.status.message().find("starting") != std::string::npos);

  // A slow read does not hold up the socket: a Generate sent after it arrives first.
  std::mutex gate;
  gate.lock();
  server->SetLoraLoader([&](const std::string& name, const std::string& path)
                               -> Result<std::shared_ptr<const model::LoraAdapter>> {
    std::lock_guard<std::mutex> wait(gate);
    auto a = std::make_shared<model::LoraAdapter>();
    a->name = name;
    a->path = path;
    return std::shared_ptr<const model::LoraAdapter>(std::move(a));
  });
  frame = LoraFrame(2, "sql", "/adapters/sql");
  dealer.send(zmq::buffer(frame), zmq::send_flags::none);
  frame = GenerateFrame(3);
  dealer.send(zmq::buffer(frame), zmq::send_flags::none);
  auto during = take(1);
  CHECK(std::holds_alternative<GenerateCommand>(during[0]));
  gate.unlock();
  auto loaded = take(1);
  auto& load = std::get<LoadLoraCommand>(loaded[0]);
  CHECK(load.key.request_id == 2);
  REQUIRE(load.adapter != nullptr);
  CHECK(load.adapter->path == "/adapters/sql");

  frame = LoraFrame(4, "sql", nullptr);
  dealer.send(zmq::buffer(frame), zmq::send_flags::none);
  auto unload = take(1);
  CHECK(std::get<UnloadLoraCommand>(unload[0]).name == "sql");

  server->SendLoraResult(load.key, Status::Ok());
  WorkerLoraResult ok = ReceiveLoraResult(dealer);
  CHECK(ok.request_id == 2);
  CHECK(ok.ok);
  server->SendLoraResult(std::get<UnloadLoraCommand>(unload[0]).key, FailedPrecondition("in use by 2"));
  WorkerLoraResult busy = ReceiveLoraResult(dealer);
  CHECK(busy.request_id == 4);
  CHECK_FALSE(busy.ok);
  CHECK(busy.code == WorkerErrorCode::kInvalidRequest);
  CHECK(busy.message == "in use by 2");
  server->Stop();
}

TEST_CASE("a Generate frame that does not decode is answered with an error, not left to time out") {
  Connected c;
  zmq::socket_t& dealer = c.dealer;
  RequestServer* server = c.server.get();
  // 301 logit biases: one past Contract 3's bound, refused before they are read.
  capnp::MallocMessageBuilder message;
  auto g = message.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(77);
  g.initTokens(1).set(0, 5);
  g.initSampling().initLogitBias(sampling::config::kMaxLogitBias + 1);
  const std::string bad = wire::Encode(message);
  dealer.send(zmq::buffer(bad), zmq::send_flags::none);
  zmq::message_t reply;
  REQUIRE(dealer.recv(reply, zmq::recv_flags::none));
  auto answer = DecodeFromWorker(reply.data(), reply.size());
  REQUIRE(answer.ok());
  const auto* error = std::get_if<WorkerError>(&*answer);
  REQUIRE(error != nullptr);
  CHECK(error->request_id == 77);
  CHECK(error->code == WorkerErrorCode::kInvalidRequest);
  CHECK(error->message.find("logit bias") != std::string::npos);
  CHECK(server->malformed_frames() == 1);
  // Garbage with no readable id is only counted.
  dealer.send(zmq::str_buffer("not a frame"), zmq::send_flags::none);
  for (int i = 0; i < 100 && server->malformed_frames() < 2; ++i) (void)server->Take(10 * kNsPerMs);
  CHECK(server->malformed_frames() == 2);
  server->Stop();
}

}  // namespace
}  // namespace kvfleet::server
