// Paged prefill kernel (contract in paged_prefill.h).
//
// Grid: x = KV head, y = sequence, z = tile of 256 rows, heaviest (latest rows, longest causal
// range) first across every head and sequence: the block scheduler starts blocks in linear
// order, so with z slowest the longest blocks start in the first wave (with the row tile in x,
// the heads after the first few started their longest blocks late: the first 2K chunk of a
// causal 8K prompt ran at 60% of the last chunk's rate, now at 80%). Row r of a (sequence, KV head) is query
// token r / group, query head r % group. Block: 8 warps of 32 rows each, two m16 MMA tiles per
// warp, so every K and V fragment read from shared memory feeds two MMAs (one m16 tile per warp,
// 4 warps: 165 TFLOP/s on an H100; two per warp in the same grid: 231). Q stays
// in shared memory for the whole block and is re-read per tile (the registers hold 2 x 64 scores
// and 2 x 128 outputs per thread). Per K/V tile of 64 cached tokens (any number of pages;
// cp.async, two stages, one barrier per tile): S = Q K^T (K by ldmatrix as the col-major B
// operand), mask (only on tiles that need it), online softmax in the exp2 domain with the scale
// folded into one FMA, O += P V (P reused from the S accumulators as the A operand, V by
// ldmatrix.trans). A warp skips a tile wholly past its last query. The output goes through the
// warp's own Q rows in shared memory to 16-byte stores. Fragment layouts: PTX ISA, "Matrix
// Fragments for mma.m16n8k16".
#pragma once

#include "kernels/attention_mask.h"
#include "kernels/cuda_common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/mma.cuh"
#include "kernels/paged_prefill.h"

