// Skinny GEMM kernel (see gemv.h for the contract and shapes).
//
// Grid: one warp per kRowsPerWarp rows of w, kWarps warps per block. Each lane walks its
// rows in 16-byte vectors strided by the warp (lane, lane + 32, ...), kUnroll vectors of
// every row loaded before the first is used: kRowsPerWarp * kUnroll independent 16-byte
// loads in flight per lane, which with a few warps per SM covers DRAM latency. w is read
// with streaming loads (no L1 allocation: each byte is used once); x through the read-only
// path (every warp of the SM re-reads it), or from shared memory when the block normalises
// it first (RMSNorm prologue). Each lane keeps kRowsPerWarp * kN fp32 partial sums; a warp
// shuffle reduction ends the row, and lane 0 adds the bias and stores.
// PDL (launch.h): the first kUnroll vectors of every row are loaded before waiting for the
// previous kernel (w is constant); x, bias and y only after. The next kernel is let in once
// the weights are consumed (before the reduction): earlier, its blocks would hold SM slots
// through the whole product (measured slower on an H100: 6.45 against 5.96 ms a step).
#pragma once

#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"
#include "kernels/gemv.h"

namespace kvfleet::kernels::gemv {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kUnroll = 4;

template <typename OutT>
__device__ __forceinline__ void Store(OutT* y, float v);
template <>
__device__ __forceinline__ void Store<float>(float* y, float v) { *y = v; }
template <>
__device__ __forceinline__ void Store<__nv_bfloat16>(__nv_bfloat16* y, float v) { *y = __float2bfloat16(v); }

// What a warp does with its two rows' sums.
enum Epilogue : int {
  kStore = 0,    // rows row0, row0 + 1 of w [m][k]: y = sums (+ bias)
  kSiluMul = 1,  // the pair (i, m + i) of w [2m][k]: y[j][i] = bf16(bf16(silu(g)) * u)
  kRopeKv = 2,   // the pair (dim d, dim d + D/2) of one q, k or v head of w [2m][k]: RoPE, then
                 // q to rope.q_out and K, V into the paged cache, as RopeKvStoreKernel
};

struct Args {
  const __nv_bfloat16* w;     // [m][k], or [2m][k] for the pair epilogues
  const __nv_bfloat16* x;     // [kN][k]
  const __nv_bfloat16* bias;  // rows of w, or null
  void* y;                    // kStore: [kN][m] OutT; kSiluMul: [kN][m] bf16; kRopeKv: unused
  int32_t m, k;               // m: rows, or pairs for the pair epilogues
  GemvRmsNorm norm;           // used with kNorm: x is norm.x
  GemvRopeKvStore rope;       // used with kRopeKv
};

// Block prologue with kNorm: xs[j] = bf16(weight * bf16(r / rms(r))) with r = bf16(residual_in
// + x) (or x), as RmsNormKernel (small_kernels.cuh); block 0 stores r to residual_out. Loads
// go kPrologueVecs per thread at once: the prologue is latency (L2), not bandwidth.
constexpr int kPrologueVecs = 4;

template <int kN>
__device__ __forceinline__ void NormPrologue(const GemvRmsNorm nm, int k, uint4* xs) {
  const int kv = k / 8;
  __shared__ float s_red[kN][kWarps];
  const bool add = nm.residual_in != nullptr, store = nm.residual_out != nullptr && blockIdx.x == 0;
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    const uint4* xg = reinterpret_cast<const uint4*>(nm.x + static_cast<int64_t>(j) * k);
    const uint4* rg = reinterpret_cast<const uint4*>(nm.residual_in + static_cast<int64_t>(j) * k);
    float ss = 0.f;
    for (int c0 = threadIdx.x; c0 < kv; c0 += kPrologueVecs * kThreads) {
      uint4 xv[kPrologueVecs], rv[kPrologueVecs];
#pragma unroll
      for (int u = 0; u < kPrologueVecs; ++u) {
        const int c = c0 + u * kThreads;
        if (c < kv) {
          xv[u] = xg[c];
          if (add) rv[u] = rg[c];
        }
      }
#pragma unroll
      for (int u = 0; u < kPrologueVecs; ++u) {
        const int c = c0 + u * kThreads;
        if (c >= kv) break;
        float v[8];
        Bf16x8ToFloat(xv[u], v);
        if (add) {
          float r[8];
          Bf16x8ToFloat(rv[u], r);
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = Bf16Round(v[e] + r[e]);
        }
        const uint4 packed = FloatToBf16x8(v);
        if (store) reinterpret_cast<uint4*>(nm.residual_out + static_cast<int64_t>(j) * k)[c] = packed;
        xs[j * kv + c] = packed;
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
      }
    }
    ss = WarpSum(ss);
    if (threadIdx.x % 32 == 0) s_red[j][threadIdx.x / 32] = ss;
  }
  __syncthreads();
  float inv[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t += s_red[j][w];
    inv[j] = rsqrtf(t / k + nm.eps);
  }
  const uint4* wg = reinterpret_cast<const uint4*>(nm.weight);
  for (int c0 = threadIdx.x; c0 < kv; c0 += kPrologueVecs * kThreads) {
    uint4 gv[kPrologueVecs];
#pragma unroll
    for (int u = 0; u < kPrologueVecs; ++u)
      if (c0 + u * kThreads < kv) gv[u] = wg[c0 + u * kThreads];
#pragma unroll
    for (int u = 0; u < kPrologueVecs; ++u) {
      const int c = c0 + u * kThreads;
      if (c >= kv) break;
      float g[8];
      Bf16x8ToFloat(gv[u], g);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        float v[8];
        Bf16x8ToFloat(xs[j * kv + c], v);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = g[e] * Bf16Round(v[e] * inv[j]);
        xs[j * kv + c] = FloatToBf16x8(v);
      }
    }
  }
  __syncthreads();
}

