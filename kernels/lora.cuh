// The LoRA shrink and expand kernels (lora.h). Device code; include from .cu files only.
//
// Both run on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulation; kernels/mma.cuh):
// a tile's at most 16 rows are the m16 rows of one fragment. The fragments are loaded straight
// from global memory, with the reduction dimension permuted the same way for both operands so
// that each lane reads 16 contiguous bytes (shrink) or 8 (expand) instead of 4:
//   shrink, one 32-wide chunk of `in` at k0: lane q = lane % 4 loads elements
//     [k0 + 8q, k0 + 8q + 8) of its x row and of its A row; the first mma takes elements 0-3
//     (fragment k 2q, 2q+1 <- +0, +1; 2q+8, 2q+9 <- +2, +3), the second elements 4-7.
//   expand, ranks [16s, 16s + 16): lane q holds ranks 16s + 4q + {0, 1} at fragment k 2q, 2q+1
//     and 16s + 4q + {2, 3} at 2q+8, 2q+9, of t and of its B row alike.
// A sum does not depend on the order of its terms' positions, so the products are the same
// as the unpermuted ones.
//
// t stays fp32 between the two: the expand splits each t value into bf16 hi + lo (hi =
// bf16(t), lo = bf16(t - hi), 16 bits of mantissa together) and runs one mma for each, so
// t · B is within about 2^-16 of its fp32 product, as PEFT's fp32 adapter math computes it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/lora.h"
#include "kernels/mma.cuh"

namespace kvfleet::kernels::lora {

// Shrink: a block takes one tile, kShrinkCols stacked rank rows of A (8 n8 fragments) and one
// slice of `in`; its warps take the slice's 32-wide chunks in turn and add their partial sums
// in warp order through shared memory.
constexpr int kShrinkWarps = 4;
constexpr int kShrinkCols = 64;
// Expand: a block takes one tile and kExpandCols output columns, kExpandWarpCols (8 n8
// fragments) per warp; in the epilogue a lane adds to kExpandItems runs of 8 columns of a row.
constexpr int kExpandWarps = 4;
constexpr int kExpandCols = 256;
constexpr int kExpandWarpCols = kExpandCols / kExpandWarps;
constexpr int kExpandWarpTiles = kExpandWarpCols / 8;
constexpr int kExpandChunks = kExpandWarpCols / 8;                         // 8-column runs of a row
constexpr int kExpandItems = kLoraMaxTileRows * kExpandChunks / 32;       // per lane
static_assert(kLoraMaxTileRows == 16, "a tile is the 16 rows of one mma fragment");
static_assert(kLoraMaxSegments == 3, "LoraExpandKernel finds a fragment's segment with two comparisons");
static_assert(kLoraShrinkCols == kShrinkCols && kLoraSplitChunk == 32 * kShrinkWarps,
              "lora_common.h's sizes are the kernels'");

// The tile's rows: m-th row of tile `tile`, or -1 past its end.
__device__ __forceinline__ int TileRow(const LoraGroups& g, int begin, int n, int m) {
  return m < n ? g.rows[begin + m] : -1;
}

// grid (num_tiles, ceil(segments · R / kShrinkCols), splits), block kShrinkWarps · 32.
__global__ void __launch_bounds__(kShrinkWarps * 32) LoraShrinkKernel(LoraShrinkParams p) {
  __shared__ float part[kShrinkWarps][kLoraMaxTileRows][kShrinkCols];
  __shared__ int last;
  GridDependentsLaunch();
  const int tile = blockIdx.x, group = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int width = p.segments * p.max_rank;
  const int begin = p.groups.tile_begin[tile];
  const int n = p.groups.tile_begin[tile + 1] - begin;
  const int slot = p.groups.tile_slot[tile];
  const int row_lo = TileRow(p.groups, begin, n, g), row_hi = TileRow(p.groups, begin, n, g + 8);
  // Every block waits, even one with nothing to do: a later kernel's wait covers this one's
  // predecessors only through it (PDL is not transitive otherwise).
  GridDependencyWait();
  if (n == 0) return;
  const int rank = p.slot_rank[slot];
  // n8 fragment j covers stacked rows [col0 + 8j, col0 + 8j + 8): one segment's (R % 8 == 0),
  // skipped past the slot's rank (its A rows are zero, and t there is never read).
  const int col0 = group * kShrinkCols;
  bool active[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) active[j] = col0 + 8 * j < width && (col0 + 8 * j) % p.max_rank < rank;
  const __nv_bfloat16* a = p.a + (static_cast<int64_t>(slot) * width + col0 + g) * p.in + 8 * q;
  const __nv_bfloat16* x_lo = p.x + static_cast<int64_t>(row_lo < 0 ? 0 : row_lo) * p.in + 8 * q;
  const __nv_bfloat16* x_hi = p.x + static_cast<int64_t>(row_hi < 0 ? 0 : row_hi) * p.in + 8 * q;
  float acc[8][4] = {};
  const int chunks = (p.in + 31) / 32;
  const int c0 = static_cast<int>(static_cast<int64_t>(split) * chunks / p.splits);
  const int c1 = static_cast<int>(static_cast<int64_t>(split + 1) * chunks / p.splits);
  for (int c = c0 + warp; c < c1; c += kShrinkWarps) {
    const int k = 32 * c;
    const bool in_range = k + 8 * q < p.in;  // in % 8 == 0: a lane's 8 elements are all in or all out
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 xl = in_range && row_lo >= 0 ? __ldg(reinterpret_cast<const uint4*>(x_lo + k)) : zero;
    const uint4 xh = in_range && row_hi >= 0 ? __ldg(reinterpret_cast<const uint4*>(x_hi + k)) : zero;
    const uint32_t f0[4] = {xl.x, xh.x, xl.y, xh.y}, f1[4] = {xl.z, xh.z, xl.w, xh.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (!active[j]) continue;  // the same for the whole warp
      const uint4 w = in_range ? __ldg(reinterpret_cast<const uint4*>(a + static_cast<int64_t>(8 * j) * p.in + k)) : zero;
      Mma(acc[j], f0, w.x, w.y);
      Mma(acc[j], f1, w.z, w.w);
    }
  }
  // The warps' partial sums, added in warp order.
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    part[warp][g][8 * j + 2 * q] = acc[j][0];
    part[warp][g][8 * j + 2 * q + 1] = acc[j][1];
    part[warp][g + 8][8 * j + 2 * q] = acc[j][2];
    part[warp][g + 8][8 * j + 2 * q + 1] = acc[j][3];
  }
  __syncthreads();
  // t[(begin + m) · splits + split][col0 + c] for the rows of the tile and the columns below
  // the slot's rank.
  auto entry = [&](int i, int* m, int* rr) {
    *m = i / kShrinkCols;
    *rr = col0 + i % kShrinkCols;
    return *m < n && *rr < width && *rr % p.max_rank < rank;
  };
  for (int i = threadIdx.x; i < kLoraMaxTileRows * kShrinkCols; i += kShrinkWarps * 32) {
    int m, rr;
    if (!entry(i, &m, &rr)) continue;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kShrinkWarps; ++w) s += part[w][m][i % kShrinkCols];
    p.t[(static_cast<int64_t>(begin + m) * p.splits + split) * width + rr] = s;
  }
  if (p.splits == 1) return;
  // The last of the tile's splits to finish adds all of them, in split order, into split 0's
  // place (threadFenceReduction): t is final when the kernel ends, and every run rounds alike.
  __threadfence();
  __syncthreads();
  int* counter = p.counters + tile * gridDim.y + group;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == p.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < kLoraMaxTileRows * kShrinkCols; i += kShrinkWarps * 32) {
    int m, rr;
    if (!entry(i, &m, &rr)) continue;
    float* t = p.t + static_cast<int64_t>(begin + m) * p.splits * width + rr;
    float s = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) s += __ldcg(t + static_cast<int64_t>(sp) * width);
    *t = s;
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch (and a graph's replay)
}

