// Worker in-process, on ephemeral ports: concurrent clients over the requests socket,
// registration with a router (Hello, then Bye on stop), KV events on the PUB socket.
// Runs under TSAN: the engine thread, the request I/O thread, the publisher thread, the
// HTTP threads and the clients all meet here.
#include "worker/server/worker.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include <capnp/message.h>

#include "schema/events.capnp.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "worker/backend/backend_choice.h"
#include "worker/backend/kv_setup.h"
#include "worker/backend/mock/mock_backend.h"
#include "worker/server/registration.h"
#include "tests/common/http/test_client.h"

namespace kvfleet::server {
namespace {

std::string Frame(uint64_t id, uint32_t first, uint32_t n, uint32_t max_tokens) {
  capnp::MallocMessageBuilder msg;
  auto g = msg.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(id);
  auto t = g.initTokens(n);
  for (uint32_t i = 0; i < n; ++i) t.set(i, first + i);
  g.getSampling().setTemperature(0);
  g.getSampling().setMaxTokens(max_tokens);
  return wire::Encode(msg);
}

TEST_CASE("concurrent clients, registration and events against an in-process worker") {
  zmq::context_t context;
  zmq::socket_t registry(context, zmq::socket_type::router);
  registry.bind("tcp://127.0.0.1:*");
  const std::string registry_endpoint = registry.get(zmq::sockopt::last_endpoint);

  WorkerConfig config;
  config.backend = "mock";
  config.model_name = "mock-8b";
  config.requests = "tcp://127.0.0.1:0";
  config.events = "tcp://127.0.0.1:0";
  config.replay = "tcp://127.0.0.1:0";
  config.http_port = 0;
  config.router = registry_endpoint;
  config.advertise_host = "127.0.0.1";
  config.block_size = 16;
  config.max_num_tokens = 256;
  config.max_batch_size = 16;
  config.kv_cache_bytes = 128ull * 2 * 1024 * 1024;  // 128 blocks
  config.mock_cost.step_base_us = 200;
  config.mock_cost.prefill_token_us = 1;
  config.mock_verify_kv = true;
  config.shutdown_grace_s = 5;
  auto started = Worker::Start(config, context);
  REQUIRE_MESSAGE(started.ok(), started.status().ToString());
  std::unique_ptr<Worker> worker = std::move(*started);

  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv.");
  sub.connect(worker->events_endpoint());

  std::thread engine([&] { worker->Run(); });

  constexpr int kClients = 4;
  constexpr int kRequests = 8;
  std::atomic<int> completed{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      zmq::socket_t s(context, zmq::socket_type::dealer);
      s.set(zmq::sockopt::linger, 0);
      s.connect(worker->requests_endpoint());
      // Every client uses request ids 1..N: ids are per connection.
      for (int i = 1; i <= kRequests; ++i) s.send(zmq::buffer(Frame(i, 500 + c * 3, 40 + i, 6)), zmq::send_flags::none);
      int finished = 0;
      while (finished < kRequests) {
        zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(10'000)) != 1) break;
        zmq::message_t m;
        (void)s.recv(m, zmq::recv_flags::none);
        auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
        if (!d.ok() || !(*d)->Root<schema::FromWorker>().isDelta()) break;
        auto delta = (*d)->Root<schema::FromWorker>().getDelta();
        if (delta.getFinishReason() != schema::FinishReason::NONE) {
          if (delta.getUsage().getCompletionTokens() == 6) ++finished;
        }
      }
      completed += finished;
    });
  }
  for (auto& t : clients) t.join();
  CHECK(completed.load() == kClients * kRequests);

  // Hello arrived (routing id = the worker id and this run's epoch), with the worker's facts.
  zmq::pollitem_t item{static_cast<void*>(registry), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(5000)) == 1);
  zmq::message_t identity, frame;
  (void)registry.recv(identity, zmq::recv_flags::none);
  (void)registry.recv(frame, zmq::recv_flags::none);
  auto hello_msg = wire::Decode<schema::ToRouter>(frame.data(), frame.size());
  REQUIRE(hello_msg.ok());
  auto hello = (*hello_msg)->Root<schema::ToRouter>().getHello();
  CHECK(identity.to_string() == server::RegistrationRoutingId(worker->worker_id(), hello.getEpoch()));
  CHECK(std::string(hello.getModel().cStr()) == "mock-8b");
  CHECK(hello.getBlockSize() == 16);
  CHECK(hello.getTiers()[0].getTotalBlocks() == 128);
  CHECK(std::string(hello.getBackend().cStr()) == "mock");
  CHECK(hello.getTokenizerDigest() == 0);  // a mock's ids are no tokenizer's
  CHECK(hello.getRole() == schema::WorkerRole::BOTH);  // the default --role
  CHECK(std::string(hello.getEndpoints().getRequests().cStr()) == worker->requests_endpoint());
  REQUIRE(hello.getKvPools().size() == 1);  // the mock's Llama shape: one full-attention pool
  CHECK(hello.getKvPools()[0].getWindow() == 0);
  CHECK(hello.getKvPools()[0].getLayers() == 32);
  CHECK(hello.getKvPools()[0].getDeviceBlocks() == 128);
  CHECK(hello.getKvPools()[0].getReuse());
  CHECK(hello.getKvPools()[0].getReuseTokens() == 0);

