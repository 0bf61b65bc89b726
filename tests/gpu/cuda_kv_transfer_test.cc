// The cuda backend's KV transfer (Contract 4): blocks written with WriteKvBlocks read back
// byte for byte with ReadKvBlocks, from the device and from the pinned host tier, in runs
// longer than the pinned staging; an fp8 cache says it cannot move blocks; and two in-process
// cuda workers on one GPU: a Generate whose PullHint names the worker that computed its prefix
// pulls the blocks over the TransferService and gives the computed prefix's greedy tokens;
// and the same across two processes, where the pull copies device to device (CUDA IPC), or,
// with the receiver on a second GPU and IPC off, moves by NCCL send/recv.
//
// Needs a GPU (label gpu).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <cstddef>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <capnp/message.h>
#include <zmq.hpp>

#include "schema/requests.h"
#include "tests/common/http/test_client.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "tests/gpu/cuda_parity.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "tests/worker/server/in_process_worker.h"
#include "worker/server/worker.h"

namespace kvfleet::testing {
namespace {

std::vector<std::byte> RandomBytes(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<std::byte>(r >> (8 * j));
  }
  return out;
}

std::vector<kv::BlockLocation> OnDevice(const std::vector<backend::BlockId>& ids) {
  std::vector<kv::BlockLocation> out;
  for (const backend::BlockId id : ids) out.push_back({kv::Tier::kDevice, id});
  return out;
}

TEST_CASE("cuda KV transfer: written blocks read back byte for byte, from the device and the host tier") {
  backend::BackendOptions o = Options("tiny", 1, 16);
  o.num_blocks = 8192;
  o.host_kv_bytes = 4 << 20;
  auto b = Make("cuda", o);
  REQUIRE(b->kv_transfer_format().dtype == "bf16");
  const backend::KvPoolInfo& pool = b->pools()[0];
  REQUIRE(pool.host_blocks > 0);
  const uint64_t bpb = pool.bytes_per_block;
  std::mt19937_64 rng(7);

  SUBCASE("scattered blocks, one call each way") {
    const std::vector<backend::BlockId> ids = {3, 7, 8, 9, 20, 8191, 0};
    const std::vector<std::byte> in = RandomBytes(ids.size() * bpb, rng);
    REQUIRE(b->WriteKvBlocks(0, ids, in).ok());
    std::vector<std::byte> out(in.size());
    REQUIRE(b->ReadKvBlocks(0, OnDevice(ids), out).ok());
    CHECK(out == in);
    // The same blocks in another order read as that order.
    const std::vector<backend::BlockId> reversed(ids.rbegin(), ids.rend());
    REQUIRE(b->ReadKvBlocks(0, OnDevice(reversed), out).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t from = ids.size() - 1 - i;
      CHECK(std::equal(out.begin() + i * bpb, out.begin() + (i + 1) * bpb, in.begin() + from * bpb));
    }
  }
  SUBCASE("every block of the pool at once: runs longer than the staging, cut and double-buffered") {
    REQUIRE(pool.device_blocks * bpb > 3 * backend::cuda::config::kTransferStagingBytes);
    std::vector<backend::BlockId> ids(static_cast<size_t>(pool.device_blocks));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<backend::BlockId>(i);
    const std::vector<std::byte> in = RandomBytes(ids.size() * bpb, rng);
    REQUIRE(b->WriteKvBlocks(0, ids, in).ok());
    std::vector<std::byte> out(in.size());
    REQUIRE(b->ReadKvBlocks(0, OnDevice(ids), out).ok());
    CHECK(out == in);
  }
  SUBCASE("blocks offloaded to the host tier read as they were on the device") {
    const std::vector<backend::BlockId> ids = {10, 11, 12};
    const std::vector<std::byte> in = RandomBytes(ids.size() * bpb, rng);
    REQUIRE(b->WriteKvBlocks(0, ids, in).ok());
    std::vector<kv::BlockCopy> copies;
    for (size_t i = 0; i < ids.size(); ++i) {
      copies.push_back({.pool = 0, .src_tier = kv::Tier::kDevice, .src = ids[i], .dst_tier = kv::Tier::kHost,
                        .dst = static_cast<backend::BlockId>(5 + i)});
    }
    b->block_copier().Copy(copies);  // still on the stream when the read starts: it waits
    const std::vector<kv::BlockLocation> mixed = {{kv::Tier::kHost, 5}, {kv::Tier::kDevice, 11}, {kv::Tier::kHost, 7}};
    std::vector<std::byte> out(mixed.size() * bpb);
    REQUIRE(b->ReadKvBlocks(0, mixed, out).ok());
    CHECK(std::equal(out.begin(), out.begin() + bpb, in.begin()));
    CHECK(std::equal(out.begin() + bpb, out.begin() + 2 * bpb, in.begin() + bpb));
    CHECK(std::equal(out.begin() + 2 * bpb, out.end(), in.begin() + 2 * bpb));
  }
  SUBCASE("a wrong size or a block out of range is refused") {
    std::vector<std::byte> out(bpb + 1);
    CHECK(b->ReadKvBlocks(0, OnDevice({1}), out).code() == StatusCode::kInvalidArgument);
    std::vector<std::byte> one(bpb);
    CHECK(b->ReadKvBlocks(0, OnDevice({static_cast<backend::BlockId>(pool.device_blocks)}), one).code() ==
          StatusCode::kInvalidArgument);
    CHECK(b->WriteKvBlocks(1, std::vector<backend::BlockId>{1}, one).code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("an fp8 KV cache does not move blocks, and says why") {
  backend::BackendOptions o = Options("tiny", 1, 16);
  o.kv_cache_dtype = backend::KvCacheDtype::kFp8E4m3;
  auto b = Make("cuda", o);
  const backend::KvTransferFormat f = b->kv_transfer_format();
  CHECK(f.dtype.empty());
  CHECK(f.unsupported.find("fp8") != std::string::npos);
  std::vector<std::byte> out(b->pools()[0].bytes_per_block);
  CHECK(b->ReadKvBlocks(0, OnDevice({0}), out).code() == StatusCode::kFailedPrecondition);
}

// Two cuda workers, as tests/worker/server/kv_transfer_test.cc runs two cpu ones.
using server::testing::Answer;
using server::testing::Ask;
using server::testing::RunningWorker;

server::WorkerConfig CudaWorkerConfig(const std::string& model_dir) {
  server::WorkerConfig c = server::testing::InProcessConfig("cuda", model_dir);  // both share the GPU
  c.transfer_deadline_ms = 5'000;
  return c;
}

TEST_CASE("two cuda workers: a prefix pulled from the worker that computed it gives the computed prefix's greedy tokens") {
  zmq::context_t context;
  const std::string model = RandomModelDir("tiny", 1);
  RunningWorker a(CudaWorkerConfig(model), context);
  RunningWorker b(CudaWorkerConfig(model), context);
  REQUIRE_FALSE(a.worker->transfer_endpoint().empty());
  std::vector<TokenId> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(1000 + 7 * i);

  const Answer computed = Ask(context, a.worker->requests_endpoint(), prompt);
  REQUIRE(computed.finished);
  REQUIRE(computed.tokens.size() == 8);
  const PullHint from_a{a.worker->transfer_endpoint(), "", 6, a.worker->worker_id()};
  const Answer pulled = Ask(context, b.worker->requests_endpoint(), prompt, from_a);
  REQUIRE(pulled.finished);
  CHECK(pulled.cached_device_tokens == 96);  // 6 blocks of 16 pulled, 4 tokens computed
  CHECK(pulled.tokens == computed.tokens);
  const transfer::TransferStats stats = b.worker->transfer_stats();
  REQUIRE(stats.pulls.count(a.worker->transfer_endpoint()) == 1);
  CHECK(stats.pulls.at(a.worker->transfer_endpoint()).blocks == 6);
  // The pulled blocks are b's own now; and b computing the same prompt itself agrees too.
  const Answer again = Ask(context, b.worker->requests_endpoint(), prompt);
  CHECK(again.cached_device_tokens == 96);
  CHECK(again.tokens == computed.tokens);
  std::vector<TokenId> other = prompt;
  other[0] = 5;
  const Answer fresh = Ask(context, b.worker->requests_endpoint(), other);
  CHECK(fresh.cached_device_tokens == 0);
}

// The holder of the two-process cases below, run in a child process (this binary again,
// started with --no-skip and this case's name): it starts a cuda worker on GPU 0 (NCCL too
// with KVFLEET_IPC_NCCL=1), writes its endpoints to KVFLEET_IPC_HOLDER_FD and serves until
// KVFLEET_IPC_STOP_FD closes.
TEST_CASE("cuda IPC holder process" * doctest::skip()) {
  const char* up = std::getenv("KVFLEET_IPC_HOLDER_FD");
  const char* stop = std::getenv("KVFLEET_IPC_STOP_FD");
  const char* model = std::getenv("KVFLEET_IPC_MODEL");
  const char* nccl = std::getenv("KVFLEET_IPC_NCCL");
  REQUIRE(up != nullptr);
  REQUIRE(stop != nullptr);
  REQUIRE(model != nullptr);
  zmq::context_t context;
  server::WorkerConfig c = CudaWorkerConfig(model);
  c.transfer_ipc = true;
  c.transfer_nccl = nccl != nullptr && std::string(nccl) == "1";
  RunningWorker a(c, context);
  const std::string line =
      a.worker->requests_endpoint() + "\n" + a.worker->transfer_endpoint() + "\n" + a.worker->worker_id() + "\n";
  REQUIRE(write(std::atoi(up), line.data(), line.size()) == static_cast<ssize_t>(line.size()));
  close(std::atoi(up));
  char byte;
  while (read(std::atoi(stop), &byte, 1) > 0) {
  }
}

// The holder child of the two-process cases: its requests endpoint, transfer endpoint and
// worker id; closing stop_fd ends it.
struct HolderProcess {
  std::vector<std::string> endpoints;
  pid_t pid = -1;
  int stop_fd = -1;
};

HolderProcess StartHolderProcess(const std::string& model, bool nccl) {
  int up[2], stop[2];
  REQUIRE(pipe(up) == 0);
  REQUIRE(pipe(stop) == 0);
  // Everything the child needs is made before fork: it only closes and execs (a fresh image,
  // without this process's CUDA state or locks).
  std::vector<std::string> vars = {"KVFLEET_IPC_HOLDER_FD=" + std::to_string(up[1]),
                                   "KVFLEET_IPC_STOP_FD=" + std::to_string(stop[0]), "KVFLEET_IPC_MODEL=" + model,
                                   std::string("KVFLEET_IPC_NCCL=") + (nccl ? "1" : "0")};
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string arg0 = "holder", arg1 = "--no-skip", arg2 = "-tc=cuda IPC holder process";
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(up[0]);
    close(stop[1]);
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  close(up[1]);
  close(stop[0]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(up[0], buf, sizeof(buf))) > 0;) text.append(buf, static_cast<size_t>(n));
  close(up[0]);
  HolderProcess h;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    h.endpoints.push_back(text.substr(at, nl - at));
  }
  h.pid = child;
  h.stop_fd = stop[1];
  return h;
}

void StopHolderProcess(HolderProcess& h) {
  close(h.stop_fd);
  int status = 0;
  REQUIRE(waitpid(h.pid, &status, 0) == h.pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("two cuda workers in two processes: the pull copies the holder's device blocks (CUDA IPC)") {
  const std::string model = RandomModelDir("tiny", 1);
  HolderProcess holder = StartHolderProcess(model, false);
  const std::vector<std::string>& a = holder.endpoints;  // requests, transfer endpoint, worker id
  REQUIRE(a.size() == 3);
  {
    zmq::context_t context;
    server::WorkerConfig c = CudaWorkerConfig(model);
    c.transfer_ipc = true;
    // With a second GPU, B runs on it (--device 1): the copy crosses from A's GPU to B's.
    int devices = 0;
    REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
    c.device = devices >= 2 ? 1 : 0;
    MESSAGE("holder on GPU 0, receiver on GPU " << c.device);
    RunningWorker b(c, context);
    std::vector<TokenId> prompt(100);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(1000 + 7 * i);
    const Answer computed = Ask(context, a[0], prompt);
    REQUIRE(computed.finished);
    const PullHint from_a{a[1], "", 6, a[2]};
    const Answer pulled = Ask(context, b.worker->requests_endpoint(), prompt, from_a);
    REQUIRE(pulled.finished);
    CHECK(pulled.cached_device_tokens == 96);
    CHECK(pulled.tokens == computed.tokens);
    const transfer::TransferStats stats = b.worker->transfer_stats();
    REQUIRE(stats.pulls.count(a[1]) == 1);
    CHECK(stats.pulls.at(a[1]).device == 1);  // device to device, not bytes
    CHECK(stats.pulls.at(a[1]).blocks == 6);
    CHECK(stats.pulls.at(a[1]).device_copy_bytes == stats.pulls.at(a[1]).bytes);  // the copy is counted
    CHECK(stats.pulls.at(a[1]).device_copy_seconds > 0);
    // B holds them now: B's own reuse agrees.
    const Answer again = Ask(context, b.worker->requests_endpoint(), prompt);
    CHECK(again.cached_device_tokens == 96);
    CHECK(again.tokens == computed.tokens);
  }
  StopHolderProcess(holder);
}

TEST_CASE("two cuda workers in two processes on two GPUs, IPC off: the pull moves the holder's device blocks by NCCL") {
  int devices = 0;
  REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
  if (devices < 2) {
    // NCCL refuses two ranks on one GPU: the pair needs two.
    MESSAGE("SKIPPED: KV transfer by NCCL needs 2 GPUs, this machine has " << devices);
    return;
  }
  const std::string model = RandomModelDir("tiny", 1);
  HolderProcess holder = StartHolderProcess(model, true);
  const std::vector<std::string>& a = holder.endpoints;  // requests, transfer endpoint, worker id
  REQUIRE(a.size() == 3);
  {
    zmq::context_t context;
    server::WorkerConfig c = CudaWorkerConfig(model);
    c.transfer_ipc = false;  // as across hosts or IPC namespaces: the holder cannot answer `device`
    c.transfer_nccl = true;
    c.device = 1;
    RunningWorker b(c, context);
    std::vector<TokenId> prompt(100);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(1000 + 7 * i);
    const Answer computed = Ask(context, a[0], prompt);
    REQUIRE(computed.finished);
    const PullHint from_a{a[1], "", 6, a[2]};
    // The first pull sets up the pair's communicator; the second, of another prompt, reuses it.
    const Answer pulled = Ask(context, b.worker->requests_endpoint(), prompt, from_a);
    REQUIRE(pulled.finished);
    CHECK(pulled.cached_device_tokens == 96);
    CHECK(pulled.tokens == computed.tokens);
    std::vector<TokenId> second = prompt;
    second[0] = 999;
    const Answer computed2 = Ask(context, a[0], second);
    const Answer pulled2 = Ask(context, b.worker->requests_endpoint(), second, from_a);
    CHECK(pulled2.cached_device_tokens == 96);
    CHECK(pulled2.tokens == computed2.tokens);
    const transfer::TransferStats stats = b.worker->transfer_stats();
    REQUIRE(stats.pulls.count(a[1]) == 1);
    const transfer::SourceStats& src = stats.pulls.at(a[1]);
    CHECK(src.nccl == 2);    // by NCCL,
    CHECK(src.device == 0);  // not CUDA IPC
    CHECK(src.blocks == 12);
    CHECK(src.nccl_copy_bytes == src.bytes);  // every block received
    CHECK(src.nccl_copy_seconds > 0);
    // B holds them now, and recomputing agrees: B's answer for a prompt it computes itself.
    const Answer again = Ask(context, b.worker->requests_endpoint(), prompt);
    CHECK(again.cached_device_tokens == 96);
    CHECK(again.tokens == computed.tokens);
    // /metrics counts the NCCL pulls (refreshed every 250 ms while idle).
    std::string metrics;
    for (int i = 0; i < 100 && metrics.find("kvfleet_worker_kv_nccl_pulls_total 2") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      metrics = http::testing::BodyOf(http::testing::Roundtrip(b.worker->http_port(), "GET", "/metrics"));
    }
    CHECK(metrics.find("kvfleet_worker_kv_nccl_pulls_total 2") != std::string::npos);
    CHECK(metrics.find("kvfleet_worker_kv_nccl_copy_bytes_total{source=\"" + a[1]) != std::string::npos);
  }
  StopHolderProcess(holder);
}

}  // namespace
}  // namespace kvfleet::testing
