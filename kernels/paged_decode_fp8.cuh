// Tensor-core decode over fp8 e4m3 pages (head_dim 64 or 128, no shifted RoPE).
//
// Halving the bytes of a token only doubles the speed when the kernel also spends about half
// the instructions on it. The bf16 kernel's shape (query heads as the 16 rows of an m16n8k16
// tile, paged_decode.cuh) spent as many per token on fp8 pages as on bf16, so this one swaps
// the operands:
//
//   S^T = K Q^T    M = 16 tokens, N = 8 query heads, K = head dims
//   O^T = V^T P^T  M = 16 head dims, N = 8 query heads, K = 16 tokens
//
// With GQA 4 half of each tile's columns are empty instead of three quarters of its rows, and
// the softmax and the rescaling of O run on a quarter as many registers. The operands are
// f16, not bf16: e4m3 widens to f16 exactly in one hardware conversion per pair
// (cvt.rn.f16x2.e4m3x2). q goes to f16 times a power of two per head that puts its largest
// element in [2^13, 2^14), so every bf16 q element down to 2^-27 of it keeps all its bits; P (in [0, 1]) keeps 11
// bits, not bf16's 8. The C fragment of S^T holds (token, head); P^T as the B operand of O^T
// needs (head, token), which one movmatrix per 8x8 half transposes.
//
// Fragment bytes come straight from the staged rows; a dot product does not depend on the
// order of its terms, so the k index is permuted to make each lane's bytes contiguous:
//  - S^T, k = head dims: lane (gid, tig) reads kHeadDim/4 bytes at kHeadDim/4 * tig of token
//    rows gid and gid + 8; k step kk takes word kk of each (bytes 0, 1 as k 2tig, 2tig + 1 and
//    bytes 2, 3 as k 2tig + 8, 2tig + 9), and q's B fragment the same dims.
//  - O^T, k = tokens: lane (gid, tig) reads kHeadDim/8 bytes at kHeadDim/8 * gid of token rows
//    2tig, 2tig+1, 2tig+8, 2tig+9, and byte-interleaves token pairs (PRMT). Row gid + 8r of m
//    tile 2w + s is dim kHeadDim/8 * gid + 4w + 2s + r, so each lane ends with kHeadDim/8
//    contiguous dims of its two heads.
//
// Measured on an H200 (tests/bench/results/2026-11-28-decode-partitions.txt): 1.86-1.92x the KV
// tokens/s of the bf16 kernel at batches of 1 GiB of KV per layer, 82.6-91.5% of copy bandwidth
// against 88.6-94.7%. Nsight Compute at batch 64 @ 4K: L2 throughput 89% (bf16's 93%), DRAM 79%
// (84%), 42% of issue slots, no eligible warp in 55% of cycles with 16 warps per SM (four blocks:
// 106 registers, 55 KB of shared memory each): the L2 near its ceiling and latency with few warps,
// not instruction issue.
// Include from .cu files only.
#pragma once

#include "kernels/paged_decode_common.cuh"

namespace kvfleet::kernels::decode::fp8 {

constexpr int kTile = 64;   // tokens per stage: 16 per warp
// Three stages of 18 KB (rows padded by 16 bytes: conflict-free fragment loads): four blocks
// fit an SM at one n tile (128 registers). Measured on an H200 against two stages of 128 tokens
// (two m16 tiles per warp, three blocks per SM, as the bf16 kernel's 32 KB in flight per
// block): within 1%, slightly slower.
constexpr int kStages = 3;
template <int kNT>
constexpr int MinBlocks() {
  return kNT == 1 ? 4 : 3;
}

template <int kHeadDim>
constexpr int StageStride() {
  return kHeadDim + 16;
}
template <int kHeadDim>
constexpr int SmemBytes() {
  return kStages * 2 * kTile * StageStride<kHeadDim>();
}
// Floats per row of the warps' partial O^T in the merge.
template <int kHeadDim>
constexpr int MergeStride() {
  return kHeadDim + 4;
}
template <int kHeadDim, int kNT>
constexpr int MergeBytes() {
  return int(sizeof(float)) * kWarps * 8 * kNT * (MergeStride<kHeadDim>() + 2);
}
// kWords 32-bit words from shared memory (16-byte aligned when kWords >= 4, 8 when 2).
template <int kWords>
__device__ __forceinline__ void LoadWords(const uint8_t* src, uint32_t (&w)[kWords]) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + 4 * i);
      w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
    }
  } else {
    static_assert(kWords == 2, "head_dim 64 or 128");
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    w[0] = v.x, w[1] = v.y;
  }
}

// A word of four e4m3 bytes (b0 lowest) as the f16 pairs lo = (b0, b1) and hi = (b2, b3),
// exact: one conversion-unit instruction per pair. (Three integer operations per pair give the
// same f16 bits with the exponent bias 8 short, value / 2^8; measured on an H200 the two run
// within 2% of each other, so the exact one stays.)
__device__ __forceinline__ void Fp8x4ToF16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}
// PRMT selectors that interleave words x (token a) and y (token b) into (x0, y0, x1, y1) and
// (x2, y2, x3, y3): widened, each gives the (a, b) pairs of two dims.
constexpr uint32_t kInterleaveLo = 0x5140, kInterleaveHi = 0x7362;

