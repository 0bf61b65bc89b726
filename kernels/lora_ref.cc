#include "kernels/lora_ref.h"

#include <algorithm>
#include <numeric>

namespace kvfleet::kernels {

LoraGroupsHost GroupLoraRows(std::span<const int32_t> row_slot, int32_t tile_rows) {
  LoraGroupsHost g;
  for (int32_t r = 0; r < static_cast<int32_t>(row_slot.size()); ++r) {
    if (row_slot[r] >= 0) g.rows.push_back(r);
  }
  std::stable_sort(g.rows.begin(), g.rows.end(), [&](int32_t a, int32_t b) { return row_slot[a] < row_slot[b]; });
  g.tile_begin.push_back(0);
  for (size_t i = 0; i < g.rows.size();) {
    const int32_t slot = row_slot[g.rows[i]];
    size_t end = i;
    while (end < g.rows.size() && end - i < static_cast<size_t>(tile_rows) && row_slot[g.rows[end]] == slot) ++end;
    g.tile_slot.push_back(slot);
    g.tile_begin.push_back(static_cast<int32_t>(end));
    i = end;
  }
  return g;
}

int32_t LoraTileRowsFor(int64_t grouped) {
  // The kernels' tile is one mma fragment's 16 rows: fewer rows fill it no faster.
  return static_cast<int32_t>(grouped < 1 ? 1 : grouped < kLoraMaxTileRows ? grouped : kLoraMaxTileRows);
}

void LoraShrinkRef(const bf16_bits* x, const bf16_bits* a, const int32_t* slot_rank, std::span<const int32_t> row_slot,
                   float* t, int32_t in, int32_t max_rank, int32_t segments) {
  const int64_t width = int64_t{segments} * max_rank;
  for (size_t row = 0; row < row_slot.size(); ++row) {
    const int32_t slot = row_slot[row];
    if (slot < 0) continue;
    for (int64_t rr = 0; rr < width; ++rr) {
      if (rr % max_rank >= slot_rank[slot]) continue;
      const bf16_bits* arow = a + (slot * width + rr) * in;
      double acc = 0;
      for (int64_t c = 0; c < in; ++c) acc += double(Bf16ToFloat(arow[c])) * Bf16ToFloat(x[row * in + c]);
      t[row * width + rr] = static_cast<float>(acc);
    }
  }
}

void LoraExpandRef(const float* t, const bf16_bits* b, const int32_t* slot_rank, const float* slot_scaling,
                   std::span<const int32_t> row_slot, bf16_bits* y, int32_t y_stride, int32_t col0, int32_t out,
                   int32_t max_rank, int32_t segments, const int32_t* seg_end) {
  const int64_t width = int64_t{segments} * max_rank;
  for (size_t row = 0; row < row_slot.size(); ++row) {
    const int32_t slot = row_slot[row];
    if (slot < 0) continue;
    int32_t seg = 0;
    for (int64_t j = 0; j < out; ++j) {
      while (seg + 1 < segments && j >= seg_end[seg]) ++seg;
      const bf16_bits* brow = b + (int64_t{slot} * out + j) * max_rank;
      double acc = 0;
      for (int32_t r = 0; r < slot_rank[slot]; ++r) acc += double(t[row * width + seg * max_rank + r]) * Bf16ToFloat(brow[r]);
      bf16_bits& dst = y[row * y_stride + col0 + j];
      dst = FloatToBf16(Bf16ToFloat(dst) + slot_scaling[slot] * static_cast<float>(acc));
    }
  }
}

}  // namespace kvfleet::kernels
