// kvfleet-worker processes with the cpu backend: --lora adapters served beside the base
// model and loaded and unloaded at run time, --tensor-parallel 2, and the flags and adapters
// either refuses at start-up.
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <zmq.hpp>

#include "common/block_hash.h"
#include "schema/event_codec.h"
#include "schema/registration.h"
#include "tests/worker/model/test_models.h"
#include "tests/worker/server/worker_process.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"

namespace {

using kvfleet::testing::Client;
using kvfleet::testing::FreePort;
using kvfleet::testing::HttpGet;
using kvfleet::testing::Prompt;
using kvfleet::testing::Reply;
using kvfleet::testing::RunRefused;
using kvfleet::testing::TinyCpuBlockBytes;
using kvfleet::testing::WorkerProcess;

std::string WriteAdapter(const std::string& model_dir, const std::string& name, uint64_t seed) {
  const std::string dir = "/tmp/kvfleet-lora-process-test-" + std::to_string(getpid()) + "/" + name;
  auto config = kvfleet::model::LoadModelConfig(model_dir);
  REQUIRE(config.ok());
  kvfleet::model::RandomLoraOptions o;
  o.rank = 8;
  o.seed = seed;
  o.base_model = model_dir.substr(model_dir.rfind('/') + 1);
  REQUIRE(kvfleet::model::WriteRandomLoraAdapter(dir, *config, o).ok());
  return dir;
}

// The Hellos a worker sends to --router, read by a ROUTER socket of the test.
struct FakeRouter {
  FakeRouter() : socket(context, zmq::socket_type::router) {
    socket.set(zmq::sockopt::linger, 0);
    port = FreePort();
    socket.bind("tcp://127.0.0.1:" + std::to_string(port));
  }
  // The next Hello for which `want` holds, within 10 s.
  kvfleet::WorkerHello HelloWhere(const std::function<bool(const kvfleet::WorkerHello&)>& want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(200)) != 1) continue;
      zmq::message_t identity, frame;
      REQUIRE(socket.recv(identity, zmq::recv_flags::none));
      REQUIRE(socket.recv(frame, zmq::recv_flags::none));
      auto msg = kvfleet::DecodeToRouter(frame.data(), frame.size());
      REQUIRE(msg.ok());
      if (auto* hello = std::get_if<kvfleet::WorkerHello>(&*msg); hello && want(*hello)) return *hello;
    }
    FAIL("no such Hello");
    return {};
  }
  zmq::context_t context;
  zmq::socket_t socket;
  int port = 0;
};