// grid (num_tiles, ceil(out / kExpandCols)), block kExpandWarps · 32.
//
// A decode step's expand sits on the critical path between the base product and the next
// kernel, so its loads come in three rounds: the tile's bounds and slot; its rows, rank and
// scaling; then t, the first 16 ranks of B and y together. The sums leave through shared
// memory so that each lane adds to 16 contiguous bytes of a y row.
__global__ void __launch_bounds__(kExpandWarps * 32) LoraExpandKernel(LoraExpandParams p) {
  __shared__ float ts[kLoraMaxTileRows][kLoraMaxSegments * kLoraMaxRank];
  __shared__ float stage[kExpandWarps][kLoraMaxTileRows][kExpandWarpCols];
  GridDependentsLaunch();
  const int tile = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int width = p.segments * p.max_rank;
  const int begin = p.groups.tile_begin[tile];
  const int n = p.groups.tile_begin[tile + 1] - begin;
  const int slot = p.groups.tile_slot[tile];
  // Each lane's rows in the epilogue: row m = (lane + 32 i) / kExpandChunks of the tile.
  int rows[kExpandItems];
#pragma unroll
  for (int i = 0; i < kExpandItems; ++i) rows[i] = TileRow(p.groups, begin, n, (lane + 32 * i) / kExpandChunks);
  const int rank = n > 0 ? p.slot_rank[slot] : 0;  // written by the host's slot uploads, not by a kernel
  const float scaling = n > 0 ? p.slot_scaling[slot] : 0.f;
  GridDependencyWait();
  if (n == 0) return;
  const int col_warp = blockIdx.y * kExpandCols + warp * kExpandWarpCols;  // this warp's first column
  // The first 16 ranks of B for each fragment (lane: column col + g, ranks 4q..4q+3).
  uint2 b0[kExpandWarpTiles];
#pragma unroll
  for (int j = 0; j < kExpandWarpTiles; ++j) {
    const int col = col_warp + 8 * j;
    b0[j] = col < p.out && 4 * q < p.max_rank
                ? __ldg(reinterpret_cast<const uint2*>(p.b + (static_cast<int64_t>(slot) * p.out + col + g) * p.max_rank + 4 * q))
                : make_uint2(0, 0);
  }
  // y: 16 bytes (8 columns) of one row per item.
  uint4 yv[kExpandItems];
#pragma unroll
  for (int i = 0; i < kExpandItems; ++i) {
    const int col = col_warp + 8 * ((lane + 32 * i) % kExpandChunks);
    yv[i] = rows[i] >= 0 && col < p.out
                ? *reinterpret_cast<const uint4*>(p.y + static_cast<int64_t>(rows[i]) * p.y_stride + p.col0 + col)
                : make_uint4(0, 0, 0, 0);
  }
  // The tile's t (split 0 holds the final sums), zero past the rows and the slot's rank.
  for (int i = threadIdx.x; i < kLoraMaxTileRows * width; i += kExpandWarps * 32) {
    const int m = i / width, c = i % width;
    ts[m][c] = m < n && c % p.max_rank < rank ? p.t[static_cast<int64_t>(begin + m) * p.splits * width + c] : 0.f;
  }
  __syncthreads();
  const int steps = (rank + 15) / 16;
#pragma unroll
  for (int j = 0; j < kExpandWarpTiles; ++j) {
    const int col = col_warp + 8 * j;  // the fragment's first column
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if (col < p.out) {  // the same for the whole warp; out % 8 == 0
      // Constant indices only: a kernel parameter indexed at run time is copied to local memory.
      const int seg = (p.segments > 1 && col >= p.seg_end[0] ? 1 : 0) + (p.segments > 2 && col >= p.seg_end[1] ? 1 : 0);
      const float* t_lo = &ts[g][seg * p.max_rank];
      const float* t_hi = &ts[g + 8][seg * p.max_rank];
      const __nv_bfloat16* brow = p.b + (static_cast<int64_t>(slot) * p.out + col + g) * p.max_rank;
      for (int s = 0; s < steps; ++s) {
        // This lane's 4 ranks; R % 8 == 0, so all are below R or none (then zeros: the mma is
        // the whole warp's, every lane takes part).
        const int r = 16 * s + 4 * q;
        const bool valid = r < p.max_rank;
        const uint2 bw = s == 0 ? b0[j] : valid ? __ldg(reinterpret_cast<const uint2*>(brow + r)) : make_uint2(0, 0);
        const float4 zero4 = make_float4(0.f, 0.f, 0.f, 0.f);
        const float4 vl = valid ? *reinterpret_cast<const float4*>(t_lo + r) : zero4;
        const float4 vh = valid ? *reinterpret_cast<const float4*>(t_hi + r) : zero4;
        // bf16 hi + lo of each t value; fragment: {row g k 2q.., row g+8 k 2q.., row g k 2q+8.., row g+8 k 2q+8..}.
        const __nv_bfloat162 hl01 = __floats2bfloat162_rn(vl.x, vl.y), hh01 = __floats2bfloat162_rn(vh.x, vh.y);
        const __nv_bfloat162 hl23 = __floats2bfloat162_rn(vl.z, vl.w), hh23 = __floats2bfloat162_rn(vh.z, vh.w);
        const float2 rl01 = __bfloat1622float2(hl01), rh01 = __bfloat1622float2(hh01);
        const float2 rl23 = __bfloat1622float2(hl23), rh23 = __bfloat1622float2(hh23);
        const uint32_t hi[4] = {*reinterpret_cast<const uint32_t*>(&hl01), *reinterpret_cast<const uint32_t*>(&hh01),
                                *reinterpret_cast<const uint32_t*>(&hl23), *reinterpret_cast<const uint32_t*>(&hh23)};
        const uint32_t lo[4] = {PackBf16(vl.x - rl01.x, vl.y - rl01.y), PackBf16(vh.x - rh01.x, vh.y - rh01.y),
                                PackBf16(vl.z - rl23.x, vl.w - rl23.y), PackBf16(vh.z - rh23.x, vh.w - rh23.y)};
        Mma(acc, hi, bw.x, bw.y);
        Mma(acc, lo, bw.x, bw.y);
      }
    }
    // acc: (row g, columns col + 2q, +1) and (row g + 8, the same columns).
    stage[warp][g][8 * j + 2 * q] = scaling * acc[0];
    stage[warp][g][8 * j + 2 * q + 1] = scaling * acc[1];
    stage[warp][g + 8][8 * j + 2 * q] = scaling * acc[2];
    stage[warp][g + 8][8 * j + 2 * q + 1] = scaling * acc[3];
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kExpandItems; ++i) {
    const int item = lane + 32 * i, m = item / kExpandChunks, chunk = item % kExpandChunks;
    const int col = col_warp + 8 * chunk;
    if (rows[i] < 0 || col >= p.out) continue;
    float f[8];
    Bf16x8ToFloat(yv[i], f);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] += stage[warp][m][8 * chunk + e];
    *reinterpret_cast<uint4*>(p.y + static_cast<int64_t>(rows[i]) * p.y_stride + p.col0 + col) = FloatToBf16x8(f);
  }
}

}  // namespace kvfleet::kernels::lora
