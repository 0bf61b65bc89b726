// A kvfleet-worker process (mock backend, shadow-KV verification on) driven over its real
// sockets by a test client: a DEALER on the requests socket (Contract 3), plain HTTP for
// /health, /ready and /metrics, and SIGTERM for the graceful shutdown.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <capnp/message.h>
#include <zmq.hpp>

#include "common/block_hash.h"
#include "schema/event_codec.h"
#include "schema/registration.h"
#include "schema/wire.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "tests/worker/model/test_models.h"
#include "schema/worker.capnp.h"

namespace {

// A port nobody listens on now (the kernel's choice for a socket bound to port 0), and one
// this process has not handed out before: the kernel may offer a just-closed port again, and
// two of one worker's endpoints (or a worker's and the fake router's) must not collide.
int FreePort() {
  static std::set<int> given;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    const int port = ntohs(addr.sin_port);
    if (given.insert(port).second) return port;
  }
}

// GET `path` on 127.0.0.1:port; returns the whole response ("" when nothing answers).
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    (void)!write(fd, req.data(), req.size());
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

struct WorkerProcess {
  // The mock worker most cases use.
  WorkerProcess()
      : WorkerProcess({"--backend", "mock",
                       "--model-name", "mock-8b",
                       "--block-size", "16",
                       "--max-num-tokens", "256",
                       "--max-context", "512",
                       "--kv-cache-bytes", std::to_string(64ull * 2 * 1024 * 1024),  // 64 blocks of 2 MiB
                       "--mock-step-base-us", "500",
                       "--mock-prefill-token-us", "20",
                       "--mock-verify-kv",
                       "--shutdown-grace-s", "5"}) {}
  // A worker with these flags, on free ports. Another process (a test running beside this
  // one) can still take a port between FreePort and the worker's bind: a worker that exits
  // before it is ready is started again on new ports, up to three times.
  explicit WorkerProcess(std::vector<std::string> flags) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (Start(flags)) return;
    }
    FAIL("the worker did not become ready");
  }
  bool Start(const std::vector<std::string>& flags) {
    requests_port = FreePort();
    http_port = FreePort();
    events_port = FreePort();
    std::vector<std::string> args = {KVFLEET_WORKER_BIN,
                                     "--requests", "tcp://127.0.0.1:" + std::to_string(requests_port),
                                     "--events", "tcp://127.0.0.1:" + std::to_string(events_port),
                                     "--replay", "tcp://127.0.0.1:" + std::to_string(FreePort()),
                                     "--http-port", std::to_string(http_port),
                                     "--log-level", "warn"};
    args.insert(args.end(), flags.begin(), flags.end());
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    // Ready once /ready answers 200.
    for (int i = 0; i < 300; ++i) {
      if (HttpGet(http_port, "/ready").starts_with("HTTP/1.1 200")) return true;
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {  // it gave up (a port taken): try again
        pid = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL("the worker did not become ready");
    return false;
  }
  ~WorkerProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // SIGTERM; returns the exit status.
  int Terminate() {
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  pid_t pid = -1;
  int requests_port = 0;
  int http_port = 0;
  int events_port = 0;
};

struct Reply {
  bool is_error = false;
  bool is_lora_result = false;  // a LoraResult; is_error: not ok
  uint64_t request_id = 0;
  std::vector<uint32_t> tokens;
  kvfleet::schema::FinishReason finish = kvfleet::schema::FinishReason::NONE;
  uint32_t prompt_tokens = 0, cached_device = 0, completion = 0;
  uint64_t ttft_us = 0;
  kvfleet::schema::ErrorCode code = kvfleet::schema::ErrorCode::INTERNAL;
  std::string message;  // of an error
};

struct Client {
  explicit Client(int port) : socket(context, zmq::socket_type::dealer) {
    socket.set(zmq::sockopt::linger, 0);
    socket.connect("tcp://127.0.0.1:" + std::to_string(port));
  }
  void Generate(uint64_t id, const std::vector<uint32_t>& prompt, uint32_t max_tokens, const std::string& lora = "",
                float temperature = 0, bool ignore_eos = false, const std::string& model = "") {
    capnp::MallocMessageBuilder msg;
    auto g = msg.initRoot<kvfleet::schema::ToWorker>().initGenerate();
    g.setModel(model);
    g.setRequestId(id);
    auto t = g.initTokens(static_cast<unsigned>(prompt.size()));
    for (unsigned i = 0; i < prompt.size(); ++i) t.set(i, prompt[i]);
    g.getSampling().setTemperature(temperature);
    g.getSampling().setMaxTokens(max_tokens);
    g.getSampling().setSeed(42);
    g.getSampling().setHasSeed(true);
    g.getSampling().setIgnoreEos(ignore_eos);
    g.setLoraName(lora);
    Send(msg);
  }
  void LoadLora(uint64_t id, const std::string& name, const std::string& path) {
    capnp::MallocMessageBuilder msg;
    auto l = msg.initRoot<kvfleet::schema::ToWorker>().initLoadLora();
    l.setRequestId(id);
    l.setName(name);
    l.setPath(path);
    Send(msg);
  }
  void UnloadLora(uint64_t id, const std::string& name) {
    capnp::MallocMessageBuilder msg;
    auto u = msg.initRoot<kvfleet::schema::ToWorker>().initUnloadLora();
    u.setRequestId(id);
    u.setName(name);
    Send(msg);
  }
  void Cancel(uint64_t id) {
    capnp::MallocMessageBuilder msg;
    msg.initRoot<kvfleet::schema::ToWorker>().initCancel().setRequestId(id);
    Send(msg);
  }
  void Send(capnp::MallocMessageBuilder& msg) {
    std::string frame = kvfleet::wire::Encode(msg);
    socket.send(zmq::buffer(frame), zmq::send_flags::none);
  }
  // The next reply, waiting up to 10 s.
  Reply Next() {
    zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(10'000)) == 1);
    zmq::message_t m;
    REQUIRE(socket.recv(m, zmq::recv_flags::none));
    auto decoded = kvfleet::wire::Decode<kvfleet::schema::FromWorker>(m.data(), m.size());
    REQUIRE(decoded.ok());
    auto root = (*decoded)->Root<kvfleet::schema::FromWorker>();
    Reply r;
    if (root.isLoraResult()) {
      r.is_lora_result = true;
      r.request_id = root.getLoraResult().getRequestId();
      r.is_error = !root.getLoraResult().getOk();
      r.code = root.getLoraResult().getCode();
      r.message = root.getLoraResult().getMessage().cStr();
      return r;
    }
    if (root.isError()) {
      r.is_error = true;
      r.request_id = root.getError().getRequestId();
      r.code = root.getError().getCode();
      r.message = root.getError().getMessage().cStr();
      return r;
    }
    auto d = root.getDelta();
    r.request_id = d.getRequestId();
    for (uint32_t t : d.getTokens()) r.tokens.push_back(t);
    r.finish = d.getFinishReason();
    r.prompt_tokens = d.getUsage().getPromptTokens();
    r.cached_device = d.getUsage().getCachedDeviceTokens();
    r.completion = d.getUsage().getCompletionTokens();
    r.ttft_us = d.getUsage().getTimeToFirstTokenUs();
    return r;
  }
  // Deltas of `id` up to its final one; the tokens, and the final Delta.
  Reply Collect(uint64_t id, std::vector<uint32_t>* tokens, int* deltas) {
    while (true) {
      Reply r = Next();
      INFO(r.message);
      REQUIRE_FALSE(r.is_error);
      REQUIRE(r.request_id == id);
      tokens->insert(tokens->end(), r.tokens.begin(), r.tokens.end());
      ++*deltas;
      if (r.finish != kvfleet::schema::FinishReason::NONE) return r;
    }
  }
  zmq::context_t context;
  zmq::socket_t socket;
};

std::vector<uint32_t> Prompt(uint32_t n, uint32_t first) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = first + i * 7;
  return p;
}

TEST_CASE("a worker process streams deltas, reports usage and cached tokens, refuses bad requests, stops on SIGTERM") {
  WorkerProcess worker;
  Client client(worker.requests_port);
  CHECK(HttpGet(worker.http_port, "/health").starts_with("HTTP/1.1 200"));

  // Streamed deltas: one per step, the final one with the finish reason and full usage.
  std::vector<uint32_t> first_tokens;
  int deltas = 0;
  client.Generate(1, Prompt(100, 10), 8);
  Reply last = client.Collect(1, &first_tokens, &deltas);
  CHECK(first_tokens.size() == 8);
  CHECK(deltas >= 2);
  CHECK(last.finish == kvfleet::schema::FinishReason::LENGTH);
  CHECK(last.prompt_tokens == 100);
  CHECK(last.completion == 8);
  CHECK(last.cached_device == 0);
  CHECK(last.ttft_us > 0);

  // The same prompt again: its 6 full blocks (96 tokens) come from the cache.
  std::vector<uint32_t> second_tokens;
  deltas = 0;
  client.Generate(2, Prompt(100, 10), 8);
  Reply again = client.Collect(2, &second_tokens, &deltas);
  CHECK(again.cached_device == 96);
  CHECK(second_tokens == first_tokens);

  // Bad requests get an Error each; the worker stays up.
  client.Generate(3, Prompt(600, 1), 4);  // over --max-context 512
  Reply too_long = client.Next();
  CHECK(too_long.is_error);
  CHECK(too_long.request_id == 3);
  CHECK(too_long.code == kvfleet::schema::ErrorCode::CONTEXT_TOO_LONG);
  client.Generate(4, Prompt(10, 1), 4, "no-such-adapter");
  Reply lora = client.Next();
  CHECK(lora.is_error);
  CHECK(lora.code == kvfleet::schema::ErrorCode::UNKNOWN_LORA);
  client.Generate(5, Prompt(10, 1), 4, "", -0.5f);
  Reply bad_temperature = client.Next();
  CHECK(bad_temperature.is_error);
  CHECK(bad_temperature.code == kvfleet::schema::ErrorCode::INVALID_REQUEST);
  client.socket.send(zmq::str_buffer("not a capnp message"), zmq::send_flags::none);

  // Cancel: the stream ends with `cancelled`.
  client.Generate(6, Prompt(20, 3), 400);
  Reply started = client.Next();
  CHECK(started.request_id == 6);
  client.Cancel(6);
  Reply r;
  do {
    r = client.Next();
  } while (r.finish == kvfleet::schema::FinishReason::NONE);
  CHECK(r.finish == kvfleet::schema::FinishReason::CANCELLED);

  std::string metrics = HttpGet(worker.http_port, "/metrics");
  CHECK(metrics.find("kvfleet_worker_time_to_first_token_seconds_count 3") != std::string::npos);
  CHECK(metrics.find("kvfleet_worker_prefix_hit_tokens_total") != std::string::npos);
  CHECK(metrics.find("kvfleet_worker_kv_blocks{") != std::string::npos);
  // The step bound, and the step-time model as fitted to the steps above: no longer the
  // prior's 7.29 ms base (this mock's steps take ~0.5 ms).
  CHECK(metrics.find("kvfleet_worker_step_bound_seconds 0.025") != std::string::npos);
  const std::string base_series = "kvfleet_worker_step_model_seconds{term=\"base\"} ";
  const size_t at = metrics.find(base_series);
  REQUIRE(at != std::string::npos);
  const double base_s = std::atof(metrics.c_str() + at + base_series.size());
  CHECK(base_s > 0);
  CHECK(std::abs(base_s - 7290e-6) > 1e-9);
  CHECK(metrics.find("kvfleet_worker_step_model_error_ratio ") != std::string::npos);

  // SIGTERM with a request in flight: it finishes within the grace period, exit 0.
  client.Generate(7, Prompt(30, 5), 30);
  (void)client.Next();
  CHECK(worker.Terminate() == 0);
  std::vector<uint32_t> rest;
  Reply final_reply;
  do {
    final_reply = client.Next();
  } while (final_reply.finish == kvfleet::schema::FinishReason::NONE);
  CHECK(final_reply.finish == kvfleet::schema::FinishReason::LENGTH);
  CHECK(final_reply.completion == 30);
}

// The worker binary run with `flags`, expected to refuse them: its exit status and output.
std::pair<int, std::string> RunRefused(const std::vector<std::string>& flags) {
  std::string cmd = std::string(KVFLEET_WORKER_BIN) + " --requests tcp://127.0.0.1:0 --events tcp://127.0.0.1:0" +
                    " --replay tcp://127.0.0.1:0 --http-port 0";
  for (const std::string& f : flags) cmd += " '" + f + "'";
  cmd += " 2>&1";
  std::FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST_CASE("bad attention flags stop the worker at start-up with an error naming the flag") {
  const std::string tiny = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);  // full attention, 2 layers
  const std::string mistral = kvfleet::testing::SmallVocabModelDir("tiny-mistral", 2, 512);  // window 20
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  const Case cases[] = {
      {{"--backend", "cpu", "--model-dir", tiny, "--sink-tokens", "4"}, "--sink-tokens needs a sliding window"},
      {{"--backend", "cpu", "--model-dir", tiny, "--sink-tokens", "16", "--max-attention-window", "8"},
       "--max-attention-window 8 is shorter than --sink-tokens 16"},
      {{"--backend", "cpu", "--model-dir", mistral, "--sink-tokens", "32"},
       "the model's sliding window of 20 tokens (config.json) is shorter than --sink-tokens 32"},
      {{"--backend", "cpu", "--model-dir", mistral, "--max-attention-window", "64"},
       "exceeds the model's sliding window of 20 (config.json)"},
      {{"--backend", "cpu", "--model-dir", tiny, "--attention-chunk-size", "40"},
       "--attention-chunk-size 40 is not a multiple of --block-size 32"},
      {{"--backend", "cpu", "--model-dir", tiny, "--streaming-llm", "--max-attention-window", "64"},
       "--streaming-llm needs --sink-tokens"},
      {{"--backend", "cpu", "--model-dir", tiny, "--streaming-llm", "--sink-tokens", "4", "--max-attention-window",
        "64", "--attention-chunk-size", "64"},
       "contradict each other"},
      {{"--backend", "cpu", "--model-dir", tiny, "--max-attention-window", "64,x"}, "--max-attention-window"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "48"}, "--block-size 48 is not a power of two"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "0"}, "--block-size 0 is not a power of two"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "1", "--routing-block-size", "24"},
       "--routing-block-size 24 is not 0 or a power of two >= --block-size 1"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "16", "--routing-block-size", "8"},
       "--routing-block-size 8 is not 0 or a power of two >= --block-size 16"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "16", "--attention-chunk-size", "24"},
       "--attention-chunk-size 24 is not a multiple of --block-size 16"},
      {{"--backend", "cpu", "--model-dir", tiny, "--block-size", "16", "--max-attention-window", "64", "--sink-tokens",
        "4", "--kv-cache-bytes", std::to_string(5 * 2 * 2 * 2 * 16 * 4 * 16)},  // 5 blocks
       "has 5 blocks; one sequence may hold 10 (sinks, window and first-window blocks): raise --kv-cache-bytes"},
  };
  for (const Case& c : cases) {
    const auto [status, out] = RunRefused(c.flags);
    INFO(c.says << "\n" << out);
    CHECK(status != 0);
    CHECK(out.find(c.says) != std::string::npos);
  }
}

