// The cuda backend's KvNccl (worker/backend/kv_nccl.h): whole bf16 KV blocks sent to, or
// received from, another worker's cuda backend by NCCL point-to-point (ncclSend/ncclRecv, one
// per block and pool, in one group), on a stream of its own after the engine's stream.
//
// One thread owned by the object does all the NCCL work: ncclCommInitRankConfig in
// non-blocking mode, polled with ncclCommGetAsyncError and aborted (ncclCommAbort) when the
// transfer's timeout passes, so a peer that never joins costs a timeout, never a hang; then the
// group of sends or receives, polled to its end the same way. The engine thread only records
// an event on its stream (Submit) and takes the results (TakeDone).
//
// Thread safety: thread-safe (kv_nccl.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/backend/kv_nccl.h"

namespace kvfleet::backend::cuda {

// The KV pools a KvNccl moves blocks of, and the engine's stream.
struct KvNcclPools {
  int device = 0;
  std::vector<std::byte*> pools;         // [pool]: device memory, device_blocks × bytes_per_block
  std::vector<uint64_t> bytes_per_block; // [pool]
  std::vector<int64_t> device_blocks;    // [pool]
  cudaStream_t engine_stream = nullptr;  // a send starts after the work queued on it so far
};

// Unimplemented in a build without NCCL (cmake/KvfleetDeps.cmake).
Result<std::unique_ptr<KvNccl>> MakeCudaKvNccl(KvNcclPools pools, std::function<void()> on_done);

}  // namespace kvfleet::backend::cuda