TEST_CASE("a cpu worker with --lora serves the adapter beside the base model, loads and unloads adapters at run time") {
  const std::string model = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  const std::string sql = WriteAdapter(model, "sql", 1), chat = WriteAdapter(model, "chat", 2);
  FakeRouter router;
  WorkerProcess worker({"--backend", "cpu", "--model-dir", model, "--block-size", "16", "--max-num-tokens", "256",
                        "--max-context", "512", "--kv-cache-bytes", std::to_string(256 * TinyCpuBlockBytes(16)),
                        "--lora", "sql=" + sql, "--router", "tcp://127.0.0.1:" + std::to_string(router.port)});
  const kvfleet::WorkerHello hello = router.HelloWhere([](const kvfleet::WorkerHello&) { return true; });
  REQUIRE(hello.loras.size() == 1);
  CHECK(hello.loras[0].name == "sql");
  CHECK(hello.loras[0].lora_id == kvfleet::LoraId("sql"));
  CHECK(hello.loras[0].rank == 8);
  CHECK(hello.max_loras == 1);
  CHECK(hello.lora_load_us > 0);  // the prior before a measured load

  zmq::context_t sub_context;
  zmq::socket_t events(sub_context, zmq::socket_type::sub);
  events.set(zmq::sockopt::subscribe, "");
  events.connect("tcp://127.0.0.1:" + std::to_string(worker.events_port));
  {
    // A first batch (a heartbeat comes every 200 ms) shows the subscription has reached the
    // publisher: the steps below publish nothing it misses.
    zmq::pollitem_t first{static_cast<void*>(events), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&first, 1, std::chrono::milliseconds(10'000)) == 1);
    zmq::message_t topic, batch;
    REQUIRE(events.recv(topic, zmq::recv_flags::none));
    REQUIRE(events.recv(batch, zmq::recv_flags::none));
  }

  Client client(worker.requests_port);
  std::vector<uint32_t> prompt = Prompt(40, 5);
  for (uint32_t& t : prompt) t = t % 500 + 3;
  auto run = [&](uint64_t id, const std::string& lora, uint32_t* cached, const std::string& model = "") {
    std::vector<uint32_t> tokens;
    int deltas = 0;
    client.Generate(id, prompt, 8, lora, 0, /*ignore_eos=*/true, model);
    *cached = client.Collect(id, &tokens, &deltas).cached_device;
    return tokens;
  };
  uint32_t cached[3];
  const auto base = run(1, "", &cached[0]);
  const auto with_sql = run(2, "sql", &cached[1]);
  const auto again = run(3, "sql", &cached[2]);
  CHECK(with_sql != base);
  CHECK(cached[1] == 0);   // the base model's blocks are not the adapter's
  CHECK(again == with_sql);
  CHECK(cached[2] == 32);  // the adapter's own two full blocks
  CHECK(run(5, "", &cached[0], "sql") == with_sql);  // the model field may name the adapter (vLLM's way)

  client.Generate(4, prompt, 4, "nope");
  Reply unknown = client.Next();
  CHECK(unknown.is_error);
  CHECK(unknown.code == kvfleet::schema::ErrorCode::UNKNOWN_LORA);

  // Stored events carry the adapter's loraId; the base model's carry 0. Heartbeats keep
  // coming, so read what the steps above published and a little more.
  std::map<uint64_t, int> stored;
  zmq::pollitem_t item{static_cast<void*>(events), 0, ZMQ_POLLIN, 0};
  const auto events_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < events_deadline && zmq::poll(&item, 1, std::chrono::milliseconds(500)) == 1) {
    zmq::message_t topic, batch;
    REQUIRE(events.recv(topic, zmq::recv_flags::none));
    REQUIRE(events.recv(batch, zmq::recv_flags::none));
    auto decoded = kvfleet::events::DecodeBatch(batch.data(), batch.size());
    REQUIRE(decoded.ok());
    for (const auto& e : decoded->events) {
      if (auto* s = std::get_if<kvfleet::kv::StoredEvent>(&e.data)) {
        for (const auto& b : s->blocks) ++stored[b.lora_id];
      }
    }
  }
  CHECK(stored[0] == 2);
  CHECK(stored[kvfleet::LoraId("sql")] == 2);

  // Run-time loading: a LoraResult, a new Hello at once, and requests may use it.
  client.LoadLora(10, "chat", chat);
  Reply loaded = client.Next();
  CHECK(loaded.is_lora_result);
  CHECK(loaded.request_id == 10);
  CHECK_MESSAGE(!loaded.is_error, loaded.message);
  router.HelloWhere([](const kvfleet::WorkerHello& h) { return h.loras.size() == 2; });
  const auto with_chat = run(11, "chat", &cached[0]);
  CHECK(with_chat != with_sql);
  client.LoadLora(12, "chat", chat);  // twice
  Reply twice = client.Next();
  CHECK(twice.is_error);
  CHECK(twice.code == kvfleet::schema::ErrorCode::INVALID_REQUEST);
  CHECK(twice.message.find("already loaded") != std::string::npos);
  client.LoadLora(13, "bad", "/nonexistent/adapter");
  Reply bad = client.Next();
  CHECK(bad.is_error);
  CHECK(bad.code == kvfleet::schema::ErrorCode::INVALID_REQUEST);
  CHECK(bad.message.find("/nonexistent/adapter/adapter_config.json") != std::string::npos);
  client.LoadLora(14, "tiny-s1-vocab512-v1", chat);  // the served model's name
  CHECK(client.Next().message.find("is the served model's") != std::string::npos);

  // Unloading: the adapter is gone from requests and the Hello.
  client.UnloadLora(20, "chat");
  Reply unloaded = client.Next();
  CHECK(unloaded.is_lora_result);
  CHECK_FALSE(unloaded.is_error);
  router.HelloWhere([](const kvfleet::WorkerHello& h) { return h.loras.size() == 1; });
  client.Generate(21, prompt, 4, "chat");
  CHECK(client.Next().code == kvfleet::schema::ErrorCode::UNKNOWN_LORA);
  client.UnloadLora(22, "chat");
  Reply gone = client.Next();
  CHECK(gone.is_error);
  CHECK(gone.code == kvfleet::schema::ErrorCode::UNKNOWN_LORA);

  const std::string metrics = HttpGet(worker.http_port, "/metrics");
  CHECK(metrics.find("kvfleet_worker_lora_adapters{state=\"loaded\"} 1") != std::string::npos);
  CHECK(metrics.find("kvfleet_worker_lora_loads_total 2") != std::string::npos);  // sql, then chat into its slot
  CHECK(worker.Terminate() == 0);
}

TEST_CASE("a cpu worker with --tensor-parallel 2 announces it and serves what one rank serves") {
  const std::string model = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  std::vector<uint32_t> prompt = Prompt(20, 3);
  for (uint32_t& t : prompt) t = t % 500 + 3;
  std::vector<std::vector<uint32_t>> outputs;
  for (const char* tp : {"1", "2"}) {
    FakeRouter router;
    WorkerProcess worker({"--backend", "cpu", "--model-dir", model, "--block-size", "16", "--max-num-tokens", "256",
                          "--max-context", "512", "--kv-cache-bytes", std::to_string(64 * TinyCpuBlockBytes(16)),
                          "--tensor-parallel", tp, "--router", "tcp://127.0.0.1:" + std::to_string(router.port)});
    const kvfleet::WorkerHello hello = router.HelloWhere([](const kvfleet::WorkerHello&) { return true; });
    CHECK(hello.tensor_parallel == static_cast<uint32_t>(std::stoi(tp)));
    Client client(worker.requests_port);
    std::vector<uint32_t> tokens;
    int deltas = 0;
    client.Generate(1, prompt, 8, "", 0, /*ignore_eos=*/true);
    client.Collect(1, &tokens, &deltas);
    CHECK(tokens.size() == 8);
    outputs.push_back(tokens);
    CHECK(worker.Terminate() == 0);
  }
  CHECK(outputs[0] == outputs[1]);  // greedy: the same tokens from the sharded forward pass
}

TEST_CASE("a bad --tensor-parallel stops the worker at start-up with an error naming the flag") {
  const std::string tiny = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);  // 4 heads
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const Case cases[] = {
      {{"--backend", "cpu", "--model-dir", tiny, "--tensor-parallel", "3"}, "--tensor-parallel must be 1, 2, 4 or 8, got 3"},
      {{"--backend", "cpu", "--model-dir", tiny, "--tensor-parallel", "0"}, "--tensor-parallel must be 1, 2, 4 or 8, got 0"},
      {{"--backend", "cpu", "--model-dir", tiny, "--tensor-parallel", "8"},
       "--tensor-parallel 8: the model's 4 attention heads (config.json num_attention_heads)"},
      {{"--backend", "mock", "--model-dir", tiny, "--tensor-parallel", "8"}, "num_attention_heads"},
  };
  for (const Case& c : cases) {
    const auto [status, out] = RunRefused(c.flags);
    INFO(c.says << "\n" << out);
    CHECK(status != 0);
    CHECK(out.find(c.says) != std::string::npos);
  }
}