// The cpu backend's KV bytes per block of the tiny shape: 2 layers x K,V x 2 kv heads x
// head_dim 16 x fp32 x B.
uint64_t TinyCpuBlockBytes(uint64_t block_size) { return 2ull * 2 * 2 * 16 * 4 * block_size; }

TEST_CASE("a StreamingLLM worker streams a long generation in a KV cache of its per-sequence block bound") {
  // CI streams 20,000 tokens (seconds); KVFLEET_STREAMING_TOKENS=1048576 runs the full
  // million through the same worker (a few minutes on 2 cores). Sinks 4, window 64, B = 16:
  // MaxSequenceBlocks = 1 sink block + ceil(63 / 16) + 1 + 4 first-window blocks held until
  // the window passes them = 10; the worker gets exactly 10 blocks, so one block more at any
  // step would fail the request.
  uint32_t tokens = 20'000;
  if (const char* e = std::getenv("KVFLEET_STREAMING_TOKENS"); e != nullptr && *e != 0) tokens = std::stoul(e);
  const std::string model = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  constexpr uint32_t kPrompt = 100;  // 7 blocks, all kept until the dense context phase ends
  WorkerProcess worker({"--backend", "cpu", "--model-dir", model, "--block-size", "16", "--max-num-tokens", "256",
                        "--max-context", std::to_string(tokens + kPrompt + 1), "--kv-cache-bytes",
                        std::to_string(10 * TinyCpuBlockBytes(16)), "--max-attention-window", "64", "--sink-tokens",
                        "4", "--streaming-llm"});
  Client client(worker.requests_port);
  std::vector<uint32_t> prompt = Prompt(kPrompt, 3);
  for (uint32_t& t : prompt) t = t % 500 + 3;  // inside the 512-token vocabulary
  client.Generate(1, prompt, tokens, "", 0, /*ignore_eos=*/true);
  std::vector<uint32_t> got;
  int deltas = 0;
  Reply last = client.Collect(1, &got, &deltas);
  CHECK(last.finish == kvfleet::schema::FinishReason::LENGTH);
  CHECK(last.completion == tokens);
  CHECK(got.size() == tokens);
  CHECK(std::count(got.begin(), got.end(), got[0]) < static_cast<long>(tokens));  // not one token over and over
  const std::string metrics = HttpGet(worker.http_port, "/metrics");
  CHECK(metrics.find("kvfleet_worker_kv_blocks{") != std::string::npos);

  // The same prompt again reuses its first window (64 tokens: 4 blocks), nothing further.
  client.Generate(2, prompt, 4, "", 0, true);
  std::vector<uint32_t> again;
  Reply second = client.Collect(2, &again, &deltas);
  CHECK(second.cached_device == 64);
  CHECK(std::equal(again.begin(), again.end(), got.begin()));  // greedy: the same first tokens

  // A prompt longer than the windowed pool (10 blocks, 160 tokens) cannot be allocated whole:
  // refused at once rather than queued for good.
  std::vector<uint32_t> long_prompt(161, 7);
  client.Generate(3, long_prompt, 4, "", 0, true);
  Reply refused = client.Next();
  CHECK(refused.is_error);
  CHECK(refused.code == kvfleet::schema::ErrorCode::CONTEXT_TOO_LONG);
  CHECK(refused.message.find("holds a prompt of at most 160") != std::string::npos);
}

