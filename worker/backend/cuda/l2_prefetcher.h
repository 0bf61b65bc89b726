// L2Prefetcher: the cuda backend's side stream for L2 prefetches (kernels/l2_prefetch.h).
// Prefetch forks the side stream from the step's stream at the point of the call, so the
// prefetch starts once the kernels enqueued so far are done and overlaps the kernels that
// come after; Join orders the step's stream after every prefetch since the last Join, which
// a CUDA graph's capture needs before it ends (a forked stream must rejoin its origin).
//
// Where the forward pass prefetches (cuda_forward.cc, tuning l2_prefetch): a layer's O
// weights once its QKV product is done (read by the O product after the attention), and the
// next layer's QKV weights once the gate/up product is done (read after the down product, the
// combine and the RMSNorm).
//
// Thread safety: thread-compatible, as CudaBackend (the engine thread, or a rank's thread).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "common/status.h"

namespace kvfleet::backend::cuda {

class L2Prefetcher {
 public:
  L2Prefetcher() = default;
  L2Prefetcher(const L2Prefetcher&) = delete;
  L2Prefetcher& operator=(const L2Prefetcher&) = delete;
  ~L2Prefetcher();

  // The side stream and its events, on the current device.
  Status Init();
  // [p, p + bytes) into L2 after what `stream` has enqueued so far. evict_last: see
  // kernels::LaunchL2Prefetch. A no-op before Init.
  Status Prefetch(cudaStream_t stream, const void* p, size_t bytes, bool evict_last);
  // `stream` waits for the prefetches enqueued since the last Join; none: nothing.
  Status Join(cudaStream_t stream);

 private:
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_ = nullptr;
  bool pending_ = false;
};

}  // namespace kvfleet::backend::cuda
