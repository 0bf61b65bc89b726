// A kvfleet-worker process for tests, driven over its real sockets: WorkerProcess starts
// the binary (KVFLEET_WORKER_BIN) on free ports and waits for /ready, Client is a DEALER on
// its requests socket (Contract 3), HttpGet reads /health, /ready and /metrics, and
// RunRefused runs the binary with flags it should refuse at start-up.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <capnp/message.h>
#include <doctest/doctest.h>
#include <zmq.hpp>

#include "schema/describe.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet::testing {

// A port nobody listens on now (the kernel's choice for a socket bound to port 0), and one
// this process has not handed out before: the kernel may offer a just-closed port again, and
// two of one worker's endpoints (or a worker's and the fake router's) must not collide.
inline int FreePort() {
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
inline std::string HttpGet(int port, const std::string& path) {
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
  // Asks for the worker's Hello (schema/describe.h); Described() reads it.
  void Describe() {
    capnp::MallocMessageBuilder msg;
    msg.initRoot<kvfleet::schema::ToWorker>().initDescribe();
    Send(msg);
  }
  // The next frame as the answer to a Describe, waiting up to 10 s.
  kvfleet::Result<kvfleet::WorkerHello> Described() {
    zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
    REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(10'000)) == 1);
    zmq::message_t m;
    REQUIRE(socket.recv(m, zmq::recv_flags::none));
    return kvfleet::DecodeDescribed(m.data(), m.size());
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

inline std::vector<uint32_t> Prompt(uint32_t n, uint32_t first) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = first + i * 7;
  return p;
}

// The worker binary run with `flags`, expected to refuse them: its exit status and output.
inline std::pair<int, std::string> RunRefused(const std::vector<std::string>& flags) {
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

// The cpu backend's KV bytes per block of the tiny shape: 2 layers x K,V x 2 kv heads x
// head_dim 16 x fp32 x B.
inline uint64_t TinyCpuBlockBytes(uint64_t block_size) { return 2ull * 2 * 2 * 16 * 4 * block_size; }

}  // namespace kvfleet::testing
