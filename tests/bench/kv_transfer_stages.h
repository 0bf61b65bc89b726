// The stages of a KV pull, each timed alone over one pull's bytes (kv_transfer_bench), and
// the helpers the bench's two files share.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Exits with the call, the place and CUDA's message when `call` fails: a bench has no one to
// return an error to.
#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

namespace kvfleet::bench {

using Clk = std::chrono::steady_clock;
inline double MsSince(Clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clk::now() - t0).count();
}
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The TCP path's stages as a pull streams them, a frame (BlocksPerFrame blocks) at a time:
// the holder's reads through pinned staging into reused frame buffers, checksums and checks,
// Cap'n Proto frames, ZeroMQ on loopback, the receiver's in-place decode and checks, and its
// writes from the received frames through the staging; `blocks` blocks of `bpb` bytes.
void StageBreakdown(uint32_t blocks, uint64_t bpb, uint32_t block_size);

// The two same-host transports between GPU `a` (holder) and GPU `b` (receiver) over the same
// bytes: peer copies (the CUDA IPC path) and NCCL send/recv, contiguous and scattered.
void PeerStages(uint32_t blocks, uint64_t bpb, int a, int b);

}  // namespace kvfleet::bench
