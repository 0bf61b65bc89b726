// Paged prefill kernel (contract in paged_prefill.h).
//
// Grid: x = tile of 128 rows (heaviest first), y = KV head, z = sequence. Row r of a (sequence,
// KV head) is query token r / group, query head r % group. Block: 4 warps of 32 rows each, two
// m16 MMA tiles per warp, so every K and V fragment read from shared memory feeds two MMAs
// (with one m16 tile per warp the kernel was bound by shared-memory reads: 165 TFLOP/s).
// Q stays in shared memory for the whole block and is re-read per tile (registers hold the
// 2 x 64 scores and 2 x 128 outputs per thread). Per K/V tile of 64 cached tokens (any number
// of pages; cp.async, two stages, one barrier per tile): S = Q K^T (K by ldmatrix as the
// col-major B operand), mask (only on tiles that need it), online softmax in the exp2 domain
// with the scale folded into one FMA, O += P V (P reused from the S accumulators as the
// A operand, V by ldmatrix.trans). A warp skips a tile none of its rows sees. The output goes
// through the warp's own Q rows in shared memory to 16-byte stores. Fragment layouts: PTX ISA,
// "Matrix Fragments for mma.m16n8k16".
#pragma once

#include "kernels/attention_mask.h"
#include "kernels/cuda_common.cuh"
#include "kernels/paged_prefill.h"