TEST_CASE("a token-level KV worker (--block-size 1) generates what a 16-token worker does and reuses to the token") {
  const std::string model = kvfleet::testing::SmallVocabModelDir("tiny", 1, 512);
  auto start = [&](const std::string& b) {
    return std::make_unique<WorkerProcess>(std::vector<std::string>{
        "--backend", "cpu", "--model-dir", model, "--block-size", b, "--max-num-tokens", "256", "--max-context", "512",
        "--kv-cache-bytes", std::to_string(1024 * TinyCpuBlockBytes(1))});
  };
  std::vector<uint32_t> prompt = Prompt(45, 5);
  for (uint32_t& t : prompt) t = t % 500 + 3;  // inside the 512-token vocabulary
  std::vector<uint32_t> by_block_size[2];
  uint32_t cached_again[2] = {0, 0};
  const std::string sizes[2] = {"1", "16"};
  for (int i = 0; i < 2; ++i) {
    auto worker = start(sizes[i]);
    Client client(worker->requests_port);
    client.Generate(1, prompt, 12, "", 0, /*ignore_eos=*/true);
    int deltas = 0;
    const Reply first = client.Collect(1, &by_block_size[i], &deltas);
    CHECK(first.cached_device == 0);
    std::vector<uint32_t> again;
    client.Generate(2, prompt, 4, "", 0, true);
    cached_again[i] = client.Collect(2, &again, &deltas).cached_device;
    CHECK(std::equal(again.begin(), again.end(), by_block_size[i].begin()));
  }
  CHECK(by_block_size[0].size() == 12);
  CHECK(by_block_size[0] == by_block_size[1]);  // greedy: the same tokens at B = 1 and B = 16
  CHECK(cached_again[0] == 44);                  // every prompt token but the last, which computes logits
}

// A LoRA adapter for `model_dir`, written once per test run into a fresh directory.
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
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription reaches the publisher

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