namespace kvfleet::kernels::prefill {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMTiles = 2;                  // m16 tiles per warp: each K/V fragment feeds 2 MMAs
constexpr int kWarpRows = 16 * kMTiles;     // query rows per warp
constexpr int kRows = kWarps * kWarpRows;   // query rows per block: 256 (64 tokens of a group of 4)
constexpr int kCols = 64;                   // cached tokens per K/V tile
constexpr int kStages = 2;                  // K/V tiles in shared memory
constexpr int kPad = 8;                     // bf16 of padding per shared row: conflict-free ldmatrix
// One block per SM: 255 registers per thread at head_dim 128 (2 x 64 scores + 2 x 128 outputs),
// 136 KiB of shared memory. Measured on an H100 (8K prompt in 2K chunks, before the grid-order
// change): 245 TFLOP/s against 241 for two blocks of 4 warps and 243 for three K/V stages.
constexpr int kMinBlocksPerSm = 1;

// Elements per shared row of a staged K/V tile: bf16 rows padded for ldmatrix; fp8 rows are
// only read in order, 16 bytes per thread, by the conversion.
template <int kHeadDim, typename E>
constexpr int StageStride() {
  return sizeof(E) == 1 ? kHeadDim : kHeadDim + kPad;
}

// Q, the staged K/V tiles, then (fp8) the block's bf16 copy of the current tile.
template <int kHeadDim, typename E>
constexpr int SmemBytes() {
  return kRows * (kHeadDim + kPad) * 2 + kStages * 2 /*K,V*/ * kCols * StageStride<kHeadDim, E>() * int(sizeof(E)) +
         (sizeof(E) == 1 ? 2 * kCols * (kHeadDim + kPad) * 2 : 0);
}

// 2^x; -inf gives +0 (PTX ISA, ex2.approx: max relative error 2^-22, far below bf16's).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// E: __nv_bfloat16, or uint8_t for fp8 e4m3 pages: the block converts each staged tile to
// bf16 (exact, unscaled) before the MMAs; the K scale goes into the softmax scale, the V
// scale into the output's normalisation.
template <int kHeadDim, typename E>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    PagedPrefillKernel(const __grid_constant__ PagedPrefillParams p) {
  constexpr int kStride = kHeadDim + kPad;  // bf16 per shared row
  constexpr int kChunks = kHeadDim / 8;     // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;    // k steps of S = Q K^T
  constexpr int kDTiles = kHeadDim / 8;     // n tiles of O
  constexpr int kNTiles = kCols / 8;        // n tiles of S
  constexpr bool kFp8 = sizeof(E) == 1;
  constexpr int kSStride = StageStride<kHeadDim, E>();      // elements per staged row
  constexpr int kKvChunkElems = 16 / int(sizeof(E));       // elements per 16-byte chunk
  constexpr int kKvChunks = kHeadDim / kKvChunkElems;      // 16-byte chunks per K/V row
  constexpr int kLoadRows = kThreads / kKvChunks;  // tile rows one pass of the block loads
  static_assert(kThreads % kKvChunks == 0 && kCols % kLoadRows == 0, "load passes must tile the K/V tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kRows][kStride], then output
  E* kv_s = reinterpret_cast<E*>(q_s + kRows * kStride);             // [stage][K,V][kCols][kSStride]
  // fp8: the current tile as bf16, [K,V][kCols][kStride].
  __nv_bfloat16* kv_c = reinterpret_cast<__nv_bfloat16*>(kv_s + kStages * 2 * kCols * kSStride);
  const E* pool;
  float k_scale = 1.f;  // the V scale is read at the end: no register held across the loop
  if constexpr (kFp8) {
    pool = p.kv_fp8;
    k_scale = p.scales.k[blockIdx.x];
  } else {
    pool = p.kv_pool;
  }

  const int kv_head = blockIdx.x, seq = blockIdx.y;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int q_begin = p.cu_q_lens[seq];
  const int q_len = p.cu_q_lens[seq + 1] - q_begin;
  const int rows = q_len * group;
  // z = row tile x K/V part (split-KV): part fastest, heaviest (latest) row tiles first.
  const int split = blockIdx.z % p.num_splits;
  const int r0 = (gridDim.z / p.num_splits - 1 - blockIdx.z / p.num_splits) * kRows;
  if (r0 >= rows) return;
  const int first_pos = p.seq_lens[seq] - q_len;  // position of query token 0
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;
  auto q_row_offset = [&](int r) {  // element offset of block row r0 + r in q / out
    const int token = (r0 + r) / group, g = (r0 + r) % group;
    return (static_cast<int64_t>(q_begin + token) * p.num_q_heads + kv_head * group + g) * kHeadDim;
  };

  // Q tile -> shared memory (rows past the chunk read as zero); committed with K/V tile 0.
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int row = c / kChunks, chunk = c % kChunks;
    const bool valid = r0 + row < rows;
    CpAsync16(q_s + row * kStride + chunk * 8, valid ? p.q + q_row_offset(row) + chunk * 8 : p.q, valid);
  }

  // Cached tokens this block visits, as indices i in [0, n): sinks [0, ns), then [lo, q_max].
  const int q_min = first_pos + r0 / group;
  const int q_max = first_pos + (min(rows, r0 + kRows) - 1) / group;
  const int lo = MaskRangeStart(p.mask, q_min);
  const int ns = MaskSinkCount(p.mask, lo);
  const int n = ns + q_max + 1 - lo;
  auto pos_of = [&](int i) { return i < ns ? i : lo + (i - ns); };

  const int wr0 = warp * kWarpRows;  // first block row of the warp
  // This warp's rows: their query positions (-1 past the chunk) and the span they cover.
  int row_q[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + wr0 + mt * 16 + gid + 8 * h;
      row_q[mt][h] = r < rows ? first_pos + r / group : -1;
    }
  // The warp's tiles, as thresholds on a tile's first index i0 (computed once: registers are
  // the scarce resource). Invisible to every row: i0 > vis_hi (past the warp's last query; all
  // of them when the warp has no rows), or i0 >= below_from and i_last < vis_lo (wholly before
  // every row's range start, above any position that may be a sink). Full (no mask needed):
  // full_lo <= i0 <= full_hi.
  const int wq_min = first_pos + (r0 + wr0) / group;
  const int wq_max = first_pos + (min(rows, r0 + wr0 + kWarpRows) - 1) / group;
  const int vis_hi = r0 + wr0 < rows ? ns + wq_max - lo : -1;
  const int vis_lo = ns + MaskRangeStart(p.mask, wq_min) - lo;
  const int below_from = ns + max(0, MaskSinkCount(p.mask, INT32_MAX) - lo);
  const int full_lo = r0 + wr0 + kWarpRows <= rows ? ns + max(0, MaskRangeStart(p.mask, wq_max) - lo) : INT32_MAX;
  const int full_hi = min(ns + wq_min - lo - (kCols - 1), n - kCols);

  // K/V tile loads: thread t copies 16-byte chunk t % kChunks of rows t / kChunks + k kLoadRows.
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int B = p.layout.block_size;
  const bool b_pow2 = (B & (B - 1)) == 0;
  const int b_shift = __ffs(B) - 1;
  const int64_t block_elems = p.layout.BlockElems();
  const E* kv_base = pool + p.layout.Offset(0, p.layer, 0, kv_head, 0) + (threadIdx.x % kKvChunks) * kKvChunkElems;
  // K -> V of the same slot: block_size * head_dim * num_kv_heads < 2^31 (int32: one register).
  const int v_delta = static_cast<int>(p.layout.TileElems()) * p.layout.num_kv_heads;
  const int load_row = threadIdx.x / kKvChunks;
  const int load_col = (threadIdx.x % kKvChunks) * kKvChunkElems;
  const int num_tiles = (n + kCols - 1) / kCols;
  // This part's tiles [tile_begin, tile_end): an even share, in whole tiles.
  const int per_split = (num_tiles + p.num_splits - 1) / p.num_splits;
  const int tile_begin = min(num_tiles, split * per_split);
  const int tile_end = min(num_tiles, tile_begin + per_split);
  // Loads tile `tile` into its stage and commits one cp.async group (empty past the last tile,
  // so that the wait below always counts kStages - 2 younger groups).
  auto load_tile = [&](int tile) {
    if (tile >= tile_end) {
      CpAsyncCommit();
      return;
    }
    const int stage = tile % kStages;
    E* ks = kv_s + stage * 2 * kCols * kSStride;
    E* vs = ks + kCols * kSStride;
#pragma unroll
    for (int k = 0; k < kCols / kLoadRows; ++k) {
      const int row = load_row + k * kLoadRows;
      const int i = tile * kCols + row;
      const bool valid = i < n;
      const E* k_src = pool;
      if (valid) {
        const int pos = pos_of(i);
        const int page = b_pow2 ? pos >> b_shift : pos / B;
        const int slot = pos - page * B;
        k_src = kv_base + __ldg(table + page) * block_elems + slot * kHeadDim;
      }
      CpAsync16(ks + row * kSStride + load_col, k_src, valid);
      CpAsync16(vs + row * kSStride + load_col, valid ? k_src + v_delta : k_src, valid);
    }
    CpAsyncCommit();
  };

  float o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int t = 0; t < kDTiles; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[mt][t][j] = 0.f;
  float m[kMTiles][2], l[kMTiles][2];  // running max (unscaled scores) and this lane's partial sum
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) m[mt][h] = -INFINITY, l[mt][h] = 0.f;
  const float scale_log2 = p.scale * kLog2e * k_scale;

#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) load_tile(tile_begin + t);
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    // The barrier publishes tile `tile` and ends every read of the stage refilled next.
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const __nv_bfloat16* ks;
    const __nv_bfloat16* vs;
    if constexpr (kFp8) {
      // Block-wide, before any warp may skip the tile: every warp past the barrier above has
      // finished reading kv_c for the previous tile.
      const uint8_t* src = kv_s + (tile % kStages) * 2 * kCols * kSStride;
#pragma unroll 1  // the O accumulators hold most registers: 8 bytes a step, not unrolled, spills least
      for (int c = threadIdx.x; c < 2 * kCols * (kHeadDim / 8); c += kThreads) {
        const int row = c / (kHeadDim / 8), col = (c % (kHeadDim / 8)) * 8;  // row: K rows, then V rows
        const uint2 raw = *reinterpret_cast<const uint2*>(src + row * kSStride + col);
        *reinterpret_cast<uint4*>(kv_c + row * kStride + col) = Fp8x8ToBf16x8(raw);
      }
      __syncthreads();
      ks = kv_c;
      vs = kv_c + kCols * kStride;
    } else {
      ks = kv_s + (tile % kStages) * 2 * kCols * kStride;
      vs = ks + kCols * kStride;
    }