// kNT n tiles of 8 query heads: groups up to 8 or 16 per block.
template <int kHeadDim, int kNT>
__global__ void __launch_bounds__(kThreads, MinBlocks<kNT>()) PagedDecodeFp8Kernel(PagedDecodeParams p) {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
  constexpr int kStride = StageStride<kHeadDim>();
  constexpr int kKSteps = kHeadDim / 16;  // k steps of S^T: word kk of each K row
  constexpr int kMTiles = kHeadDim / 16;  // m tiles of O^T
  constexpr int kVWords = kHeadDim / 32;  // words of each V row a lane reads
  constexpr int kHeads = 8 * kNT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint8_t* tiles = smem_raw;

  DecodeBlock b;
  if (!StartDecodeBlock<kHeads, kTile>(p, b)) return;
  const int kv_head = b.kv_head, group = b.group, seq = b.seq, g0 = b.g0, num_tiles = b.num_tiles;
  const Partition& pt = b.pt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;

  KvTileLines<kHeadDim, kTile, kStride, uint8_t> loader(p, b);
  auto load_tile = [&](int t) { loader.Load(b, t, tiles, t % kStages); };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) load_tile(t);

  // q^T as the B operand: column gid of n tile nt is query head g0 + 8 nt + gid (zero past the
  // group), in f16 times 2^e; b0 of step kk holds dims 4kk, 4kk + 1 of this lane's kHeadDim/4
  // dims, b1 dims 4kk + 2, 4kk + 3.
  const float2 kv_scale = KvScaleOf<uint8_t>(p, kv_head);
  uint32_t qb[kNT][kKSteps][2];
  float s_scale[kNT][2];  // softmax scale (log2) of this lane's columns 2tig, 2tig + 1
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int h = g0 + nt * 8 + gid;
    float qf[kHeadDim / 4];
    if (h < group) {
      const __nv_bfloat16* src =
          p.q + (static_cast<int64_t>(seq) * p.num_q_heads + kv_head * group + h) * kHeadDim + kHeadDim / 4 * tig;
#pragma unroll
      for (int j = 0; j < kHeadDim / 32; ++j) {
        float f[8];
        Bf16x8ToFloat(reinterpret_cast<const uint4*>(src)[j], f);
#pragma unroll
        for (int e = 0; e < 8; ++e) qf[8 * j + e] = f[e];
      }
    } else {
#pragma unroll
      for (int j = 0; j < kHeadDim / 4; ++j) qf[j] = 0.f;
    }
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kHeadDim / 4; ++j) amax = fmaxf(amax, fabsf(qf[j]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int e = 0;
    if (amax > 0.f && amax <= 3.0e38f) {
      frexpf(amax, &e);  // amax < 2^e
      e = min(max(14 - e, -64), 64);
    }
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const float* w = qf + 4 * kk;
      qb[nt][kk][0] = PackF16(ldexpf(w[0], e), ldexpf(w[1], e));
      qb[nt][kk][1] = PackF16(ldexpf(w[2], e), ldexpf(w[3], e));
    }
    const float base = p.scale * kLog2e * kv_scale.x;
#pragma unroll
    for (int c = 0; c < 2; ++c) s_scale[nt][c] = ldexpf(base, -__shfl_sync(0xffffffffu, e, (2 * tig + c) * 4));
  }

  float o[kMTiles][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) o[mt][nt][j] = 0.f;
  float m[kNT][2], l[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) m[nt][0] = m[nt][1] = -INFINITY, l[nt][0] = l[nt][1] = 0.f;

  for (int t = 0; t < num_tiles; ++t) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile t landed for everyone; stage (t-1) % kStages is free again
    load_tile(t + kStages - 1);
    // The warp's 16 K rows of the stage, then (kTile rows on) its 16 V rows.
    const uint8_t* ks = tiles + (t % kStages) * 2 * kTile * kStride + warp * 16 * kStride;
    const uint8_t* vs = ks + kTile * kStride;
    uint32_t k_lo[kKSteps], k_hi[kKSteps], v8[4][kVWords];  // v8 rows: tokens 2tig, 2tig+1, 2tig+8, 2tig+9
    LoadWords<kKSteps>(ks + gid * kStride + kHeadDim / 4 * tig, k_lo);
    LoadWords<kKSteps>(ks + (gid + 8) * kStride + kHeadDim / 4 * tig, k_hi);
