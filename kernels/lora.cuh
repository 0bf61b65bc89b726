// The LoRA shrink and expand kernels (lora.h). Device code; include from .cu files only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/lora.h"

namespace kvfleet::kernels::lora {

// Shrink: one warp per stacked rank row of A, kShrinkWarps of them per block; a block covers
// one tile and one slice of `in`, so its warps read the tile's x slice together (L1) while
// each streams its A row's slice with 16-byte loads, one 8-element chunk per lane at a time.
constexpr int kShrinkWarps = 8;
// Expand: one thread per output column; the tile's t rows (split partials summed) sit in
// shared memory.
constexpr int kExpandThreads = 256;
static_assert(kLoraMaxSegments == 3, "LoraExpandKernel finds a column's segment with two comparisons");

// grid (num_tiles, ceil(segments · R / kShrinkWarps), splits), block kShrinkWarps · 32.
__global__ void __launch_bounds__(kShrinkWarps * 32) LoraShrinkKernel(LoraShrinkParams p) {
  GridDependentsLaunch();
  const int tile = blockIdx.x, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int width = p.segments * p.max_rank;
  const int rr = blockIdx.y * kShrinkWarps + warp;  // row of the stacked A: seg · R + r
  const int begin = p.groups.tile_begin[tile];
  const int n = p.groups.tile_begin[tile + 1] - begin;
  const int slot = p.groups.tile_slot[tile];
  const int rank = p.slot_rank[slot];
  int rows[kLoraMaxTileRows];
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) rows[m] = m < n ? p.groups.rows[begin + m] : 0;
  // Every block waits, even one with nothing to do: a later kernel's wait covers this one's
  // predecessors only through it (PDL is not transitive otherwise).
  GridDependencyWait();
  if (rr >= width || rr % p.max_rank >= rank) return;
  // This split's chunks of 8 elements: [c0, c1) of in / 8, the same cut the expand assumes.
  const int chunks = p.in / 8;
  const int c0 = static_cast<int>(static_cast<int64_t>(split) * chunks / p.splits);
  const int c1 = static_cast<int>(static_cast<int64_t>(split + 1) * chunks / p.splits);
  const __nv_bfloat16* a = p.a + (static_cast<int64_t>(slot) * width + rr) * p.in;
  float acc[kLoraMaxTileRows];
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) acc[m] = 0.f;
  for (int c = (c0 + lane) * 8; c < c1 * 8; c += 32 * 8) {
    float af[8];
    Bf16x8ToFloat(__ldg(reinterpret_cast<const uint4*>(a + c)), af);
#pragma unroll
    for (int m = 0; m < kLoraMaxTileRows; ++m) {
      if (m < n) {
        float xf[8];
        Bf16x8ToFloat(__ldg(reinterpret_cast<const uint4*>(p.x + static_cast<int64_t>(rows[m]) * p.in + c)), xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[m] = fmaf(af[e], xf[e], acc[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) {
    if (m < n) {  // n is the same for the whole warp
      const float s = WarpSum(acc[m]);
      if (lane == 0) p.t[(static_cast<int64_t>(begin + m) * p.splits + split) * width + rr] = s;
    }
  }
}

// grid (num_tiles, ceil(out / kExpandThreads)), block kExpandThreads.
__global__ void __launch_bounds__(kExpandThreads) LoraExpandKernel(LoraExpandParams p) {
  __shared__ float ts[kLoraMaxTileRows][kLoraMaxSegments * kLoraMaxRank];
  GridDependentsLaunch();
  const int tile = blockIdx.x;
  const int width = p.segments * p.max_rank;
  const int begin = p.groups.tile_begin[tile];
  const int n = p.groups.tile_begin[tile + 1] - begin;
  const int slot = p.groups.tile_slot[tile];
  const int rank = p.slot_rank[slot];
  const float scaling = p.slot_scaling[slot];
  int rows[kLoraMaxTileRows];
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) rows[m] = m < n ? p.groups.rows[begin + m] : 0;
  const int j = blockIdx.y * kExpandThreads + threadIdx.x;
  // Constant indices only: a kernel parameter indexed at run time is copied to local memory.
  const int seg = (p.segments > 1 && j >= p.seg_end[0] ? 1 : 0) + (p.segments > 2 && j >= p.seg_end[1] ? 1 : 0);
  GridDependencyWait();
  // Only t[.][.][seg · R + r] with r < rank was written; nothing else is read. The splits are
  // added in order, so every run rounds alike.
  for (int i = threadIdx.x; i < n * width; i += kExpandThreads) {
    const int m = i / width, c = i % width;
    if (c % p.max_rank < rank) {
      const float* part = p.t + static_cast<int64_t>(begin + m) * p.splits * width + c;
      float sum = 0.f;
      for (int s = 0; s < p.splits; ++s) sum += part[static_cast<int64_t>(s) * width];
      ts[m][c] = sum;
    }
  }
  __syncthreads();
  if (j >= p.out) return;
  const __nv_bfloat16* brow = p.b + (static_cast<int64_t>(slot) * p.out + j) * p.max_rank;
  const float* tcol = &ts[0][seg * p.max_rank];
  float acc[kLoraMaxTileRows];
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) acc[m] = 0.f;
  for (int r = 0; r < rank; r += 8) {
    float bf[8];
    Bf16x8ToFloat(__ldg(reinterpret_cast<const uint4*>(brow + r)), bf);
    const int kk = min(8, rank - r);  // the same for every thread: rank is the tile's
#pragma unroll
    for (int m = 0; m < kLoraMaxTileRows; ++m) {
      if (m < n) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (e < kk) acc[m] = fmaf(tcol[m * kLoraMaxSegments * kLoraMaxRank + r + e], bf[e], acc[m]);
        }
      }
    }
  }
  // Every row's y is loaded before any is stored: the compiler cannot tell the rows apart, and
  // a load after each store would serialize n round trips to memory.
  float yv[kLoraMaxTileRows];
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) {
    if (m < n) yv[m] = __bfloat162float(p.y[static_cast<int64_t>(rows[m]) * p.y_stride + p.col0 + j]);
  }
#pragma unroll
  for (int m = 0; m < kLoraMaxTileRows; ++m) {
    if (m < n) p.y[static_cast<int64_t>(rows[m]) * p.y_stride + p.col0 + j] = __float2bfloat16(yv[m] + scaling * acc[m]);
  }
}

}  // namespace kvfleet::kernels::lora