  // KV events: some batch stored blocks.
  bool stored = false;
  for (int i = 0; i < 200 && !stored; ++i) {
    zmq::pollitem_t ev{static_cast<void*>(sub), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&ev, 1, std::chrono::milliseconds(1000)) != 1) break;
    zmq::message_t topic, batch;
    (void)sub.recv(topic, zmq::recv_flags::none);
    (void)sub.recv(batch, zmq::recv_flags::none);
    auto b = wire::Decode<schema::EventBatch>(batch.data(), batch.size());
    REQUIRE(b.ok());
    for (auto e : (*b)->Root<schema::EventBatch>().getEvents()) stored = stored || e.isStored();
  }
  CHECK(stored);

  worker->RequestStop();
  engine.join();
  // Bye follows the Hellos.
  bool bye = false;
  while (!bye && zmq::poll(&item, 1, std::chrono::milliseconds(2000)) == 1) {
    (void)registry.recv(identity, zmq::recv_flags::none);
    (void)registry.recv(frame, zmq::recv_flags::none);
    auto m = wire::Decode<schema::ToRouter>(frame.data(), frame.size());
    REQUIRE(m.ok());
    bye = (*m)->Root<schema::ToRouter>().isBye();
  }
  CHECK(bye);
  worker.reset();
}