    const int i0 = tile * kCols;
    const int i_last = min(i0 + kCols, n) - 1;
    const bool invisible = i0 > vis_hi || (i0 >= below_from && i_last < vis_lo);
    if (invisible) {
      load_tile(tile + kStages - 1);
      continue;
    }
    // Every row of the warp sees every token of the tile: no mask.
    const bool full = i0 >= full_lo && i0 <= full_hi;

    // S = Q K^T for the warp's 32 rows x 64 tokens.
    float s[kMTiles][kNTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[mt][nt][j] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t qa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        LdMatrixX4(qa[mt], q_s + (wr0 + mt * 16 + (lane & 15)) * kStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int nt = 0; nt < kNTiles; nt += 2) {
        uint32_t b[4];  // k step kk of tokens nt * 8 .. + 7 (b[0], b[1]) and (nt + 1) * 8 .. + 7 (b[2], b[3])
        LdMatrixX4(b, ks + (nt * 8 + (lane & 7) + (lane >> 4) * 8) * kStride + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(s[mt][nt], qa[mt], b[0], b[1]);
          Mma(s[mt][nt + 1], qa[mt], b[2], b[3]);
        }
      }
    }

    // Issued behind the QK^T MMAs, so that its block-table reads wait while the tensor cores work.
    load_tile(tile + kStages - 1);
    if (!full) {
      // MaskAttends, with the per-row parts hoisted: row q sees [MaskRangeStart(q), q] and the
      // sinks below it. Indices past n map past q_max, so "pos <= q" also rejects them.
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qpos = row_q[mt][h];  // -1 past the chunk: nothing is kept
          const int row_lo = MaskRangeStart(p.mask, qpos);
          const int row_sinks = MaskSinkCount(p.mask, row_lo);
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int pos = pos_of(i0 + nt * 8 + 2 * tig + j);
              if (!(pos <= qpos && (pos >= row_lo || pos < row_sinks))) s[mt][nt][2 * h + j] = -INFINITY;
            }
        }
    }

    // Online softmax per row (gid + 8 h of m tile mt); a row spans the 4 lanes of a quad.
    // Reductions are trees: with two warps per scheduler, serial chains stall on latency.
    // P in the A-operand layout of the P V MMA (the S accumulators' layout, k = token).
    uint32_t pa[kMTiles][kCols / 16][4];
    float correction[kMTiles][2];
    bool unchanged = true;  // no row's max moved: the rescale of O is skipped warp-wide
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[kNTiles];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) v[nt] = fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
#pragma unroll
        for (int w = kNTiles / 2; w >= 1; w /= 2)