TEST_CASE("bad --lora flags and adapters stop the worker at start-up with an error naming the flag") {
  const std::string tiny = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  const std::string qwen3 = kvfleet::testing::SmallVocabModelDir("tiny-qwen3", 4, 512);
  const std::string adapter = WriteAdapter(tiny, "ok", 1), other = WriteAdapter(qwen3, "other", 1);
  const std::vector<std::string> cpu = {"--backend", "cpu", "--model-dir", tiny};
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const Case cases[] = {
      {{"--lora", "sql"}, "--lora sql: expected NAME=DIR"},
      {{"--lora", "=" + adapter}, "the NAME is empty"},
      {{"--lora", "a=" + adapter, "--lora", "a=" + adapter}, "NAME 'a' is given twice"},
      {{"--lora", "a=/nonexistent"}, "'/nonexistent' is not a directory"},
      {{"--lora", "tiny-s1-vocab512-v1=" + adapter}, "is the served model's name (--model-name)"},
      {{"--lora", "a=" + adapter, "--max-loras", "0"}, "--lora needs --max-loras >= 1"},
      {{"--max-loras", "-1"}, "--max-loras must be >= 0"},
      {{"--max-lora-rank", "65"}, "--max-lora-rank must be 1..64"},
      {{"--lora", "a=" + adapter, "--max-lora-rank", "4"}, "rank 8 is above --max-lora-rank 4"},
      {{"--lora", "a=" + other}, "--lora a=" + other},  // qwen3's adapter: the base model and shapes differ
  };
  for (const Case& c : cases) {
    std::vector<std::string> flags = cpu;
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    const auto [status, out] = RunRefused(flags);
    INFO(c.says << "\n" << out);
    CHECK(status != 0);
    CHECK(out.find(c.says) != std::string::npos);
  }
}

}  // namespace
