// The stages of a KV pull, each timed alone over one pull's bytes (kv_transfer_bench).
#pragma once

#include <cstdint>

namespace kvfleet::bench {

// The TCP path's stages: device-to-host staging, checksums, Cap'n Proto frames, ZeroMQ on
// loopback, decode and checks, host-to-device staging; `blocks` blocks of `bpb` bytes.
void StageBreakdown(uint32_t blocks, uint64_t bpb, uint32_t block_size);

// The two same-host transports between GPU `a` (holder) and GPU `b` (receiver) over the same
// bytes: peer copies (the CUDA IPC path) and NCCL send/recv, contiguous and scattered.
void PeerStages(uint32_t blocks, uint64_t bpb, int a, int b);

}  // namespace kvfleet::bench