namespace kvfleet::kernels::prefill {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMTiles = 2;                  // m16 tiles per warp: each K/V fragment feeds 2 MMAs
constexpr int kWarpRows = 16 * kMTiles;     // query rows per warp
constexpr int kRows = kWarps * kWarpRows;   // query rows per block: 128 (32 tokens of a group of 4)
constexpr int kCols = 64;                   // cached tokens per K/V tile
constexpr int kStages = 2;                  // K/V tiles in shared memory
constexpr int kPad = 8;                     // bf16 of padding per shared row: conflict-free ldmatrix
// Two blocks per SM: 255 registers each at head_dim 128 (2 x 64 scores + 2 x 128 outputs per
// thread), 104 KiB of shared memory each; one block's softmax overlaps the other's MMAs.
constexpr int kMinBlocksPerSm = 2;

template <int kHeadDim>
constexpr int SmemBytes() {
  return (kRows + kStages * 2 /*K,V*/ * kCols) * (kHeadDim + kPad) * 2;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices, row-major in shared memory, lanes 8j..8j+7 addressing the rows of
// matrix j: lane t receives row t / 4, elements 2 (t % 4) and 2 (t % 4) + 1 of each.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
// The same, transposed: lane t receives rows 2 (t % 4) and 2 (t % 4) + 1 of column t / 4.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// 2^x; -inf gives +0 (PTX ISA, ex2.approx: max relative error 2^-22, far below bf16's).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    PagedPrefillKernel(const __grid_constant__ PagedPrefillParams p) {
  constexpr int kStride = kHeadDim + kPad;  // bf16 per shared row
  constexpr int kChunks = kHeadDim / 8;     // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;    // k steps of S = Q K^T
  constexpr int kDTiles = kHeadDim / 8;     // n tiles of O
  constexpr int kNTiles = kCols / 8;        // n tiles of S
  constexpr int kLoadRows = kThreads / kChunks;  // tile rows one pass of the block loads
  static_assert(kThreads % kChunks == 0 && kCols % kLoadRows == 0, "load passes must tile the K/V tile");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [kRows][kStride], then output
  __nv_bfloat16* kv_s = q_s + kRows * kStride;                       // [stage][K,V][kCols][kStride]

  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int q_begin = p.cu_q_lens[seq];
  const int q_len = p.cu_q_lens[seq + 1] - q_begin;
  const int rows = q_len * group;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest (latest) rows first
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
  // Positions below this may be sinks for some row: never skipped as "before the window".
  const int sink_limit = MaskSinkCount(p.mask, INT32_MAX);

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
  const bool warp_any = r0 + wr0 < rows;
  const bool warp_full = r0 + wr0 + kWarpRows <= rows;
  const int wq_min = first_pos + (r0 + wr0) / group;
  const int wq_max = first_pos + (min(rows, r0 + wr0 + kWarpRows) - 1) / group;
  const int w_lo_min = MaskRangeStart(p.mask, wq_min);
  const int w_lo_max = MaskRangeStart(p.mask, wq_max);

  // K/V tile loads: thread t copies 16-byte chunk t % kChunks of rows t / kChunks + k kLoadRows.
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int B = p.layout.block_size;
  const bool b_pow2 = (B & (B - 1)) == 0;
  const int b_shift = __ffs(B) - 1;
  const int64_t block_elems = p.layout.BlockElems();
  const int64_t k_base = p.layout.Offset(0, p.layer, 0, kv_head, 0) + (threadIdx.x % kChunks) * 8;
  const int64_t v_delta = p.layout.TileElems() * p.layout.num_kv_heads;  // K -> V of the same slot
  const int load_row = threadIdx.x / kChunks;
  const int load_col = (threadIdx.x % kChunks) * 8;
  auto load_tile = [&](int tile, int stage) {
    __nv_bfloat16* ks = kv_s + stage * 2 * kCols * kStride;
    __nv_bfloat16* vs = ks + kCols * kStride;
#pragma unroll
    for (int k = 0; k < kCols / kLoadRows; ++k) {
      const int row = load_row + k * kLoadRows;
      const int i = tile * kCols + row;
      const bool valid = i < n;
      const __nv_bfloat16* k_src = p.kv_pool;
      if (valid) {
        const int pos = pos_of(i);
        const int page = b_pow2 ? pos >> b_shift : pos / B;
        const int slot = pos - page * B;
        k_src = p.kv_pool + __ldg(table + page) * block_elems + k_base + static_cast<int64_t>(slot) * kHeadDim;
      }
      CpAsync16(ks + row * kStride + load_col, k_src, valid);
      CpAsync16(vs + row * kStride + load_col, valid ? k_src + v_delta : k_src, valid);
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
  const float scale_log2 = p.scale * kLog2e;

  const int num_tiles = (n + kCols - 1) / kCols;
  load_tile(0, 0);
  for (int tile = 0; tile < num_tiles; ++tile) {
    // The barrier publishes tile `tile` and ends every read of the stage refilled next.
    CpAsyncWaitAll();
    __syncthreads();
    if (tile + 1 < num_tiles) load_tile(tile + 1, (tile + 1) % kStages);
    const __nv_bfloat16* ks = kv_s + (tile % kStages) * 2 * kCols * kStride;
    const __nv_bfloat16* vs = ks + kCols * kStride;

    const int i0 = tile * kCols;
    const int i_last = min(i0 + kCols, n) - 1;
    // Tiles wholly past the warp's last query, or wholly before its first row's range start
    // (and no sink), are invisible to every row of the warp.
    const bool invisible = !warp_any || (i0 >= ns && (pos_of(i0) > wq_max ||
                                                      (pos_of(i_last) < w_lo_min && pos_of(i0) >= sink_limit)));
    if (invisible) continue;
    // Every row of the warp sees every token of the tile: no mask.
    const bool full = warp_full && i0 + kCols <= n && i0 >= ns && pos_of(i0) >= w_lo_max && pos_of(i_last) <= wq_min;

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

    if (!full) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int qpos = row_q[mt][h];
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int i = i0 + nt * 8 + 2 * tig + j;
              if (!(i < n && qpos >= 0 && MaskAttends(p.mask, qpos, pos_of(i)))) s[mt][nt][2 * h + j] = -INFINITY;
            }
        }
    }

    // Online softmax per row (gid + 8 h of m tile mt); a row spans the 4 lanes of a quad.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m[mt][h];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float base = mx == -INFINITY ? 0.f : mx * scale_log2;  // 0: every token so far masked
        const float correction = Exp2(m[mt][h] * scale_log2 - base);
        m[mt][h] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          s[mt][nt][2 * h] = Exp2(fmaf(s[mt][nt][2 * h], scale_log2, -base));
          s[mt][nt][2 * h + 1] = Exp2(fmaf(s[mt][nt][2 * h + 1], scale_log2, -base));
          sum += s[mt][nt][2 * h] + s[mt][nt][2 * h + 1];
        }
        l[mt][h] = l[mt][h] * correction + sum;
#pragma unroll
        for (int t = 0; t < kDTiles; ++t) {
          o[mt][t][2 * h] *= correction;
          o[mt][t][2 * h + 1] *= correction;
        }
      }

    // O += P V: P's accumulator layout is the A-operand layout of the next MMA.
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = PackBf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = PackBf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = PackBf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = PackBf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < kHeadDim / 16; ++dn) {
        uint32_t b[4];  // dims dn * 16 .. + 7 (b[0], b[1]) and + 8 .. + 15 (b[2], b[3])
        LdMatrixX4Trans(b, vs + (kk * 16 + (lane & 15)) * kStride + dn * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma(o[mt][2 * dn], pa[mt], b[0], b[1]);
          Mma(o[mt][2 * dn + 1], pa[mt], b[2], b[3]);
        }
      }
    }
  }

  // Normalise into the warp's own Q rows (no other warp reads them), then 16-byte stores.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
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

}  // namespace kvfleet::kernels::prefill