TEST_CASE("a worker whose queue is full refuses with overloaded at once, and counts the refusals") {
  zmq::context_t context;
  WorkerConfig config;
  config.backend = "mock";
  config.model_name = "mock-8b";
  config.requests = config.events = config.replay = "tcp://127.0.0.1:0";
  config.http_port = 0;
  config.block_size = 16;
  config.max_num_tokens = 256;
  config.max_batch_size = 1;  // one runs; at most one waits for it (--max-queued 1)
  config.max_queued = 1;
  config.kv_cache_bytes = 128ull * 2 * 1024 * 1024;
  config.mock_cost.step_base_us = 20'000;  // 20 ms steps: the queue stays full while they arrive
  auto started = Worker::Start(config, context);
  REQUIRE_MESSAGE(started.ok(), started.status().ToString());
  std::unique_ptr<Worker> worker = std::move(*started);
  std::thread engine([&] { worker->Run(); });

  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(worker->requests_endpoint());
  constexpr int kRequests = 6;
  for (int i = 1; i <= kRequests; ++i) s.send(zmq::buffer(Frame(i, 100 * i, 20, 4)), zmq::send_flags::none);
  int served = 0, refused = 0;
  while (served + refused < kRequests) {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(10'000)) == 1);
    zmq::message_t m;
    (void)s.recv(m, zmq::recv_flags::none);
    auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
    REQUIRE(d.ok());
    auto root = (*d)->Root<schema::FromWorker>();
    if (root.isError()) {
      CHECK(root.getError().getCode() == schema::ErrorCode::OVERLOADED);
      CHECK(std::string(root.getError().getMessage().cStr()).find("queue is full") != std::string::npos);
      ++refused;
    } else if (root.getDelta().getFinishReason() != schema::FinishReason::NONE) {
      CHECK(root.getDelta().getUsage().getCompletionTokens() == 4);
      ++served;
    }
  }
  // Every request was answered: a whole stream or a refusal, never silence.
  CHECK(served >= 1);
  CHECK(refused >= kRequests - 2);

  std::string metrics = http::testing::Roundtrip(worker->http_port(), "GET", "/metrics", "");
  CHECK(metrics.find("kvfleet_worker_requests_refused_total{code=\"overloaded\"} " + std::to_string(refused)) !=
        std::string::npos);
  worker->RequestStop();
  engine.join();
}

TEST_CASE("Hello lists the host tier only when there is one") {
  WorkerHello info;
  info.name = "w";
  info.device_blocks = 10;
  auto decode = [](const std::string& f) {
    auto m = wire::Decode<schema::ToRouter>(f.data(), f.size());
    REQUIRE(m.ok());
    return (*m)->Root<schema::ToRouter>().getHello().getTiers().size();
  };
  CHECK(decode(EncodeHello(info)) == 1);
  info.host_blocks = 5;
  CHECK(decode(EncodeHello(info)) == 2);
}

TEST_CASE("worker config: instances of one process get distinct ports and ids") {
  WorkerConfig c;
  c.backend = "mock";  // no model directory
  c.worker_id = "w";
  WorkerConfig third = c.ForInstance(2);
  CHECK(third.requests == "tcp://*:5576");
  CHECK(third.events == "tcp://*:5577");
  CHECK(third.http_port == 9420);
  CHECK(third.worker_id == "w-2");
  c.max_num_tokens = 100;  // not a multiple of 32
  CHECK_FALSE(c.Validate().ok());
  c.max_num_tokens = 8192;
  CHECK(c.max_step_ms == engine::config::kDefaultMaxStepMs);  // the bound is on by default
  for (double ok : {0.0, 1.0, 60000.0}) {
    c.max_step_ms = ok;
    CHECK(c.Validate().ok());
  }
  for (double bad : {-5.0, 0.5, 1e9, std::nan("")}) {
    c.max_step_ms = bad;
    CHECK(c.Validate().message().find("--max-step-ms") != std::string::npos);
  }
  c.max_step_ms = engine::config::kDefaultMaxStepMs;
  // The decode-role cap and its yield (scheduler.h): the defaults, then what each refuses.
  CHECK(c.decode_step_cap == engine::config::kDecodeRoleStepOverDecodes);
  CHECK(c.decode_cap_wait_ms == engine::config::kDecodeRoleMaxCappedWaitMs);
  for (double ok : {0.0, 1.0, 1.4, 100.0}) {
    c.decode_step_cap = ok;
    CHECK(c.Validate().ok());
  }
  for (double bad : {-1.0, 0.5, 101.0, std::nan("")}) {
    c.decode_step_cap = bad;
    CHECK(c.Validate().message().find("--decode-step-cap") != std::string::npos);
  }
  c.decode_step_cap = 1.25;
  for (double ok : {0.0, 500.0, 3.6e6}) {
    c.decode_cap_wait_ms = ok;
    CHECK(c.Validate().ok());
  }
  for (double bad : {-1.0, 3.7e6, std::nan(""), HUGE_VAL}) {
    c.decode_cap_wait_ms = bad;
    CHECK(c.Validate().message().find("--decode-cap-wait-ms") != std::string::npos);
  }
  c.decode_cap_wait_ms = 0;
  CHECK(EndpointPort("tcp://host:5556") == 5556);
  CHECK(EndpointPort("tcp://host") == -1);
}

TEST_CASE("worker config: --role is prefill, decode or both, and the first two need KV transfer") {
  WorkerConfig c;
  c.backend = "mock";
  CLI::App app;
  AddWorkerFlags(app, &c);
  std::vector<std::string> args = {"--role", "decode"};
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  REQUIRE_NOTHROW(app.parse(args));
  CHECK(c.role == "decode");
  CHECK(c.Validate().ok());
  c.role = "prefill";
  CHECK(c.Validate().ok());
  c.role = "decoder";
  CHECK(c.Validate().message() == "unknown worker role 'decoder': expected prefill, decode or both");
  c.role = "prefill";
  c.transfer.clear();  // no KV transfer: nothing to serve a decode worker
  CHECK(c.Validate().message().find("--role prefill needs KV transfer (--transfer)") != std::string::npos);
  c.role = "both";
  CHECK(c.Validate().ok());
}

TEST_CASE("worker config: the attention flags, and bad ones named at start-up") {
  WorkerConfig c;
  c.backend = "mock";  // no model directory
  CLI::App app;
  AddWorkerFlags(app, &c);
  std::vector<std::string> args = {"--streaming-llm", "--sink-tokens", "4", "--max-attention-window", "64,128",
                                   "--attention-chunk-size", "0"};
  std::reverse(args.begin(), args.end());  // CLI11 parses a reversed vector
  REQUIRE_NOTHROW(app.parse(args));
  CHECK(c.max_attention_window == std::vector<int32_t>{64, 128});
  CHECK(c.sink_tokens == 4);
  CHECK(c.streaming_llm);
  CHECK(c.Validate().ok());

  // Each bad combination fails Worker::Start with a message naming the flag.
  zmq::context_t context;
  auto start_error = [&](const std::function<void(WorkerConfig&)>& edit) {
    WorkerConfig w;
    w.backend = "mock";  // the mock's Llama shape: 32 full-attention layers, context 131072
    w.requests = "tcp://127.0.0.1:0";
    w.events = "tcp://127.0.0.1:0";
    w.replay = "tcp://127.0.0.1:0";
    w.http_port = 0;
    w.kv_cache_bytes = 64ull * 2 * 1024 * 1024;
    edit(w);
    auto started = Worker::Start(w, context);
    return started.ok() ? std::string("started") : started.status().message();
  };
  auto has = [](const std::string& message, const std::string& part) {
    INFO(message);
    return message.find(part) != std::string::npos;
  };
  CHECK(has(start_error([](WorkerConfig& w) { w.sink_tokens = 4; }), "--sink-tokens needs a sliding window"));
  CHECK(has(start_error([](WorkerConfig& w) {
              w.sink_tokens = 8;
              w.max_attention_window = {4};
            }),
            "--max-attention-window 4 is shorter than --sink-tokens 8"));
  CHECK(has(start_error([](WorkerConfig& w) {
              w.streaming_llm = true;
              w.max_attention_window = {1024};
            }),
            "--streaming-llm needs --sink-tokens"));
  CHECK(has(start_error([](WorkerConfig& w) { w.streaming_llm = true; }), "--streaming-llm needs a sliding window"));
  CHECK(has(start_error([](WorkerConfig& w) { w.attention_chunk_size = 100; }),
            "--attention-chunk-size 100 is not a multiple of --block-size 32"));
  CHECK(has(start_error([](WorkerConfig& w) {
              w.sink_tokens = 4;
              w.max_attention_window = {1024};
              w.attention_chunk_size = 256;
            }),
            "--sink-tokens and --attention-chunk-size contradict each other"));
  CHECK(has(start_error([](WorkerConfig& w) { w.max_attention_window = std::vector<int32_t>(33, 64); }),
            "--max-attention-window has 33 windows for a model of 32 layers"));
  CHECK(has(start_error([](WorkerConfig& w) { w.max_attention_window = {0}; }), "--max-attention-window: window 0"));
  CHECK(has(start_error([](WorkerConfig& w) { w.block_size = 24; }), "--block-size 24 is not a power of two"));
  CHECK(has(start_error([](WorkerConfig& w) {
              w.block_size = 1;
              w.routing_block_size = 12;
            }),
            "--routing-block-size 12 is not 0 or a power of two >= --block-size 1"));
}


TEST_CASE("worker config: --kv-cache-dtype takes auto, bf16, fp8 and fp8_e4m3; cpu refuses all but auto") {
  for (const char* ok : {"auto", "bf16", "fp8", "fp8_e4m3"}) {
    WorkerConfig c;
    c.backend = "mock";  // models fp8's capacity; no model directory
    CLI::App app;
    AddWorkerFlags(app, &c);
    std::vector<std::string> args = {"--kv-cache-dtype", ok};
    std::reverse(args.begin(), args.end());
    REQUIRE_NOTHROW(app.parse(args));
    CHECK(c.kv_cache_dtype == ok);
    CHECK(c.Validate().ok());
  }
  CHECK(*backend::ParseKvCacheDtype("fp8") == backend::KvCacheDtype::kFp8E4m3);
  CHECK(*backend::ParseKvCacheDtype("fp8_e4m3") == backend::KvCacheDtype::kFp8E4m3);
  CHECK(*backend::ParseKvCacheDtype("bf16") == backend::KvCacheDtype::kBf16);
  WorkerConfig c;
  c.backend = "mock";
  c.kv_cache_dtype = "fp8_e5m2";
  CHECK(c.Validate().message().find("--kv-cache-dtype must be auto, bf16, fp8 or fp8_e4m3, got 'fp8_e5m2'") !=
        std::string::npos);
  c.backend = "cpu";
  c.model_dir = "/nonexistent";
  c.kv_cache_dtype = "fp8";
  CHECK(c.Validate().message().find("--kv-cache-dtype fp8 needs --backend cuda") != std::string::npos);
  c.kv_cache_dtype = "auto";
  CHECK(c.Validate().ok());
  c.device = 1;  // a GPU ordinal means nothing to the cpu backend: refused, not ignored
  CHECK(c.Validate().message().find("--device 1 picks a GPU; it needs --backend cuda") != std::string::npos);
  c.backend = "cuda";
  CHECK(c.Validate().ok());
}

TEST_CASE("worker config: --backend auto (the default) runs the model on cuda or cpu, never the mock") {
  // Regression: without --backend a worker served the mock's random tokens under the name of
  // the model directory it was given.
  WorkerConfig c;
  CHECK(c.backend == "auto");
  const Status no_model = c.Validate();
  CHECK(no_model.message().find("--model-dir is required for --backend auto") != std::string::npos);
  CHECK(no_model.message().find("--backend mock") != std::string::npos);
  c.model_dir = "/models/llama";
  CHECK(c.Validate().ok());
  const std::string why = c.ResolveBackend();
  CHECK((c.backend == "cuda" || c.backend == "cpu"));
  CHECK_FALSE(why.empty());
  const backend::BackendChoice choice = backend::ChooseBackend();
  CHECK(choice.name == c.backend);  // the same answer each time on one machine
  CHECK(choice.why == why);
  // A named backend stays as named, with no reason to log.
  c.backend = "mock";
  CHECK(c.ResolveBackend().empty());
  CHECK(c.backend == "mock");
  CHECK(WorkerConfig{}.ModelName() == "mock");
}

TEST_CASE("worker config: --transfer-nccl is off by default, parses both ways, and needs --backend cuda and --transfer") {
  WorkerConfig c;
  CHECK_FALSE(c.transfer_nccl);
  c.backend = "mock";
  CLI::App app;
  AddWorkerFlags(app, &c);
  std::vector<std::string> args = {"--transfer-nccl"};
  REQUIRE_NOTHROW(app.parse(args));
  CHECK(c.transfer_nccl);
  CHECK(c.Validate().message().find("--transfer-nccl moves device KV blocks by NCCL; it needs --backend cuda, not mock") !=
        std::string::npos);
  c.backend = "cpu";
  c.model_dir = "/nonexistent";
  CHECK(c.Validate().message().find("it needs --backend cuda, not cpu") != std::string::npos);
  c.backend = "cuda";
  CHECK(c.Validate().ok());
  c.transfer.clear();
  CHECK(c.Validate().message().find("--transfer-nccl needs KV transfer (--transfer)") != std::string::npos);
  CLI::App again;
  AddWorkerFlags(again, &c);
  args = {"--no-transfer-nccl"};
  REQUIRE_NOTHROW(again.parse(args));
  CHECK_FALSE(c.transfer_nccl);
  CHECK(c.Validate().ok());
}

TEST_CASE("a backend without device pools refuses NCCL transfers and says which backend can") {
  backend::BackendOptions o;
  o.block_size = 16;
  o.kv_cache_bytes = 64ull * 2 * 1024 * 1024;
  auto mock = backend::mock::MockBackend::Make(o, {});
  REQUIRE_MESSAGE(mock.ok(), mock.status().ToString());
  auto nccl = (*mock)->MakeKvNccl([] {});
  REQUIRE_FALSE(nccl.ok());
  CHECK(nccl.status().code() == StatusCode::kFailedPrecondition);
  CHECK(nccl.status().message().find("cuda workers do") != std::string::npos);
}

TEST_CASE("an fp8 KV cache holds twice the blocks of a bf16 one in the same bytes (mock)") {
  backend::BackendOptions o;
  o.block_size = 16;
  o.kv_cache_bytes = 64ull * 2 * 1024 * 1024;
  auto bf16 = backend::mock::MockBackend::Make(o, {});
  o.kv_cache_dtype = backend::KvCacheDtype::kFp8E4m3;
  auto fp8 = backend::mock::MockBackend::Make(o, {});
  REQUIRE(bf16.ok());
  REQUIRE(fp8.ok());
  const backend::KvPoolInfo& a = (*bf16)->pools()[0];
  const backend::KvPoolInfo& b = (*fp8)->pools()[0];
  CHECK(b.bytes_per_block * 2 == a.bytes_per_block);
  CHECK(b.device_blocks == 2 * a.device_blocks);
  CHECK(backend::KvMemoryOf(**fp8).dtype_bytes == 1);
  CHECK(backend::KvMemoryOf(**bf16).dtype_bytes == 2);
}

}  // namespace
}  // namespace kvfleet::server
