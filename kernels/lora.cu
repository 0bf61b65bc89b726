#include <algorithm>

#include "kernels/lora.cuh"

namespace kvfleet::kernels {

cudaError_t LaunchLoraShrink(const LoraShrinkParams& p, cudaStream_t stream) {
  if (p.groups.num_tiles <= 0) return cudaSuccess;
  if (p.in <= 0 || p.in % 8 != 0 || p.max_rank < 1 || p.max_rank > kLoraMaxRank || p.segments < 1 ||
      p.segments > kLoraMaxSegments || p.splits < 1 || p.splits > std::max(1, p.in / 8 / kLoraMinSplitChunks) ||
      (reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.a)) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int width = p.segments * p.max_rank;
  const dim3 grid(static_cast<unsigned>(p.groups.num_tiles), (width + lora::kShrinkWarps - 1) / lora::kShrinkWarps,
                  static_cast<unsigned>(p.splits));
  return LaunchKernel(lora::LoraShrinkKernel, grid, lora::kShrinkWarps * 32, 0, stream, p);
}

cudaError_t LaunchLoraExpand(const LoraExpandParams& p, cudaStream_t stream) {
  if (p.groups.num_tiles <= 0 || p.out <= 0) return cudaSuccess;
  if (p.max_rank < 8 || p.max_rank > kLoraMaxRank || p.max_rank % 8 != 0 || p.segments < 1 ||
      p.segments > kLoraMaxSegments || p.splits < 1 || p.seg_end[p.segments - 1] != p.out || p.col0 < 0 ||
      p.col0 + p.out > p.y_stride || reinterpret_cast<uintptr_t>(p.b) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(p.groups.num_tiles), (p.out + lora::kExpandThreads - 1) / lora::kExpandThreads);
  return LaunchKernel(lora::LoraExpandKernel, grid, lora::kExpandThreads, 0, stream, p);
}

}  // namespace kvfleet::kernels
