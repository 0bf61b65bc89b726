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
// Stacked rank rows (output columns of t) one shrink block computes: 8 n8 fragments.
constexpr int32_t kLoraShrinkCols = 64;
// Elements of `in` one round of a shrink block's 4 warps covers (a 32-wide chunk each).
constexpr int32_t kLoraSplitChunk = 128;
// Fewest rounds a slice of `in` takes, so that a block's warps each get work to overlap.
constexpr int32_t kLoraMinSplitRounds = 2;
// The shrink splits its reduction (in) across blocks until the grid has about this many
// blocks (4 warps each): a decode step's few tiles still spread over the device instead of
// walking all of `in` in a handful of blocks. Also the size of the counters array that
// orders the splits' final sum (LoraShrinkParams::counters).
constexpr int32_t kLoraShrinkTargetBlocks = 512;

// The number of slices of `in` the shrink cuts for num_tiles tiles of a width = segments · R
// output (lora.h): 1 for prefill-sized steps, more as the tiles get fewer. The expand must be
// given the same value. Depends only on its arguments, so a graphed step replays it. More
// than one only when num_tiles · ceil(width / kLoraShrinkCols) <= kLoraShrinkTargetBlocks / 2.
inline int32_t LoraShrinkSplits(int32_t num_tiles, int32_t in, int32_t width) {
  const int64_t groups = (width + kLoraShrinkCols - 1) / kLoraShrinkCols;
  const int32_t max_splits = in / (kLoraSplitChunk * kLoraMinSplitRounds);
  const int64_t blocks = int64_t{num_tiles > 0 ? num_tiles : 1} * (groups > 0 ? groups : 1);
  const int64_t s = kLoraShrinkTargetBlocks / blocks;
  return static_cast<int32_t>(s < 2 || max_splits < 2 ? 1 : s > max_splits ? max_splits : s);
}

// Floats of the shrink's partial sums for steps of at most max_tokens rows and outputs of at
// most `width` = segments · R: rows × splits × width. With one split that is max_tokens ·
// width; with more, splits · tiles · groups <= kLoraShrinkTargetBlocks, a tile holds at most
// kLoraMaxTileRows rows and a group kLoraShrinkCols columns.
inline int64_t LoraShrinkScratchFloats(int64_t max_tokens, int32_t width) {
  const int64_t one = max_tokens * width;
  const int64_t split = int64_t{kLoraMaxTileRows} * kLoraShrinkCols * kLoraShrinkTargetBlocks;
  return one > split ? one : split;
}

}  // namespace kvfleet::kernels
