// The cuda backend's KV transfer (Contract 4): blocks written with WriteKvBlocks read back
// byte for byte with ReadKvBlocks, from the device and from the pinned host tier, in runs
// longer than the pinned staging; an fp8 cache says it cannot move blocks; and two in-process
// cuda workers on one GPU: a Generate whose PullHint names the worker that computed its prefix
// pulls the blocks over the TransferService and gives the computed prefix's greedy tokens.
//
// Needs a GPU (label gpu).
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <capnp/message.h>
#include <zmq.hpp>

#include "schema/requests.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "tests/gpu/cuda_parity.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cuda_backend.h"
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
struct Answer {
  std::vector<TokenId> tokens;
  uint32_t cached_device_tokens = 0;
  bool finished = false;
};

Answer Ask(zmq::context_t& context, const std::string& endpoint, const std::vector<TokenId>& prompt,
           const PullHint& hint = {}) {
  capnp::MallocMessageBuilder msg;
  auto g = msg.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(1);
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
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  s.send(zmq::buffer(wire::Encode(msg)), zmq::send_flags::none);
  Answer a;
  while (!a.finished) {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(60'000)) != 1) break;
    zmq::message_t m;
    (void)s.recv(m, zmq::recv_flags::none);
    auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
    REQUIRE(d.ok());
    auto root = (*d)->Root<schema::FromWorker>();
    REQUIRE_MESSAGE(root.isDelta(), "the worker answered an error");
    auto delta = root.getDelta();
    for (auto tok : delta.getTokens()) a.tokens.push_back(tok);
    if (delta.getFinishReason() != schema::FinishReason::NONE) {
      a.finished = true;
      a.cached_device_tokens = delta.getUsage().getCachedDeviceTokens();
    }
  }
  return a;
}

struct RunningWorker {
  RunningWorker(const server::WorkerConfig& config, zmq::context_t& context) {
    auto started = server::Worker::Start(config, context);
    REQUIRE_MESSAGE(started.ok(), started.status().ToString());
    worker = std::move(*started);
    thread = std::thread([this] { worker->Run(); });
  }
  ~RunningWorker() {
    worker->RequestStop();
    thread.join();
  }
  std::unique_ptr<server::Worker> worker;
  std::thread thread;
};

server::WorkerConfig CudaWorkerConfig(const std::string& model_dir) {
  server::WorkerConfig c;
  c.backend = "cuda";
  c.model_dir = model_dir;
  c.requests = c.events = c.replay = "tcp://127.0.0.1:0";
  c.http_port = 0;
  c.http_host = "127.0.0.1";
  c.advertise_host = "127.0.0.1";
  c.block_size = 16;
  c.max_num_tokens = 256;
  c.max_batch_size = 4;
  c.max_context = 512;
  c.kv_cache_bytes = 8u << 20;  // both workers share the GPU
  c.transfer_deadline_ms = 5'000;
  c.shutdown_grace_s = 1;
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

}  // namespace
}  // namespace kvfleet::testing