#pragma unroll
    for (int r = 0; r < 4; ++r)
      LoadWords<kVWords>(vs + (2 * tig + (r & 1) + 8 * (r >> 1)) * kStride + kHeadDim / 8 * gid, v8[r]);

    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[nt][j] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t a[4];
      Fp8x4ToF16x4(k_lo[kk], a[0], a[2]);
      Fp8x4ToF16x4(k_hi[kk], a[1], a[3]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) MmaF16(s[nt], a, qb[nt][kk][0], qb[nt][kk][1]);
    }

    // Online softmax per column (query head): rows gid and gid + 8 are this lane's tokens.
    const int i_lo = t * kTile + warp * 16 + gid;
    const bool valid_lo = i_lo < pt.len, valid_hi = i_lo + 8 < pt.len;
    uint32_t pb[kNT][2];
    float corr[kNT][2];
    bool rescale = false;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float lo = valid_lo ? s[nt][c] * s_scale[nt][c] : -INFINITY;
        const float hi = valid_hi ? s[nt][c + 2] * s_scale[nt][c] : -INFINITY;
        float mx = fmaxf(m[nt][c], fmaxf(lo, hi));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float base = mx == -INFINITY ? 0.f : mx;
        corr[nt][c] = exp2f(m[nt][c] - base);
        rescale |= corr[nt][c] != 1.f;
        m[nt][c] = mx;
        s[nt][c] = exp2f(lo - base);
        s[nt][c + 2] = exp2f(hi - base);
        l[nt][c] = l[nt][c] * corr[nt][c] + s[nt][c] + s[nt][c + 2];
      }
      pb[nt][0] = MovTrans(PackF16(s[nt][0], s[nt][1]));  // tokens 2tig, 2tig+1 of head gid
      pb[nt][1] = MovTrans(PackF16(s[nt][2], s[nt][3]));  // tokens 2tig+8, 2tig+9
    }
    // O is rescaled only when some column's max moved, which past the first tiles of a long
    // context it rarely does (measured on an H200: +1.4% KV tokens/s at b=64 @ 4K).
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int j = 0; j < 4; ++j) o[mt][nt][j] *= corr[nt][j & 1];
    }

    // O^T += V^T P^T.
#pragma unroll
    for (int w = 0; w < kVWords; ++w) {
      uint32_t a[2][4];  // m tiles 2w (dims 4w, 4w+1) and 2w+1 (dims 4w+2, 4w+3)
      Fp8x4ToF16x4(__byte_perm(v8[0][w], v8[1][w], kInterleaveLo), a[0][0], a[0][1]);
      Fp8x4ToF16x4(__byte_perm(v8[2][w], v8[3][w], kInterleaveLo), a[0][2], a[0][3]);
      Fp8x4ToF16x4(__byte_perm(v8[0][w], v8[1][w], kInterleaveHi), a[1][0], a[1][1]);
      Fp8x4ToF16x4(__byte_perm(v8[2][w], v8[3][w], kInterleaveHi), a[1][2], a[1][3]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        MmaF16(o[2 * w][nt], a[0], pb[nt][0], pb[nt][1]);
        MmaF16(o[2 * w + 1][nt], a[1], pb[nt][0], pb[nt][1]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // shared memory is reused for the merge

  // Merge the warps: [kWarps][kHeads][MergeStride] partial O, [kWarps][kHeads] max and sum.
  constexpr int kRed = MergeStride<kHeadDim>();
  float* red = reinterpret_cast<float*>(smem_raw);
  float* red_m = red + kWarps * kHeads * kRed;
  float* red_l = red_m + kWarps * kHeads;
  const float v_scale = kv_scale.y;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float sum = l[nt][c];
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      sum += __shfl_xor_sync(0xffffffffu, sum, 8);
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      const int r = nt * 8 + 2 * tig + c;
      if (g0 + r >= group) continue;  // zero queries: never read back
      if (gid == 0) {
        red_m[warp * kHeads + r] = m[nt][c];
        red_l[warp * kHeads + r] = sum;
      }
      float* row = red + (warp * kHeads + r) * kRed + kHeadDim / 8 * gid;
#pragma unroll
      for (int w = 0; w < kVWords; ++w)
        *reinterpret_cast<float4*>(row + 4 * w) =
            make_float4(o[2 * w][nt][c] * v_scale, o[2 * w][nt][c + 2] * v_scale, o[2 * w + 1][nt][c] * v_scale,
                        o[2 * w + 1][nt][c + 2] * v_scale);
    }
  __syncthreads();
  constexpr int kChunks = kHeadDim / 8;
  for (int idx = threadIdx.x; idx < kHeads * kChunks; idx += kThreads) {
    const int r = idx / kChunks, d = (idx % kChunks) * 8;
    if (g0 + r >= group) continue;
    float out[8], mx, sum;
    MergeWarps<kHeads, kRed>(red, red_m, red_l, r, d, out, mx, sum);
    const int64_t row_idx = static_cast<int64_t>(seq) * p.num_q_heads + kv_head * group + g0 + r;
    StorePartition<kHeadDim>(p, row_idx, b.part, b.num_parts, d, out, mx, sum);
  }
}

}  // namespace kvfleet::kernels::decode::fp8