#pragma unroll
          for (int k = 0; k < w; ++k) v[k] = fmaxf(v[k], v[k + w]);
        float mx = fmaxf(m[mt][h], v[0]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx * scale_log2;  // 0: every token so far masked
        correction[mt][h] = Exp2(m[mt][h] * scale_log2 - base);
        unchanged = unchanged && mx == m[mt][h];
        m[mt][h] = mx;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const float p0 = Exp2(fmaf(s[mt][nt][2 * h], scale_log2, -base));
          const float p1 = Exp2(fmaf(s[mt][nt][2 * h + 1], scale_log2, -base));
          v[nt] = p0 + p1;
          pa[mt][nt / 2][(nt % 2) * 2 + h] = PackBf16(p0, p1);  // P as bf16 at once: frees registers
        }
#pragma unroll
        for (int w = kNTiles / 2; w >= 1; w /= 2)
#pragma unroll
          for (int k = 0; k < w; ++k) v[k] += v[k + w];
        l[mt][h] = l[mt][h] * correction[mt][h] + v[0];
      }
    if (!__all_sync(0xffffffffu, unchanged)) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int t = 0; t < kDTiles; ++t)
#pragma unroll
          for (int j = 0; j < 4; ++j) o[mt][t][j] *= correction[mt][j >> 1];
    }

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk) {
#pragma unroll
      for (int dn = 0; dn < kHeadDim / 16; ++dn) {
        uint32_t b[4];  // dims dn * 16 .. + 7 (b[0], b[1]) and + 8 .. + 15 (b[2], b[3])
        LdMatrixX4Trans(b, vs + (kk * 16 + (lane & 15)) * kStride + dn * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(o[mt][2 * dn], pa[mt][kk], b[0], b[1]);
          Mma(o[mt][2 * dn + 1], pa[mt][kk], b[2], b[3]);
        }
      }
    }
  }

  // Normalise into the warp's own Q rows (no other warp reads them), then 16-byte stores.
  float v_scale = 1.f;
  if constexpr (kFp8) v_scale = p.scales.v[kv_head];
  if (p.num_splits > 1) {
    // A part: O unnormalised, the max in the exp2 domain (scaled, as `base` above) and the
    // sum, per row, for MergeSplitsKernel.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float sum = l[mt][h];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int r = r0 + wr0 + mt * 16 + gid + 8 * h;
        if (r >= rows) continue;
        const int64_t row = split * p.split_rows + int64_t(q_begin + r / group) * p.num_q_heads + kv_head * group + r % group;
        float* dst = p.workspace + row * kHeadDim + 2 * tig;
#pragma unroll
        for (int t = 0; t < kDTiles; ++t)
          *reinterpret_cast<float2*>(dst + t * 8) = make_float2(o[mt][t][2 * h] * v_scale, o[mt][t][2 * h + 1] * v_scale);
        if (tig == 0) {
          float* ml = p.workspace + p.num_splits * p.split_rows * kHeadDim + row * 2;
          ml[0] = m[mt][h] == -INFINITY ? -INFINITY : m[mt][h] * scale_log2;
          ml[1] = sum;
        }
      }
    return;
  }
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? v_scale / sum : 0.f;
      __nv_bfloat16* dst = q_s + (wr0 + mt * 16 + gid + 8 * h) * kStride + 2 * tig;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t)
        *reinterpret_cast<__nv_bfloat162*>(dst + t * 8) =
            __floats2bfloat162_rn(o[mt][t][2 * h] * inv, o[mt][t][2 * h + 1] * inv);
    }
  __syncwarp();