// The epilogues above; the sums are rounded to bf16 (after the bias) before SiLU-mul and
// RoPE, as the GEMM followed by LaunchSiluMul / LaunchRopeKvStore (small_kernels.h) does.
// kNorm: x is RMSNorm(norm) computed by each block into shared memory (kN * k bf16).
// Lane 0's stores of a warp's finished sums, per kEpi (see Epilogue).
template <int kN, typename OutT, int kEpi>
__device__ __forceinline__ void StoreOutputs(const Args& a, const float (&acc)[kRowsPerWarp][kN], int64_t row0,
                                         const int64_t (&rows)[kRowsPerWarp], int half) {
  constexpr int R = kRowsPerWarp;
  const int m = a.m;
  OutT* y = static_cast<OutT*>(a.y);
  if constexpr (kEpi == kSiluMul) {
    const float bg = a.bias != nullptr ? __bfloat162float(a.bias[rows[0]]) : 0.f;
    const float bu = a.bias != nullptr ? __bfloat162float(a.bias[rows[1]]) : 0.f;
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      const float g = Bf16Round(acc[0][j] + bg);
      const float u = Bf16Round(acc[1][j] + bu);
      Store(y + static_cast<int64_t>(j) * m + row0, Bf16Round(g / (1.f + expf(-g))) * u);
    }
  } else if constexpr (kEpi == kRopeKv) {
    const GemvRopeKvStore rp = a.rope;
    const int head = static_cast<int>(row0 / half), d = static_cast<int>(row0 % half);
    const int nq = rp.num_q_heads, nkv = rp.layout.num_kv_heads;
    const float b_lo = a.bias != nullptr ? __bfloat162float(a.bias[rows[0]]) : 0.f;
    const float b_hi = a.bias != nullptr ? __bfloat162float(a.bias[rows[1]]) : 0.f;
    const float inv_freq = rp.inv_freq[d];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      float lo = Bf16Round(acc[0][j] + b_lo), hi = Bf16Round(acc[1][j] + b_hi);
      if (rp.rotate && head < nq + nkv) {
        float sn, cs;
        sincosf(static_cast<float>(rp.positions[j]) * inv_freq, &sn, &cs);
        cs = Bf16Round(cs);
        sn = Bf16Round(sn);
        const float x0 = lo, x1 = hi;
        lo = Bf16Round(x0 * cs) + Bf16Round(-x1 * sn);
        hi = Bf16Round(x1 * cs) + Bf16Round(x0 * sn);
      }
      __nv_bfloat16* dst;
      if (head < nq) {
        dst = rp.q_out + (static_cast<int64_t>(j) * nq + head) * (2 * half);
      } else {
        const int32_t slot = rp.slots[j];
        if (slot < 0) continue;
        const bool is_v = head >= nq + nkv;
        if (rp.kv_fp8 != nullptr) {
          const int hkv = head - nq - (is_v ? nkv : 0);
          uint8_t* dst8 = rp.kv_fp8 + rp.layout.Offset(slot / rp.layout.block_size, rp.layer, is_v ? 1 : 0, hkv,
                                                       slot % rp.layout.block_size);
          const float sc = (is_v ? rp.scales.v : rp.scales.k)[hkv];
          dst8[d] = __nv_cvt_float_to_fp8(__fdiv_rn(Bf16Round(lo), sc), __NV_SATFINITE, __NV_E4M3);
          dst8[d + half] = __nv_cvt_float_to_fp8(__fdiv_rn(Bf16Round(hi), sc), __NV_SATFINITE, __NV_E4M3);
          continue;
        }
        dst = rp.kv_pool + rp.layout.Offset(slot / rp.layout.block_size, rp.layer, is_v ? 1 : 0,
                                            head - nq - (is_v ? nkv : 0), slot % rp.layout.block_size);
      }
      dst[d] = __float2bfloat16(lo);
      dst[d + half] = __float2bfloat16(hi);
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t i = row0 + r;
      if (i >= m) break;
      const float b = a.bias != nullptr ? __bfloat162float(a.bias[i]) : 0.f;
#pragma unroll
      for (int j = 0; j < kN; ++j) Store(y + static_cast<int64_t>(j) * m + i, acc[r][j] + b);
    }
  }
}

