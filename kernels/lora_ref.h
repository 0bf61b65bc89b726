// CPU reference of the LoRA kernels (lora.h), and the host side of their row groups: the
// step's rows with an adapter grouped by slot and tiled (the backend uploads them). The
// reference takes each row's slot directly and accumulates in double; t stays fp32 and y is
// rounded to bf16 once, as in the kernels. Plain C++; thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/lora_common.h"

namespace kvfleet::kernels {

// LoraGroups (lora.h) on the host.
struct LoraGroupsHost {
  std::vector<int32_t> rows;        // token rows with a slot, grouped by slot (ascending), in row order
  std::vector<int32_t> tile_begin;  // [num_tiles + 1]
  std::vector<int32_t> tile_slot;   // [num_tiles]
  int32_t num_tiles() const { return static_cast<int32_t>(tile_slot.size()); }
};

// Groups the rows whose slot is >= 0 by slot and cuts each group into tiles of at most
// tile_rows rows. REQUIRES: 1 <= tile_rows <= kLoraMaxTileRows.
LoraGroupsHost GroupLoraRows(std::span<const int32_t> row_slot, int32_t tile_rows);

// The tile height for `grouped` rows with an adapter: kLoraMaxTileRows, the 16 rows of the
// kernels' mma fragment, or all the rows when there are fewer.
int32_t LoraTileRowsFor(int64_t grouped);

// t[row][seg · R + r] = x[row] · a[slot][seg · R + r] (fp32) for rows with slot >= 0 and r <
// slot_rank[slot]; other entries of t are left alone.
//   x: [T][in]; a: [slots][segments · R][in]; t: [T][segments · R].
void LoraShrinkRef(const bf16_bits* x, const bf16_bits* a, const int32_t* slot_rank, std::span<const int32_t> row_slot,
                   float* t, int32_t in, int32_t max_rank, int32_t segments);

// y[row][col0 + j] = bf16(y + scaling[slot] · Σ_{r < rank} t[row][seg(j) · R + r] · b[slot][j][r]) for
// rows with slot >= 0; seg(j) is the first s with j < seg_end[s].
//   t: [T][segments · R]; b: [slots][out][R]; y: [T][y_stride].
void LoraExpandRef(const float* t, const bf16_bits* b, const int32_t* slot_rank, const float* slot_scaling,
                   std::span<const int32_t> row_slot, bf16_bits* y, int32_t y_stride, int32_t col0, int32_t out,
                   int32_t max_rank, int32_t segments, const int32_t* seg_end);

}  // namespace kvfleet::kernels
