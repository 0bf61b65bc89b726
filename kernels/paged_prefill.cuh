// Paged prefill kernel (contract in paged_prefill.h).
//
// Grid: x = tile of 64 rows, y = KV head, z = sequence. Row r of a (sequence, KV head) is query
// token r / group, query head r % group. Block: 4 warps, 16 rows each (one m16 MMA tile).
// Per K/V tile of 64 cached tokens: S = Q K^T (mma.sync, K from shared memory as the col-major
// B operand), mask, online softmax in registers, O += P V (P reused from the S accumulators
// as the A operand, V through ldmatrix.trans). Fragment layouts: PTX ISA, "Matrix Fragments
// for mma.m16n8k16".
#pragma once

#include "kernels/attention_mask.h"
#include "kernels/cuda_common.cuh"
#include "kernels/paged_prefill.h"

namespace kvfleet::kernels::prefill {

constexpr int kWarps = 8;  // 128 rows per K/V tile read: halves L2 traffic against 64
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kCols = 64;           // cached tokens per K/V tile
constexpr int kPad = 8;             // bf16 of padding per shared row: conflict-free fragments

template <int kHeadDim>
constexpr int SmemBytes() {
  return 2 /*stages*/ * 2 /*K,V*/ * kCols * (kHeadDim + kPad) * 2;
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kN>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN));
}

__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Four 8x8 b16 matrices, row-major in shared memory: lane t receives row t / 4, elements
// 2 (t % 4) and 2 (t % 4) + 1 of each, which is the col-major B fragment of m16n8k16 when the
// rows are tokens (n) and the columns head dims (k).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// One block per SM at head_dim 128 (227 registers). Capping registers for two (128 each)
// spills 352 bytes per thread and measured slower on an H200: 152 against 166 TFLOP/s
// (tests/bench/results, v8).
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) PagedPrefillKernel(PagedPrefillParams p) {
  constexpr int kStride = kHeadDim + kPad;  // bf16 per shared row
  constexpr int kChunks = kHeadDim / 8;     // 16-byte chunks per row
  constexpr int kKSteps = kHeadDim / 16;    // k steps of S = Q K^T
  constexpr int kDTiles = kHeadDim / 8;     // n tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [stage][K,V][kCols][kStride]

  const int seq = blockIdx.z, kv_head = blockIdx.y;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int q_begin = p.cu_q_lens[seq];
  const int q_len = p.cu_q_lens[seq + 1] - q_begin;
  const int rows = q_len * group;
  const int r0 = (gridDim.x - 1 - blockIdx.x) * kRows;  // heaviest (latest) rows first
  if (r0 >= rows) return;
  const int seq_len = p.seq_lens[seq];
  const int first_pos = seq_len - q_len;  // position of query token 0
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;

  // This thread's two rows (gid and gid + 8 of its warp's 16), their query positions.
  int row_q[2];
  const __nv_bfloat16* row_ptr[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + warp * 16 + gid + 8 * h;
    const int token = r / group, g = r % group;
    row_q[h] = r < rows ? first_pos + token : -1;
    row_ptr[h] = p.q + (static_cast<int64_t>(q_begin + token) * p.num_q_heads + kv_head * group + g) * kHeadDim;
  }
  uint32_t qa[kKSteps][4];
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int h = j & 1, col = kk * 16 + (j >> 1) * 8 + 2 * tig;
      qa[kk][j] = row_q[h] >= 0 ? *reinterpret_cast<const uint32_t*>(row_ptr[h] + col) : 0u;
    }

  // Cached tokens this block visits: sinks [0, ns), then [lo, q_max].
  const int q_min = first_pos + r0 / group;
  const int q_max = first_pos + (min(rows, r0 + kRows) - 1) / group;
  const int lo = MaskRangeStart(p.mask, q_min);
  const int ns = MaskSinkCount(p.mask, lo);
  const int n = ns + q_max + 1 - lo;
  const int lo_of_max = MaskRangeStart(p.mask, q_max);
  const bool rows_full = r0 + kRows <= rows;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int B = p.layout.block_size;
  auto pos_of = [&](int i) { return i < ns ? i : lo + (i - ns); };

  auto load_tile = [&](int tile, int stage) {
    const int i0 = tile * kCols;
    __nv_bfloat16* ks = smem + stage * 2 * kCols * kStride;
    __nv_bfloat16* vs = ks + kCols * kStride;
#pragma unroll
    for (int c = threadIdx.x; c < kCols * kChunks; c += kThreads) {
      const int row = c / kChunks, chunk = c % kChunks;
      const int i = i0 + row;
      const bool valid = i < n;
      const __nv_bfloat16* k_src = p.kv_pool;
      const __nv_bfloat16* v_src = p.kv_pool;
      if (valid) {
        const int pos = pos_of(i);
        const int64_t block = table[pos / B];
        k_src = p.kv_pool + p.layout.Offset(block, p.layer, 0, kv_head, pos % B) + chunk * 8;
        v_src = k_src + p.layout.TileElems() * p.layout.num_kv_heads;
      }
      CpAsync16(ks + row * kStride + chunk * 8, k_src, valid);
      CpAsync16(vs + row * kStride + chunk * 8, v_src, valid);
    }
    CpAsyncCommit();
  };

  float o[kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t)
