#include <algorithm>

#include "kernels/lora.cuh"

namespace kvfleet::kernels {

cudaError_t LaunchLoraShrink(const LoraShrinkParams& p, cudaStream_t stream) {
  if (p.groups.num_tiles <= 0) return cudaSuccess;
  const int width = p.segments * p.max_rank;
  const int groups = (width + lora::kShrinkCols - 1) / lora::kShrinkCols;
  if (p.in <= 0 || p.in % 8 != 0 || p.max_rank < 8 || p.max_rank > kLoraMaxRank || p.max_rank % 8 != 0 ||
      p.segments < 1 || p.segments > kLoraMaxSegments || p.splits < 1 ||
      p.splits > std::max(1, p.in / (kLoraSplitChunk * kLoraMinSplitRounds)) ||
      (p.splits > 1 && (p.counters == nullptr || int64_t{p.groups.num_tiles} * groups > kLoraShrinkTargetBlocks)) ||
      (reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.a)) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(p.groups.num_tiles), static_cast<unsigned>(groups),
                  static_cast<unsigned>(p.splits));
  return LaunchKernel(lora::LoraShrinkKernel, grid, lora::kShrinkWarps * 32, 0, stream, p);
}

cudaError_t LaunchLoraExpand(const LoraExpandParams& p, cudaStream_t stream) {
  if (p.groups.num_tiles <= 0 || p.out <= 0) return cudaSuccess;
  bool segments_ok = p.segments >= 1 && p.segments <= kLoraMaxSegments && p.seg_end[p.segments - 1] == p.out;
  for (int s = 0; segments_ok && s < p.segments; ++s) segments_ok = p.seg_end[s] % 8 == 0;
  if (!segments_ok || p.max_rank < 8 || p.max_rank > kLoraMaxRank || p.max_rank % 8 != 0 || p.splits < 1 ||
      p.col0 < 0 || p.col0 % 8 != 0 || p.y_stride % 8 != 0 || p.col0 + p.out > p.y_stride ||
      (reinterpret_cast<uintptr_t>(p.b) | reinterpret_cast<uintptr_t>(p.y)) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(p.groups.num_tiles),
                  static_cast<unsigned>((p.out + lora::kExpandCols - 1) / lora::kExpandCols));
  return LaunchKernel(lora::LoraExpandKernel, grid, lora::kExpandWarps * 32, 0, stream, p);
}

}  // namespace kvfleet::kernels
