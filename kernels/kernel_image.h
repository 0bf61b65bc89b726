// Whether this build's kernels can run on a GPU: the question `kvfleet-worker --backend auto`
// asks before it picks the cuda backend (worker/backend/backend.h, ChooseBackend).
//
// Thread safety: thread-safe (sets the calling thread's current device).
#pragma once

#include <cuda_runtime_api.h>

namespace kvfleet::kernels {

// cudaSuccess when this build's kernels run on `device`; else CUDA's error, e.g.
// cudaErrorNoKernelImageForDevice when no target of the build (KVFLEET_CUDA_GENCODE) fits
// the device's compute capability. Probes a kernel compiled like all the others.
cudaError_t CheckKernelImage(int device);

}  // namespace kvfleet::kernels
