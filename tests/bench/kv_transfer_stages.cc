// kv_transfer_stages.h: each stage of a pull alone, and the same-host transports side by side.
#include "tests/bench/kv_transfer_stages.h"

#include <cuda_runtime_api.h>
#ifdef KVFLEET_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "schema/transfer_codec.h"

namespace kvfleet::bench {
void StageBreakdown(uint32_t blocks, uint64_t bpb, uint32_t block_size) {
  const uint64_t total = uint64_t{blocks} * bpb;
  const double gb = static_cast<double>(total) / 1e9;
  auto report = [&](const char* what, double ms) {
    std::printf("stage %-44s %9.1f ms  %7.2f GB/s\n", what, ms, gb / (ms / 1e3));
  };
  std::printf("stages of one pull, each alone: %u blocks x %llu bytes = %.3f GB\n", blocks,
              static_cast<unsigned long long>(bpb), gb);
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, total));
  CUDA_OK(cudaMemset(dev, 0x3c, total));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const size_t half = 8ull << 20;
  std::byte* staging[2];
  for (auto& s : staging) CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&s), half, cudaHostAllocDefault));
  cudaEvent_t ev[2];
  for (auto& e : ev) CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  // Raw links, for scale: one pinned DMA of the whole run each way, and pageable.
  {
    void* pinned = nullptr;
    CUDA_OK(cudaHostAlloc(&pinned, total, cudaHostAllocDefault));
    CUDA_OK(cudaMemcpy(pinned, dev, total, cudaMemcpyDeviceToHost));
    Clk::time_point t0 = Clk::now();
    CUDA_OK(cudaMemcpy(pinned, dev, total, cudaMemcpyDeviceToHost));
    report("(link) D2H pinned, one copy", MsSince(t0));
    t0 = Clk::now();
    CUDA_OK(cudaMemcpy(dev, pinned, total, cudaMemcpyHostToDevice));
    report("(link) H2D pinned, one copy", MsSince(t0));
    CUDA_OK(cudaFreeHost(pinned));
    std::vector<std::byte> pageable(total);
    std::memset(pageable.data(), 1, total);
    t0 = Clk::now();
    CUDA_OK(cudaMemcpy(pageable.data(), dev, total, cudaMemcpyDeviceToHost));
    report("(link) D2H pageable, one copy (pages touched)", MsSince(t0));
  }

  // 1. Holder, engine thread: ReadKvBlocks per block into a fresh block buffer (KvPulls::Serve).
  std::vector<transfer::Block> run(blocks);
  Clk::time_point t0 = Clk::now();
  for (uint32_t i = 0; i < blocks; ++i) {
    run[i].data.assign(1, std::vector<std::byte>(bpb));
    std::byte* dst = run[i].data[0].data();
    const std::byte* src = static_cast<const std::byte*>(dev) + uint64_t{i} * bpb;
    const size_t pieces = (bpb + half - 1) / half;
    CUDA_OK(cudaStreamSynchronize(stream));
    for (size_t k = 0; k <= pieces; ++k) {
      if (k < pieces) {
        CUDA_OK(cudaMemcpyAsync(staging[k % 2], src + k * half, std::min(half, bpb - k * half), cudaMemcpyDeviceToHost,
                                stream));
        CUDA_OK(cudaEventRecord(ev[k % 2], stream));
      }
      if (k > 0) {
        CUDA_OK(cudaEventSynchronize(ev[(k - 1) % 2]));
        std::memcpy(dst + (k - 1) * half, staging[(k - 1) % 2], std::min(half, bpb - (k - 1) * half));
      }
    }
  }
  report("1 holder: D2H via staging into new buffers", MsSince(t0));

  // The request these blocks answer, for the checks.
  transfer::PullRequest request;
  request.transfer_id = 1;
  request.model = "bench";
  request.block_size = block_size;
  request.layout.block_size = block_size;
  request.layout.pools = {transfer::PoolGeometry{0, 1, 1, 1, bpb}};
  request.deadline_ms = 1000;
  for (uint32_t i = 0; i < blocks; ++i) {
    run[i].index = i;
    run[i].hash = 1000 + i;
    run[i].tokens.assign(block_size, static_cast<TokenId>(i));
    request.hashes.push_back(1000 + i);
  }
  // 2. Holder, I/O thread: checksums, then frames under 64 MiB (holder.cc).
  t0 = Clk::now();
  for (transfer::Block& b : run) b.checksums = {transfer::Checksum(b.data[0])};
  report("2 holder: XXH3 checksums", MsSince(t0));
  std::vector<std::string> frames;
  t0 = Clk::now();
  for (size_t i = 0; i < run.size();) {
    uint64_t bytes = 1024;
    size_t end = i;
    while (end < run.size() && bytes + transfer::EncodedBlockBytes(run[end]) < (64ull << 20)) {
      bytes += transfer::EncodedBlockBytes(run[end++]);
    }
    if (end == i) ++end;
    frames.push_back(transfer::EncodeBlocks(1, std::span<const transfer::Block>(run).subspan(i, end - i)));
    i = end;
  }
  report("3 holder: capnp encode into frames", MsSince(t0));
  std::printf("      (%zu frames)\n", frames.size());

  // 4. The frames over ZeroMQ on loopback TCP, sender on its own thread (as the I/O threads).
  std::vector<zmq::message_t> received;
  {
    zmq::context_t ctx;
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.bind("tcp://127.0.0.1:0");
    const std::string ep = router.get(zmq::sockopt::last_endpoint);
    zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
    dealer.connect(ep);
    dealer.send(zmq::str_buffer("hi"), zmq::send_flags::none);
    zmq::message_t id, hi;
    (void)router.recv(id);
    (void)router.recv(hi);
    t0 = Clk::now();
    std::thread sender([&] {
      for (const std::string& f : frames) {
        router.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
        // Zero-copy, as the holder sends (holder.cc SendTo): the frames outlive the sends.
        zmq::message_t body(const_cast<char*>(f.data()), f.size(), [](void*, void*) {}, nullptr);
        router.send(body, zmq::send_flags::none);
      }
    });
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m;
      (void)dealer.recv(m);
      received.push_back(std::move(m));
    }
    sender.join();
    report("4 zmq DEALER<-ROUTER over tcp 127.0.0.1", MsSince(t0));
  }
  // 5. Receiver, I/O thread: decode and check every block, checksums included (puller.cc).
  std::vector<transfer::Block> got;
  t0 = Clk::now();
  for (const zmq::message_t& m : received) {
    auto reply = transfer::DecodePullReply(m.data(), m.size());
    if (!reply.ok()) {
      std::fprintf(stderr, "decode: %s\n", reply.status().ToString().c_str());
      std::exit(1);
    }
    for (transfer::Block& b : std::get<std::vector<transfer::Block>>(reply->body)) {
      if (Status s = transfer::CheckBlock(request, b, static_cast<uint32_t>(got.size()), true); !s.ok()) {
        std::fprintf(stderr, "check: %s\n", s.ToString().c_str());
        std::exit(1);
      }
      got.push_back(std::move(b));
    }
  }
  report("5 receiver: decode + checks (checksums)", MsSince(t0));
  received.clear();
  // 6. Receiver, engine thread: WriteKvBlocks block by block from the received buffers
  // (KvPulls::Finish), through the staging to the device.
  t0 = Clk::now();
  size_t k = 0;
  for (const transfer::Block& b : got) {
    for (size_t at = 0; at < bpb; at += half, ++k) {
      if (k >= 2) CUDA_OK(cudaEventSynchronize(ev[k % 2]));
      const size_t n = std::min<size_t>(half, bpb - at);
      std::memcpy(staging[k % 2], b.data[0].data() + at, n);
      CUDA_OK(cudaMemcpyAsync(static_cast<std::byte*>(dev) + uint64_t{b.index} * bpb + at, staging[k % 2], n,
                              cudaMemcpyHostToDevice, stream));
      CUDA_OK(cudaEventRecord(ev[k % 2], stream));
    }
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  report("6 receiver: H2D via staging, block by block", MsSince(t0));
  for (auto e : ev) cudaEventDestroy(e);
  for (auto s : staging) cudaFreeHost(s);
  cudaStreamDestroy(stream);
  cudaFree(dev);
}

