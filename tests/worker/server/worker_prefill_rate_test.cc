// What a worker announces about its compute in its Hello: the prefill rate (measured at
// start-up on the cpu backend, without leaving a trace in its KV cache, or --prefill-rate)
// and the device it shares with other workers (deviceId).
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include <zmq.hpp>

#include "schema/describe.h"
#include "tests/worker/model/test_models.h"
#include "tests/worker/server/in_process_worker.h"
#include "worker/engine/prefill_calibration.h"
#include "worker/model/model_config.h"

namespace kvfleet::server {
namespace {

using testing::Answer;
using testing::Ask;
using testing::RunningWorker;

WorkerHello DescribeOf(zmq::context_t& context, const std::string& endpoint) {
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  const std::string ask = EncodeDescribe();
  s.send(zmq::buffer(ask), zmq::send_flags::none);
  zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(10'000)) == 1);
  zmq::message_t m;
  REQUIRE(s.recv(m, zmq::recv_flags::none));
  auto hello = DecodeDescribed(m.data(), m.size());
  REQUIRE_MESSAGE(hello.ok(), hello.status().ToString());
  return *hello;
}

TEST_CASE("a cpu worker announces the prefill rate it measured at start-up, and its cache starts empty") {
  zmq::context_t context;
  const std::string model = kvfleet::testing::RandomModelDir("tiny", 1);
  RunningWorker measured(testing::InProcessConfig("cpu", model), context);
  WorkerConfig given_config = testing::InProcessConfig("cpu", model);
  given_config.prefill_rate = 1'234;  // --prefill-rate: no calibration
  RunningWorker given(given_config, context);

  const WorkerHello a = DescribeOf(context, measured.worker->requests_endpoint());
  const WorkerHello b = DescribeOf(context, given.worker->requests_endpoint());
  CHECK(a.prefill_tokens_per_second > 0);  // before: 0, and a cold router guessed 8,000
  CHECK(b.prefill_tokens_per_second == 1'234);
  // Both compute on this host's cores: one device.
  CHECK(a.device_id.ends_with("/cpu"));
  CHECK(a.device_id == b.device_id);

  // The calibration's prompt left nothing in the reuse tree: sent as a request it is computed
  // whole, and gives the tokens of the worker that never ran it.
  auto shape = model::LoadModelConfig(model);
  REQUIRE(shape.ok());
  const std::vector<TokenId> prompt = engine::CalibrationTokens(engine::config::kCalibrationFirstTokens, shape->vocab_size);
  const Answer first = Ask(context, measured.worker->requests_endpoint(), prompt);
  const Answer reference = Ask(context, given.worker->requests_endpoint(), prompt);
  REQUIRE((first.finished && reference.finished));
  CHECK(first.cached_device_tokens == 0);
  CHECK(first.tokens == reference.tokens);
  // The same prompt again is a hit: the check above could see one.
  const Answer again = Ask(context, measured.worker->requests_endpoint(), prompt);
  CHECK(again.cached_device_tokens > 0);
  CHECK(again.tokens == reference.tokens);
}

TEST_CASE("--device-id names the device a mock worker shares; by default a mock shares none") {
  zmq::context_t context;
  WorkerConfig config = testing::InProcessConfig("mock", "");
  config.mock_cost.step_base_us = 100;
  config.mock_cost.prefill_token_us = 1;
  config.mock_cost.kv_token_read_us = 0;
  config.kv_cache_bytes = 64ull * 2 * 1024 * 1024;  // 64 blocks of the mock's Llama shape
  RunningWorker alone(config, context);
  config.device_id = "gpu-7";
  RunningWorker shared(config, context);
  CHECK(DescribeOf(context, alone.worker->requests_endpoint()).device_id.empty());
  const WorkerHello hello = DescribeOf(context, shared.worker->requests_endpoint());
  CHECK(hello.device_id == "gpu-7");
  // The mock announces its cost model's rate, no measurement: 256 tokens in 356 µs.
  CHECK(hello.prefill_tokens_per_second == doctest::Approx(256 / 356e-6).epsilon(1e-4));
}

}  // namespace
}  // namespace kvfleet::server
