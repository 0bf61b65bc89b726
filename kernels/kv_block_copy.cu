#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/kv_block_copy.h"

namespace kvfleet::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread (PCIe latency is long)

// Grid: x = slice of a block, y = pair.
__global__ void __launch_bounds__(kThreads) KvBlockCopyKernel(const uint4* src, uint4* dst, const int32_t* pairs,
                                                              int64_t block_vecs) {
  const int64_t s = pairs[2 * blockIdx.y], d = pairs[2 * blockIdx.y + 1];
  const uint4* from = src + s * block_vecs;
  uint4* to = dst + d * block_vecs;
  const int64_t stride = int64_t(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = int64_t(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < block_vecs; base += stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < block_vecs) v[u] = from[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < block_vecs) to[i] = v[u];
    }
  }
}

}  // namespace

cudaError_t LaunchKvBlockCopy(const void* src, void* dst, const int32_t* pairs, int32_t num_pairs,
                              int64_t block_bytes, cudaStream_t stream) {
  if (num_pairs <= 0) return cudaSuccess;
  if (block_bytes <= 0 || block_bytes % 16 != 0 || num_pairs > 65535) return cudaErrorInvalidValue;
  const int64_t vecs = block_bytes / 16;
  // Slices per block: enough blocks in total for a few waves, at least one per 1024 vectors.
  const int64_t per_slice = int64_t(kThreads) * kUnroll;
  int64_t slices = (vecs + per_slice - 1) / per_slice;
  slices = std::max<int64_t>(1, std::min<int64_t>(slices, (132 * 8 + num_pairs - 1) / num_pairs));
  KvBlockCopyKernel<<<dim3(static_cast<unsigned>(slices), num_pairs), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), pairs, vecs);
  KVF_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

}  // namespace kvfleet::kernels
