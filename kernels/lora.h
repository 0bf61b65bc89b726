// Batched multi-adapter LoRA (S-LoRA / Punica's SGMV and BGMV, "Punica: Multi-Tenant LoRA
// Serving", Chen et al. 2023): token rows of one step use different adapters, each held in a
// device slot, and a row without an adapter is left alone. A targeted projection
// y = x·Wᵀ becomes y += scaling_slot · (x·A_slotᵀ)·B_slotᵀ in two launches:
//   shrink: t[row][seg·R + r] = x[row] · A_slot[seg·R + r]              r < rank_slot
//   expand: y[row][col0 + j] = bf16(y[row][col0 + j] + scaling_slot · Σ_r t[row][seg(j)·R + r] · B_slot[j][r])
// with fp32 accumulation. Fused outputs take several targets in one launch: the shrink's A
// stacks each target's rank rows ([q|k|v]: 3R rows), and output column j belongs to segment
// seg(j) (its target: seg_end bounds), whose R-wide part of t it reads.
//
// The shrink cuts `in` into `splits` slices (LoraShrinkSplits) so that a step with few tiles
// still launches enough blocks; each block writes fp32 partial sums of its slice, and the last
// block of a tile to finish adds them in slice order into the first slice's place
// (deterministic: the atomics only count the finished blocks, no value is added atomically).
//
// One kernel pair serves decode and prefill: the rows that have an adapter are grouped by slot
// and cut into tiles of at most kLoraMaxTileRows rows of one slot (LoraGroupsHost, lora_ref.h
// builds them), the 16 rows of a tensor-core fragment, so a slot's A and B are read once per
// tile rather than once per row (BGMV's cost at large batches), while a decode step with many
// slots still gets one tile per slot. Both kernels run on mma.sync (lora.cuh says how). t
// stays fp32 and y is rounded once, as PEFT computes an adapter over a bf16 base model (its
// autocast_adapter_dtype default keeps the adapter's math in fp32). Framework-free: raw
// pointers, every shape in a comment; shape checks live in the backend. CPU reference:
// lora_ref.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/lora_common.h"

namespace kvfleet::kernels {

// The step's rows with an adapter, grouped by slot and tiled. Device arrays.
struct LoraGroups {
  const int32_t* rows = nullptr;        // [num_grouped]: token rows, grouped by slot
  const int32_t* tile_begin = nullptr;  // [num_tiles + 1]: tile i is rows[tile_begin[i], tile_begin[i + 1])
  const int32_t* tile_slot = nullptr;   // [num_tiles]: the slot of every row of tile i
  int32_t num_tiles = 0;
};

struct LoraShrinkParams {
  const __nv_bfloat16* x = nullptr;  // [num_tokens][in]
  // [num_slots][segments · R][in]: each segment's lora_A, its rows past the slot's rank unread.
  const __nv_bfloat16* a = nullptr;
  const int32_t* slot_rank = nullptr;  // [num_slots]: 1..R
  // [num_grouped][splits][segments · R]: partial sums, indexed by a row's position in
  // groups.rows; r < rank written, and split 0 holds their sum when the kernel ends.
  // LoraShrinkScratchFloats floats suffice.
  float* t = nullptr;
  // [kLoraShrinkTargetBlocks]: zero before the first launch, left zero by every launch; only
  // read when splits > 1.
  int32_t* counters = nullptr;
  int32_t in = 0;
  int32_t max_rank = 0;  // R: the slots' row stride
  int32_t segments = 1;  // 1..kLoraMaxSegments
  int32_t splits = 1;    // slices of `in`: LoraShrinkSplits(groups.num_tiles, in, segments · R)
  LoraGroups groups;
};

struct LoraExpandParams {
  const float* t = nullptr;  // [num_grouped][splits][segments · R]: the shrink's output (split 0 read)
  // [num_slots][out][R]: the segments' lora_B stacked by output column, columns past the
  // slot's rank unread.
  const __nv_bfloat16* b = nullptr;
  const int32_t* slot_rank = nullptr;   // [num_slots]
  const float* slot_scaling = nullptr;  // [num_slots]
  __nv_bfloat16* y = nullptr;           // [num_tokens][y_stride]: columns [col0, col0 + out) updated
  int32_t y_stride = 0;
  int32_t col0 = 0;
  int32_t out = 0;       // columns over every segment
  int32_t max_rank = 0;  // R
  int32_t segments = 1;
  int32_t splits = 1;  // the shrink's
  // seg_end[s]: one past segment s's last column (within [0, out)); seg_end[segments - 1] == out.
  int32_t seg_end[kLoraMaxSegments] = {0, 0, 0};
  LoraGroups groups;
};

// REQUIRES: in % 8 == 0, x and a 16-byte aligned, 8 <= max_rank <= kLoraMaxRank with
// max_rank % 8 == 0, 1 <= splits <= max(1, in / (kLoraSplitChunk · kLoraMinSplitRounds)),
// counters given and num_tiles · ceil(segments · R / kLoraShrinkCols) <= kLoraShrinkTargetBlocks
// when splits > 1, every tile at most kLoraMaxTileRows rows; t must not alias x.
// cudaErrorInvalidValue for a bad shape.
cudaError_t LaunchLoraShrink(const LoraShrinkParams& p, cudaStream_t stream);
// REQUIRES: max_rank % 8 == 0, every segment's columns, col0 and y_stride multiples of 8 (a
// fragment's n8 lies in one segment; y is updated 16 bytes at a time), b and y 16-byte
// aligned; the groups and t of the shrink before it; y must not alias t.
cudaError_t LaunchLoraExpand(const LoraExpandParams& p, cudaStream_t stream);

}  // namespace kvfleet::kernels
