// Limits shared by the LoRA kernels (lora.h), their CPU reference (lora_ref.h) and the
// backends that size device slots: plain C++, no CUDA. Thread-safe (constants).
#pragma once

#include <cstdint>

namespace kvfleet::kernels {

// Most rows of one tile: each row is one fp32 accumulator per rank row a warp computes.
constexpr int32_t kLoraMaxTileRows = 16;
// Most targets one launch covers (q, k, v).
constexpr int32_t kLoraMaxSegments = 3;
// Largest rank a slot holds (model::kMaxLoraRank).
constexpr int32_t kLoraMaxRank = 64;
// The shrink splits its reduction (in) across blocks until the grid has about this many
// blocks of 8 warps: 4 to 8 per SM on an H100/H200 (132 SMs), so a decode step with a few
// tiles still fills the device instead of walking all of `in` in a handful of blocks.
constexpr int32_t kLoraShrinkTargetBlocks = 1024;
// Fewest 8-element chunks of `in` a split takes: one per lane of the warp that reduces it.
constexpr int32_t kLoraMinSplitChunks = 32;

// The number of slices of `in` the shrink cuts for num_tiles tiles of a width = segments · R
// output (lora.h): 1 for prefill-sized steps, more as the tiles get fewer. The expand must be
// given the same value. Depends only on its arguments, so a graphed step replays it.
inline int32_t LoraShrinkSplits(int32_t num_tiles, int32_t in, int32_t width) {
  const int32_t rank_blocks = (width + 7) / 8;
  const int32_t max_splits = in / 8 / kLoraMinSplitChunks;
  const int64_t blocks = int64_t{num_tiles > 0 ? num_tiles : 1} * rank_blocks;
  const int64_t s = kLoraShrinkTargetBlocks / blocks;
  return static_cast<int32_t>(s < 1 ? 1 : s > max_splits ? (max_splits < 1 ? 1 : max_splits) : s);
}

// Floats of the shrink's partial sums for steps of at most max_tokens rows and outputs of at
// most `width` = segments · R: rows × splits × width. With one split that is max_tokens ·
// width; with more, splits · tiles · rank_blocks <= kLoraShrinkTargetBlocks and a tile holds
// at most kLoraMaxTileRows rows.
inline int64_t LoraShrinkScratchFloats(int64_t max_tokens, int32_t width) {
  const int64_t one = max_tokens * width;
  const int64_t split = int64_t{kLoraMaxTileRows} * kLoraShrinkTargetBlocks * 8;
  return one > split ? one : split;
}

}  // namespace kvfleet::kernels
