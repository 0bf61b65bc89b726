// kv_transfer_stages.h: each stage of a streamed TCP pull alone, and the same-host transports
// side by side.
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
#include "worker/transfer/transfer_service.h"

namespace kvfleet::bench {

namespace {

// One contiguous range between the device and host memory, at most a staging half.
struct Piece {
  std::byte* device = nullptr;
  std::byte* host = nullptr;
  size_t bytes = 0;
};

// As the cuda backend cuts a run of blocks (cuda_kv_transfer.cc AddPieces): ranges that are
// neighbours on both sides merged, then cut to the staging half's size.
void AddPieces(std::byte* device, std::byte* host, size_t bytes, size_t half, std::vector<Piece>* pieces) {
  if (!pieces->empty()) {
    Piece& last = pieces->back();
    if (last.device + last.bytes == device && last.host + last.bytes == host && last.bytes < half) {
      const size_t take = std::min(bytes, half - last.bytes);
      last.bytes += take;
      device += take;
      host += take;
      bytes -= take;
    }
  }
  for (size_t at = 0; at < bytes; at += half) pieces->push_back({device + at, host + at, std::min(half, bytes - at)});
}

}  // namespace

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
  const size_t half = 8ull << 20;  // a staging half, as the cuda backend's (kTransferStagingBytes)
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

  // The request these blocks answer, for the checks, and the frames a holder cuts it into.
  transfer::PullRequest request;
  request.transfer_id = 1;
  request.model = "bench";
  request.block_size = block_size;
  request.layout.block_size = block_size;
  request.layout.pools = {transfer::PoolGeometry{0, 1, 1, 1, bpb}};
  request.deadline_ms = 1000;
  std::vector<std::vector<TokenId>> tokens(blocks);
  for (uint32_t i = 0; i < blocks; ++i) {
    request.hashes.push_back(1000 + i);
    tokens[i].assign(block_size, static_cast<TokenId>(i));
  }
  const uint32_t per_frame = transfer::BlocksPerFrame(request.layout);

  // 1-3. Holder, a frame at a time (serve_streams.cc, serving.cc): the engine thread reads the
  // frame's blocks into one of kFramesAhead reused buffers (ReadKvBlocks: the stream synced,
  // pieces through the staging halves); the I/O thread checksums and checks them as views over
  // the buffer and encodes the frame. Each stage's time is summed over the frames. The buffers
  // are mapped beforehand, as a worker keeps its spare ones from pull to pull.
  std::vector<std::byte> buffers[transfer::config::kFramesAhead];
  for (auto& b : buffers) b.assign(uint64_t{per_frame} * bpb, std::byte{1});
  double read_ms = 0, check_ms = 0, encode_ms = 0;
  std::vector<std::string> frames;
  std::vector<Piece> pieces;
  for (uint32_t first = 0; first < blocks; first += per_frame) {
    const uint32_t n = std::min(per_frame, blocks - first);
    std::byte* buffer = buffers[frames.size() % transfer::config::kFramesAhead].data();
    Clk::time_point t0 = Clk::now();
    pieces.clear();
    for (uint32_t i = 0; i < n; ++i) {
      AddPieces(static_cast<std::byte*>(dev) + uint64_t{first + i} * bpb, buffer + uint64_t{i} * bpb, bpb, half,
                &pieces);
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    for (size_t k = 0; k <= pieces.size(); ++k) {
      if (k < pieces.size()) {
        CUDA_OK(cudaMemcpyAsync(staging[k % 2], pieces[k].device, pieces[k].bytes, cudaMemcpyDeviceToHost, stream));
        CUDA_OK(cudaEventRecord(ev[k % 2], stream));
      }
      if (k > 0) {
        CUDA_OK(cudaEventSynchronize(ev[(k - 1) % 2]));
        std::memcpy(pieces[k - 1].host, staging[(k - 1) % 2], pieces[k - 1].bytes);
      }
    }
    read_ms += MsSince(t0);
    t0 = Clk::now();
    std::vector<transfer::BlockView> views(n);
    for (uint32_t i = 0; i < n; ++i) {
      transfer::BlockView& v = views[i];
      v.index = first + i;
      v.hash = request.hashes[first + i];
      v.tokens = tokens[first + i];
      v.data = {std::span<const std::byte>(buffer + uint64_t{i} * bpb, bpb)};
      v.checksums = {transfer::Checksum(v.data[0])};
      if (Status s = transfer::CheckBlock(request, v, first + i, false); !s.ok()) {
        std::fprintf(stderr, "check: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    check_ms += MsSince(t0);
    t0 = Clk::now();
    std::string frame = transfer::EncodeBlocks(1, views);
    encode_ms += MsSince(t0);
    // Stage 4 sends a copy: this frame's memory goes back to malloc for the next encode, as a
    // holder's does once libzmq has sent it (not 1 GB of fresh pages).
    frames.push_back(frame);
  }
  report("1 holder: D2H via staging into reused frames", read_ms);
  report("2 holder: XXH3 checksums + checks", check_ms);
  report("3 holder: capnp encode, a frame a call", encode_ms);
  std::printf("      (%zu frames of up to %u blocks)\n", frames.size(), per_frame);

  // 4. The frames over ZeroMQ on loopback TCP, sender on its own thread (as the I/O threads).
  // The receiver drops each frame as it comes, as a pull does once its blocks are written, so
  // libzmq's next receive buffer reuses its memory; stages 5 and 6 read the same bytes from
  // the sender's frames.
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
    const Clk::time_point t0 = Clk::now();
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
    }
    sender.join();
    report("4 zmq DEALER<-ROUTER over tcp 127.0.0.1", MsSince(t0));
  }
  // 5. Receiver, I/O thread: each frame decoded in place (its blocks views over it), every
  // block checked, checksums included (puller.cc); the views are what stage 6 writes from.
  std::vector<transfer::BlockFrame> arrived(frames.size());
  uint32_t next = 0;
  Clk::time_point t0 = Clk::now();
  for (size_t f = 0; f < frames.size(); ++f) {
    auto reply = transfer::DecodePullReply(frames[f].data(), frames[f].size(), &arrived[f]);
    if (!reply.ok()) {
      std::fprintf(stderr, "decode: %s\n", reply.status().ToString().c_str());
      std::exit(1);
    }
    for (const transfer::BlockView& b : arrived[f].blocks) {
      if (Status s = transfer::CheckBlock(request, b, next++, true); !s.ok()) {
        std::fprintf(stderr, "check: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
  }
  report("5 receiver: decode in place, checks, XXH3", MsSince(t0));
  // 6. Receiver, engine thread: each frame's blocks written straight from the received frame,
  // one call a frame (WriteKvBlocksFrom: each piece's memcpy into a staging half overlaps the
  // previous piece's DMA, then the stream is synced).
  t0 = Clk::now();
  for (const transfer::BlockFrame& f : arrived) {
    pieces.clear();
    for (const transfer::BlockView& b : f.blocks) {
      AddPieces(static_cast<std::byte*>(dev) + uint64_t{b.index} * bpb, const_cast<std::byte*>(b.data[0].data()), bpb,
                half, &pieces);
    }
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (k >= 2) CUDA_OK(cudaEventSynchronize(ev[k % 2]));
      std::memcpy(staging[k % 2], pieces[k].host, pieces[k].bytes);
      CUDA_OK(cudaMemcpyAsync(pieces[k].device, staging[k % 2], pieces[k].bytes, cudaMemcpyHostToDevice, stream));
      CUDA_OK(cudaEventRecord(ev[k % 2], stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  report("6 receiver: H2D via staging, a frame a call", MsSince(t0));
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
