// KV transfer between two in-process cpu workers (Contract 4 end to end): a Generate whose
// PullHint names the worker that computed its prefix pulls the blocks and gives the tokens a
// computed prefix gives; a hint whose holder has nothing, sends blocks that fail their
// checksums, or is gone, costs a recompute, never the request.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "tests/common/http/test_client.h"
#include "tests/worker/model/test_models.h"
#include "tests/worker/server/in_process_worker.h"

namespace kvfleet::server {
namespace {

using testing::Answer;
using testing::Ask;
using testing::AskAll;
using testing::RunningWorker;

WorkerConfig CpuConfig(const std::string& model_dir) {
  WorkerConfig c = testing::InProcessConfig("cpu", model_dir);
  c.transfer_deadline_ms = 2'000;
  return c;
}

TEST_CASE("a worker pulls a prompt's prefix from the worker that computed it, and answers as if it had computed it") {
  zmq::context_t context;
  const std::string model = kvfleet::testing::RandomModelDir("tiny", 1);
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
  SUBCASE("a holder whose blocks fail their checksums: b computes, nothing of the pull is kept") {
    WorkerConfig bad_config = CpuConfig(model);
    bad_config.test_corrupt_served_blocks = true;
    RunningWorker bad(bad_config, context);
    REQUIRE(Ask(context, bad.worker->requests_endpoint(), prompt).finished);
    const PullHint from_bad{bad.worker->transfer_endpoint(), "", 6, bad.worker->worker_id()};
    const Answer got = Ask(context, b.worker->requests_endpoint(), prompt, from_bad);
    REQUIRE(got.finished);
    CHECK(got.cached_device_tokens == 0);
    CHECK(got.tokens == computed.tokens);
    const std::string counted = "kvfleet_worker_kv_pulls_total{outcome=\"bad-checksum\"";
    std::string metrics;
    for (int i = 0; i < 100 && metrics.find(counted) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      metrics = http::testing::BodyOf(http::testing::Roundtrip(b.worker->http_port(), "GET", "/metrics"));
    }
    CHECK(metrics.find(counted) != std::string::npos);
    // No block imported: the counter is absent (never advanced) or 0.
    const size_t imported = metrics.find("kvfleet_worker_kv_imported_blocks_total ");
    if (imported != std::string::npos) CHECK(metrics.compare(imported + 40, 2, "0\n") == 0);
  }
  SUBCASE("a holder that is gone: b computes once the pull's deadline passes") {
    const PullHint gone{"tcp://127.0.0.1:1", "", 6, "gone"};
    const Answer got = Ask(context, b.worker->requests_endpoint(), prompt, gone);
    REQUIRE(got.finished);
    CHECK(got.cached_device_tokens == 0);
    CHECK(got.tokens == computed.tokens);
  }
}

// Waits (5 s at most) for `needle` on the worker's /metrics, refreshed every 250 ms while idle.
bool MetricsShow(const RunningWorker& w, const std::string& needle) {
  std::string metrics;
  for (int i = 0; i < 100 && metrics.find(needle) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    metrics = http::testing::BodyOf(http::testing::Roundtrip(w.worker->http_port(), "GET", "/metrics"));
  }
  return metrics.find(needle) != std::string::npos;
}

TEST_CASE("a pulled prefix is the first to go when the receiver needs room, before its own older blocks") {
  // b's cache holds 16 blocks. It computes x (6 blocks of its own), then pulls p (6 blocks,
  // a second copy of a's), then computes y (7 blocks): room for y is made from p, not from x,
  // although x is older.
  zmq::context_t context;
  const std::string model = kvfleet::testing::RandomModelDir("tiny", 1);
  RunningWorker a(CpuConfig(model), context);
  WorkerConfig small = CpuConfig(model);
  small.kv_cache_bytes = 16 * 8192;  // 16 blocks of 16 tokens (fp32, 2 layers, 2 KV heads of 32)
  small.max_context = 256;
  RunningWorker b(small, context);
  auto prompt_of = [](TokenId base) {
    std::vector<TokenId> t(100);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<TokenId>(base + 5 * i);
    return t;
  };
  const std::vector<TokenId> x = prompt_of(3000), p = prompt_of(4000), y = prompt_of(5000);
  REQUIRE(Ask(context, a.worker->requests_endpoint(), p).finished);
  REQUIRE(Ask(context, b.worker->requests_endpoint(), x).finished);
  const PullHint from_a{a.worker->transfer_endpoint(), "", 6, a.worker->worker_id()};
  const Answer pulled = Ask(context, b.worker->requests_endpoint(), p, from_a);
  REQUIRE(pulled.finished);
  REQUIRE(pulled.cached_device_tokens == 96);
  REQUIRE(Ask(context, b.worker->requests_endpoint(), y).finished);
  const Answer again = Ask(context, b.worker->requests_endpoint(), x);
  CHECK(again.cached_device_tokens == 96);  // x whole: the pulled copy made the room
  CHECK(MetricsShow(b, "kvfleet_worker_evictions_total{priority=\"34\"}"));
}

TEST_CASE("a holder still computing the prefix answers a pull once the blocks are stored, or at half its deadline") {
  // a is made to compute the prefix late: its own request waits for a pull from a holder that
  // is gone (a's transfer deadline), meanwhile registering the prefix as a live sequence. b's
  // pull from a arrives in that window.
  zmq::context_t context;
  const std::string model = kvfleet::testing::RandomModelDir("tiny", 1);
  std::vector<TokenId> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(2000 + 3 * i);
  const PullHint gone{"tcp://127.0.0.1:1", "", 6, "gone"};
  WorkerConfig b_config = CpuConfig(model);
  b_config.transfer_deadline_ms = 10'000;
  RunningWorker b(b_config, context);

  auto race = [&](const RunningWorker& a, uint32_t b_deadline_ms) {
    Answer on_a;
    std::thread asker([&] { on_a = Ask(context, a.worker->requests_endpoint(), prompt, gone); });
    // a has started its own pull, and holds its request for it.
    REQUIRE(MetricsShow(a, "kvfleet_worker_kv_pulls_in_flight 1\n"));
    CHECK(MetricsShow(a, "kvfleet_worker_kv_pull_held_requests 1\n"));
    const PullHint from_a{a.worker->transfer_endpoint(), "", 6, a.worker->worker_id(), b_deadline_ms};
    const Answer on_b = Ask(context, b.worker->requests_endpoint(), prompt, from_a);
    asker.join();
    REQUIRE(on_a.finished);
    REQUIRE(on_b.finished);
    CHECK(on_a.cached_device_tokens == 0);
    CHECK(on_b.tokens == on_a.tokens);
    CHECK(MetricsShow(a, "kvfleet_worker_kv_pulls_in_flight 0\n"));
    CHECK(MetricsShow(a, "kvfleet_worker_kv_pull_held_requests 0\n"));
    return on_b;
  };
  SUBCASE("stored within the pull's deadline: served then") {
    WorkerConfig a_config = CpuConfig(model);
    a_config.transfer_deadline_ms = 1'500;
    RunningWorker a(a_config, context);
    const Answer on_b = race(a, 8'000);
    CHECK(on_b.cached_device_tokens == 96);  // pulled, not recomputed
    CHECK(MetricsShow(a, "kvfleet_worker_kv_serve_waits_total{ended=\"stored\"} 1"));
  }
  SUBCASE("not stored by half the pull's deadline: b computes the prefix") {
    WorkerConfig a_config = CpuConfig(model);
    a_config.transfer_deadline_ms = 3'000;
    RunningWorker a(a_config, context);
    const Answer on_b = race(a, 1'000);
    CHECK(on_b.cached_device_tokens == 0);
    CHECK(MetricsShow(a, "kvfleet_worker_kv_serve_waits_total{ended=\"half_deadline\"} 1"));
  }
}

}  // namespace
}  // namespace kvfleet::server