#pragma unroll
    for (int j = 0; j < 4; ++j) o[t][j] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * kLog2e;

  const int num_tiles = (n + kCols - 1) / kCols;
  load_tile(0, 0);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < num_tiles) {
      load_tile(tile + 1, stage ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* ks = smem + stage * 2 * kCols * kStride;
    const __nv_bfloat16* vs = ks + kCols * kStride;

    // S = Q K^T for this warp's 16 rows x 64 tokens.
    float s[kCols / 8][4];
#pragma unroll
    for (int nt = 0; nt < kCols / 8; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[nt][j] = 0.f;
      // Lanes 8j..8j+7 address the rows of matrix j: dims kk * 16 + 8 j .. + 7 (two k steps).
      const __nv_bfloat16* kaddr = ks + (nt * 8 + (lane & 7)) * kStride + (lane >> 3) * 8;
#pragma unroll
      for (int kk = 0; kk < kKSteps; kk += 2) {
        uint32_t b[4];
        LdMatrixX4(b, kaddr + kk * 16);
        Mma(s[nt], qa[kk], b[0], b[1]);
        Mma(s[nt], qa[kk + 1], b[2], b[3]);
      }
    }

    // Mask (skipped when every row sees every token of the tile).
    const int i0 = tile * kCols;
    const bool full = rows_full && i0 + kCols <= n && i0 >= ns && pos_of(i0) >= lo_of_max &&
                      pos_of(i0 + kCols - 1) <= q_min;
#pragma unroll
    for (int nt = 0; nt < kCols / 8; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + nt * 8 + 2 * tig + (j & 1);
        const int qpos = row_q[j >> 1];
        const bool keep = full || (i < n && qpos >= 0 && MaskAttends(p.mask, qpos, pos_of(i)));
        s[nt][j] = keep ? s[nt][j] * scale_log2 : -INFINITY;
      }

    // Online softmax, rows gid (h = 0) and gid + 8 (h = 1); a row spans the 4 lanes of a quad.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int nt = 0; nt < kCols / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx;  // a fully masked row so far
      const float correction = exp2f(m[h] - base);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kCols / 8; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * correction + sum;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        o[t][2 * h] *= correction;
        o[t][2 * h + 1] *= correction;
      }
    }

    // O += P V: P's accumulator layout is the A-operand layout of the next MMA.
#pragma unroll
    for (int kk = 0; kk < kCols / 16; ++kk) {
      const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]), PackBf16(s[2 * kk][2], s[2 * kk][3]),
                              PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < kHeadDim / 16; ++dn) {
        uint32_t b[4];
        LdMatrixX4Trans(b, vs + (kk * 16 + (lane & 15)) * kStride + dn * 16 + (lane >> 4) * 8);
        Mma(o[2 * dn], pa, b[0], b[1]);
        Mma(o[2 * dn + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }

  // Normalise and store.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (row_q[h] < 0) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int r = r0 + warp * 16 + gid + 8 * h;
    const int token = r / group, g = r % group;
    __nv_bfloat16* dst =
        p.out + (static_cast<int64_t>(q_begin + token) * p.num_q_heads + kv_head * group + g) * kHeadDim + 2 * tig;
#pragma unroll
    for (int t = 0; t < kDTiles; ++t)
      *reinterpret_cast<__nv_bfloat162*>(dst + t * 8) = __floats2bfloat162_rn(o[t][2 * h] * inv, o[t][2 * h + 1] * inv);
  }
}

}  // namespace kvfleet::kernels::prefill
