// KV transfer between two in-process cpu workers (Contract 4 end to end): a Generate whose
// PullHint names the worker that computed its prefix pulls the blocks and gives the tokens a
// computed prefix gives; a hint whose holder has nothing, or is gone, costs a recompute,
// never the request.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

#include <capnp/message.h>

#include "schema/requests.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "tests/common/http/test_client.h"
#include "tests/worker/model/test_models.h"
#include "worker/server/worker.h"

namespace kvfleet::server {
namespace {

struct Answer {
  std::vector<TokenId> tokens;
  uint32_t cached_device_tokens = 0;
  bool finished = false;
};

std::string Generate(uint64_t id, const std::vector<TokenId>& prompt, const PullHint& hint) {
  capnp::MallocMessageBuilder msg;
  auto g = msg.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(id);
  auto t = g.initTokens(static_cast<unsigned>(prompt.size()));
  for (size_t i = 0; i < prompt.size(); ++i) t.set(static_cast<unsigned>(i), prompt[i]);
  g.getSampling().setTemperature(0);
  g.getSampling().setMaxTokens(8);
  g.getSampling().setIgnoreEos(true);
  if (!hint.source.empty()) {
    auto h = g.initPull();
    h.setSource(hint.source);
    h.setBlocks(hint.blocks);
    h.setWorkerId(hint.worker_id);
  }
  return wire::Encode(msg);
}

// Sends each (prompt, hint) as request 1, 2, ... on one connection, in order, and collects
// the answers.
std::vector<Answer> AskAll(zmq::context_t& context, const std::string& endpoint,
                           const std::vector<std::pair<std::vector<TokenId>, PullHint>>& asks) {
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  for (size_t i = 0; i < asks.size(); ++i) {
    s.send(zmq::buffer(Generate(i + 1, asks[i].first, asks[i].second)), zmq::send_flags::none);
  }
  std::vector<Answer> answers(asks.size());
  size_t finished = 0;
  while (finished < asks.size()) {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(60'000)) != 1) break;
    zmq::message_t m;
    (void)s.recv(m, zmq::recv_flags::none);
    auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
    REQUIRE(d.ok());
    auto root = (*d)->Root<schema::FromWorker>();
    REQUIRE_MESSAGE(root.isDelta(), "the worker answered an error");
    auto delta = root.getDelta();
    REQUIRE((delta.getRequestId() >= 1 && delta.getRequestId() <= asks.size()));
    Answer& a = answers[delta.getRequestId() - 1];
    for (auto t : delta.getTokens()) a.tokens.push_back(t);
    if (delta.getFinishReason() != schema::FinishReason::NONE) {
      a.finished = true;
      a.cached_device_tokens = delta.getUsage().getCachedDeviceTokens();
      ++finished;
    }
  }
  return answers;
}

Answer Ask(zmq::context_t& context, const std::string& endpoint, const std::vector<TokenId>& prompt,
           const PullHint& hint = {}) {
  return AskAll(context, endpoint, {{prompt, hint}})[0];
}

WorkerConfig CpuConfig(const std::string& model_dir) {
  WorkerConfig c;
  c.backend = "cpu";
  c.model_dir = model_dir;
  c.requests = c.events = c.replay = "tcp://127.0.0.1:0";
  c.http_port = 0;
  c.http_host = "127.0.0.1";
  c.advertise_host = "127.0.0.1";
  c.block_size = 16;
  c.max_num_tokens = 256;
  c.max_batch_size = 4;
  c.max_context = 512;
  c.kv_cache_bytes = 8u << 20;
  c.transfer_deadline_ms = 2'000;
  c.shutdown_grace_s = 1;
  return c;
}

struct RunningWorker {
  RunningWorker(const WorkerConfig& config, zmq::context_t& context) {
    auto started = Worker::Start(config, context);
    REQUIRE_MESSAGE(started.ok(), started.status().ToString());
    worker = std::move(*started);
    thread = std::thread([this] { worker->Run(); });
  }
  ~RunningWorker() {
    worker->RequestStop();
    thread.join();
  }
  std::unique_ptr<Worker> worker;
  std::thread thread;
};

TEST_CASE("a worker pulls a prompt's prefix from the worker that computed it, and answers as if it had computed it") {
  zmq::context_t context;
  const std::string model = testing::RandomModelDir("tiny", 1);
  RunningWorker a(CpuConfig(model), context);
  RunningWorker b(CpuConfig(model), context);
  REQUIRE_FALSE(a.worker->transfer_endpoint().empty());
  std::vector<TokenId> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(1000 + 7 * i);

  const Answer computed = Ask(context, a.worker->requests_endpoint(), prompt);
  REQUIRE(computed.finished);
  REQUIRE(computed.tokens.size() == 8);
  const PullHint from_a{a.worker->transfer_endpoint(), "", 6, a.worker->worker_id()};

  SUBCASE("pulled: 6 blocks reused, the same greedy tokens") {
    const Answer pulled = Ask(context, b.worker->requests_endpoint(), prompt, from_a);
    REQUIRE(pulled.finished);
    CHECK(pulled.cached_device_tokens == 96);
    CHECK(pulled.tokens == computed.tokens);
    // The pulled blocks are b's own now: the next request reuses them with no hint.
    const Answer again = Ask(context, b.worker->requests_endpoint(), prompt);
    CHECK(again.cached_device_tokens == 96);
    CHECK(again.tokens == computed.tokens);
    // The pull is on b's /metrics (refreshed every 250 ms while idle), the serve on a's.
    std::string metrics;
    for (int i = 0; i < 100 && metrics.find("kvfleet_worker_kv_imported_blocks_total 6") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      metrics = http::testing::BodyOf(http::testing::Roundtrip(b.worker->http_port(), "GET", "/metrics"));
    }
    CHECK(metrics.find("kvfleet_worker_kv_imported_blocks_total 6") != std::string::npos);
    CHECK(metrics.find("kvfleet_worker_kv_pulls_total{outcome=\"ok\",source=\"" + a.worker->transfer_endpoint()) !=
          std::string::npos);
  }
  SUBCASE("a request arriving while its prefix is being pulled waits for that pull") {
    std::vector<TokenId> longer = prompt;
    longer.push_back(77);
    // One connection: the hinted request reaches b first and starts the pull; the second,
    // right behind it, finds the pull in flight.
    const std::vector<Answer> got = AskAll(context, b.worker->requests_endpoint(), {{prompt, from_a}, {longer, {}}});
    CHECK(got[0].cached_device_tokens == 96);
    const Answer& second = got[1];
    CHECK(second.cached_device_tokens == 96);
    CHECK(second.finished);
  }
  SUBCASE("a holder without the prefix: b computes it") {
    std::vector<TokenId> other = prompt;
    other[3] = 5;
    const Answer plain = Ask(context, a.worker->requests_endpoint(), std::vector<TokenId>(other.begin(), other.begin() + 2));
    (void)plain;
    const Answer got = Ask(context, b.worker->requests_endpoint(), other, from_a);
    REQUIRE(got.finished);
    CHECK(got.cached_device_tokens == 0);
    CHECK(got.tokens.size() == 8);
  }
  SUBCASE("a holder that is gone: b computes once the pull's deadline passes") {
    const PullHint gone{"tcp://127.0.0.1:1", "", 6, "gone"};
    const Answer got = Ask(context, b.worker->requests_endpoint(), prompt, gone);
    REQUIRE(got.finished);
    CHECK(got.cached_device_tokens == 0);
    CHECK(got.tokens == computed.tokens);
  }
}

}  // namespace
}  // namespace kvfleet::server
