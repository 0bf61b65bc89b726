// CudaBlockCopier: kv::BlockCopier over device pools and pinned host pools, through the
// batched block-copy kernel (kernels/kv_block_copy.h): a run of copies with the same
// (pool, source tier, destination tier) is one launch on the backend's stream, so copies
// are ordered before the next step's kernels without a host wait.
//
// The (source, destination) pairs go through a pinned buffer the kernel reads directly;
// Copy() waits for the previous call's launches before refilling it.
//
// Invariants:
//   1. Copies run in the order given: a run is cut where a copy would read or overwrite a
//      block an earlier copy of the run writes (the kernel copies a run in parallel).
//   2. No allocation after construction.
//
// Thread safety: thread-compatible; the engine thread calls it (block_copier.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/kv/block_copier.h"

namespace kvfleet::backend::cuda {

namespace config {
// Pairs per launch; a longer run is split. 64k pairs = 512 KiB pinned.
constexpr int32_t kMaxCopyPairs = 1 << 16;
}  // namespace config

class CudaBlockCopier final : public kv::BlockCopier {
 public:
  struct Pool {
    std::byte* device = nullptr;  // [device_blocks][bytes_per_block]
    std::byte* host = nullptr;    // pinned [host_blocks][bytes_per_block] or null
    uint64_t bytes_per_block = 0;
  };
  // `stream`: the backend's stream on CUDA device `device`.
  static Result<std::unique_ptr<CudaBlockCopier>> Make(std::vector<Pool> pools, cudaStream_t stream, int device);
  ~CudaBlockCopier() override;

  // Aborts (KVF_CHECK) on a CUDA error: the interface has no error path, and a failed copy
  // would leave the cache inconsistent.
  void Copy(std::span<const kv::BlockCopy> copies) override;

 private:
  CudaBlockCopier() = default;
  std::vector<Pool> pools_;
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
  int32_t* pairs_ = nullptr;  // pinned [kMaxCopyPairs][2]
  cudaEvent_t done_ = nullptr;
};

}  // namespace kvfleet::backend::cuda