// Contiguous: one run; scattered: each block at a random slot of a pool twice the run's size
// on both sides (one copy per block). Each figure is the median of 5 timed repetitions after
// one warm-up, start to both streams idle.
void PeerStages(uint32_t blocks, uint64_t bpb, int a, int b) {
  const uint64_t total = uint64_t{blocks} * bpb;
  const double gb = static_cast<double>(total) / 1e9;
  std::printf("same-host transports, GPU %d -> GPU %d, %u blocks x %llu bytes = %.3f GB:\n", a, b, blocks,
              static_cast<unsigned long long>(bpb), gb);
  int can = 0;
  CUDA_OK(cudaDeviceCanAccessPeer(&can, b, a));
  std::printf("peer access GPU %d -> %d: %s\n", b, a, can ? "yes" : "no");
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t sa, sb;
  CUDA_OK(cudaSetDevice(a));
  CUDA_OK(cudaMalloc(&src, 2 * total));
  CUDA_OK(cudaMemset(src, 0x3c, 2 * total));
  CUDA_OK(cudaStreamCreate(&sa));
  CUDA_OK(cudaSetDevice(b));
  CUDA_OK(cudaMalloc(&dst, 2 * total));
  CUDA_OK(cudaStreamCreate(&sb));
  if (can) {
    const cudaError_t e = cudaDeviceEnablePeerAccess(a, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CUDA_OK(e);
    cudaGetLastError();
  }
  std::vector<uint32_t> slots(2 * blocks);
  for (uint32_t i = 0; i < slots.size(); ++i) slots[i] = i;
  std::shuffle(slots.begin(), slots.end(), std::mt19937(7));
  auto at = [&](void* base, uint32_t i, bool scattered) {
    return static_cast<std::byte*>(base) + uint64_t{scattered ? slots[i] : i} * bpb;
  };
  auto timed = [&](const char* what, const auto& once) {
    std::vector<double> ms;
    for (int r = 0; r < 6; ++r) {
      const Clk::time_point t0 = Clk::now();
      once();
      CUDA_OK(cudaSetDevice(a));
      CUDA_OK(cudaStreamSynchronize(sa));
      CUDA_OK(cudaSetDevice(b));
      CUDA_OK(cudaStreamSynchronize(sb));
      if (r > 0) ms.push_back(MsSince(t0));
    }
    const double m = Median(ms);
    std::printf("  %-46s %8.2f ms  %7.1f GB/s\n", what, m, gb / (m / 1e3));
  };
  for (const bool scattered : {false, true}) {
    const char* shape = scattered ? "scattered" : "contiguous";
    // What a CUDA IPC pull does on the receiver: copies from the holder's (mapped) pool on B's
    // stream, one per run of consecutive blocks.
    timed((std::string("peer copy (CUDA IPC path), ") + shape).c_str(), [&] {
      CUDA_OK(cudaSetDevice(b));
      if (!scattered) {
        CUDA_OK(cudaMemcpyAsync(dst, src, total, cudaMemcpyDefault, sb));
      } else {
        for (uint32_t i = 0; i < blocks; ++i) {
          CUDA_OK(cudaMemcpyAsync(at(dst, i, true), at(src, i, true), bpb, cudaMemcpyDefault, sb));
        }
      }
    });
  }
#ifdef KVFLEET_HAVE_NCCL
  ncclComm_t comms[2];
  const int devs[2] = {a, b};
  const Clk::time_point t0 = Clk::now();
  if (ncclResult_t r = ncclCommInitAll(comms, 2, devs); r != ncclSuccess) {
    std::printf("  NCCL: ncclCommInitAll failed: %s\n", ncclGetErrorString(r));
  } else {
    std::printf("  %-46s %8.2f ms\n", "NCCL communicator set-up (2 ranks)", MsSince(t0));
    for (const bool scattered : {false, true}) {
      const char* shape = scattered ? "scattered" : "contiguous";
      timed((std::string("NCCL send/recv, ") + shape).c_str(), [&] {
        ncclGroupStart();
        const uint32_t n = scattered ? blocks : 1;
        const uint64_t bytes = scattered ? bpb : total;
        for (uint32_t i = 0; i < n; ++i) {
          ncclSend(at(src, i, scattered), bytes, ncclInt8, 1, comms[0], sa);
          ncclRecv(at(dst, i, scattered), bytes, ncclInt8, 0, comms[1], sb);
        }
        if (ncclResult_t r = ncclGroupEnd(); r != ncclSuccess) {
          std::fprintf(stderr, "NCCL: %s\n", ncclGetErrorString(r));
          std::exit(1);
        }
      });
    }
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  }
#else
  std::printf("  NCCL: not built (no nccl.h)\n");
#endif
  CUDA_OK(cudaSetDevice(a));
  cudaStreamDestroy(sa);
  cudaFree(src);
  CUDA_OK(cudaSetDevice(b));
  cudaStreamDestroy(sb);
  cudaFree(dst);
}

}  // namespace kvfleet::bench