template <int kN, typename OutT, int kEpi, bool kNorm>
__global__ void __launch_bounds__(kThreads) GemvKernel(const Args a) {
  constexpr int R = kRowsPerWarp;
  static_assert(kEpi == kStore || R == 2, "a pair is one warp's two rows");
  extern __shared__ uint4 xs_smem[];  // kNorm: [kN][k / 8]
  const int m = a.m, k = a.k;
  const int lane = threadIdx.x % 32;
  const int kv = k / 8;  // 16-byte vectors per row
  const int half = kEpi == kRopeKv ? a.rope.layout.head_dim / 2 : 1;
  // Groups of kWarps warps' rows; a block takes groups blockIdx.x, + gridDim.x, ... The
  // launcher gives each group its own block: a grid capped at the resident blocks (each
  // paying kNorm's prologue once) measured slower with PDL on an H100 (6.23 against 5.88 ms a
  // step): late-resident blocks start all their groups late.
  const int64_t rows_per_group = kEpi == kStore ? kWarps * R : kWarps;
  const int64_t groups = (m + rows_per_group - 1) / rows_per_group;
  const uint4* xr = kNorm ? xs_smem : reinterpret_cast<const uint4*>(a.x);

  int64_t row0 = 0, rows[R];
  bool active = false;
  const uint4* wr[R];
  auto setup = [&](int64_t group) {
    const int64_t warp_id = group * kWarps + threadIdx.x / 32;
    row0 = kEpi == kStore ? warp_id * R : warp_id;  // kStore: first row; else the pair
    active = row0 < m;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (kEpi == kStore) {
        rows[r] = row0 + r < m ? row0 + r : m - 1;
      } else if constexpr (kEpi == kSiluMul) {
        rows[r] = row0 + r * static_cast<int64_t>(m);
      } else {
        rows[r] = (row0 / half) * 2 * half + row0 % half + r * half;
      }
      if (!active) rows[r] = 0;
      wr[r] = reinterpret_cast<const uint4*>(a.w + rows[r] * k);
    }
  };
  uint4 wv[kUnroll][R];
  auto load_w = [&](int v0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = v0 + u * 32 < kv ? LoadStreaming(wr[r] + v0 + u * 32) : make_uint4(0, 0, 0, 0);
  };

  setup(blockIdx.x);
  if (!kNorm && !active) {
    GridDependentsLaunch();
    return;
  }
  // PDL: the first weights stream in while the kernel that writes x is still finishing.
  if (active) load_w(lane);
  GridDependencyWait();
  if constexpr (kNorm) NormPrologue<kN>(a.norm, k, xs_smem);

  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    if (group != blockIdx.x) {
      setup(group);
      if (active) load_w(lane);
    }
    const bool last = group + gridDim.x >= groups;
    if (!active) {
      if (last) GridDependentsLaunch();
      continue;
    }
    float acc[R][kN];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[r][j] = 0.f;
    for (int v0 = lane; v0 < kv; v0 += 32 * kUnroll) {
      if (v0 != lane) load_w(v0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * 32;
        if (v >= kv) break;
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) Bf16x8ToFloat(wv[u][r], wf[r]);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          float xf[8];
          if constexpr (kNorm) {
            Bf16x8ToFloat(xr[static_cast<int64_t>(j) * kv + v], xf);
          } else {
            Bf16x8ToFloat(__ldg(xr + static_cast<int64_t>(j) * kv + v), xf);
          }
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(wf[r][e], xf[e], acc[r][j]);
        }
      }
    }
    if (last) GridDependentsLaunch();
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[r][j] = WarpSum(acc[r][j]);
    if (lane == 0) StoreOutputs<kN, OutT, kEpi>(a, acc, row0, rows, half);
  }
}

}  // namespace kvfleet::kernels::gemv