#pragma unroll
  for (int c = lane; c < kWarpRows * kChunks; c += 32) {
    const int row = wr0 + c / kChunks, chunk = c % kChunks;
    if (r0 + row < rows)
      *reinterpret_cast<uint4*>(p.out + q_row_offset(row) + chunk * 8) =
          *reinterpret_cast<const uint4*>(q_s + row * kStride + chunk * 8);
  }
}

// Merges the K/V parts of each (query token, head) row: out = sum_s 2^(m_s - M) O_s / sum_s
// 2^(m_s - M) l_s, M the parts' max (0 where no part saw a token, as one part would write).
// Grid: x = query token (past the batch's last: nothing), y = query head; kHeadDim threads.
template <int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) MergeSplitsKernel(const __grid_constant__ PagedPrefillParams p) {
  const int token = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
  if (token >= p.cu_q_lens[p.num_seqs]) return;
  const int64_t row = int64_t(token) * p.num_q_heads + head;
  const float* ml = p.workspace + p.num_splits * p.split_rows * kHeadDim;
  float mx = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, ml[(s * p.split_rows + row) * 2]);
  float num = 0.f, den = 0.f;
  if (mx != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const int64_t r = s * p.split_rows + row;
      const float w = Exp2(ml[r * 2] - mx);  // -inf: 0
      den += w * ml[r * 2 + 1];
      num += w * p.workspace[r * kHeadDim + d];
    }
  }
  p.out[row * kHeadDim + d] = __float2bfloat16_rn(den > 0.f ? num / den : 0.f);
}

}  // namespace kvfleet::kernels::prefill
