// Skinny GEMM kernel (see gemv.h for the contract and shapes).
//
// Grid: one warp per kRowsPerWarp rows of w, kWarps warps per block. Each lane walks its
// rows in 16-byte vectors strided by the warp (lane, lane + 32, ...), kUnroll vectors of
// every row loaded before the first is used: kRowsPerWarp * kUnroll independent 16-byte
// loads in flight per lane, which with a few warps per SM covers DRAM latency. w is read
// with streaming loads (no L1 allocation: each byte is used once); x through the read-only
// path (every warp of the SM re-reads it). Each lane keeps kRowsPerWarp * kN fp32 partial
// sums; a warp shuffle reduction ends the row, and lane 0 adds the bias and stores.
// PDL (launch.h): the first kUnroll vectors of every row are loaded before waiting for the
// previous kernel (w is constant); x, bias and y only after.
#pragma once

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

// kSiluMul == false: y = x w^T (+ bias), w [m][k]; a warp takes rows row0, row0 + 1.
// kSiluMul == true: w is [2m][k] (gate rows, then up rows); a warp takes the pair (i, m + i)
// and writes y[j][i] = bf16(bf16(silu(g)) * u) with g, u its two outputs rounded to bf16, as
// the GEMM followed by LaunchSiluMul (small_kernels.h) computes it.
template <int kN, typename OutT, bool kSiluMul = false>
__global__ void __launch_bounds__(kThreads) GemvKernel(const __nv_bfloat16* __restrict__ w,
                                                       const __nv_bfloat16* __restrict__ x,
                                                       const __nv_bfloat16* __restrict__ bias, OutT* __restrict__ y,
                                                       int32_t m, int32_t k) {
  constexpr int R = kRowsPerWarp;
  static_assert(!kSiluMul || R == 2, "a gate/up pair is one warp's two rows");
  const int lane = threadIdx.x % 32;
  const int64_t warp_id = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t row0 = kSiluMul ? warp_id : warp_id * R;
  const int64_t row_step = kSiluMul ? m : 1;  // between a warp's rows
  if (row0 >= m) {
    GridDependentsLaunch();
    return;
  }
  const int kv = k / 8;  // 16-byte vectors per row
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = kSiluMul ? row0 + r * row_step : (row0 + r < m ? row0 + r : m - 1);
    wr[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  const uint4* xr = reinterpret_cast<const uint4*>(x);

  float acc[R][kN];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[r][j] = 0.f;

  uint4 wv[kUnroll][R];
  auto load_w = [&](int v0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = v0 + u * 32 < kv ? LoadStreaming(wr[r] + v0 + u * 32) : make_uint4(0, 0, 0, 0);
  };
  // PDL: the first weights stream in while the kernel that writes x is still finishing.
  load_w(lane);
#if KVF_PDL_TRIGGER == 1
  GridDependentsLaunch();
#endif
  GridDependencyWait();
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
        Bf16x8ToFloat(__ldg(xr + static_cast<int64_t>(j) * kv + v), xf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(wf[r][e], xf[e], acc[r][j]);
      }
    }
  }
#if KVF_PDL_TRIGGER == 2
  GridDependentsLaunch();
#endif
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[r][j] = WarpSum(acc[r][j]);
  if constexpr (kSiluMul) {
    if (lane == 0) {
      const float bg = bias != nullptr ? __bfloat162float(bias[row0]) : 0.f;
      const float bu = bias != nullptr ? __bfloat162float(bias[row0 + m]) : 0.f;
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float g = __bfloat162float(__float2bfloat16(acc[0][j] + bg));
        const float u = __bfloat162float(__float2bfloat16(acc[1][j] + bu));
        const float silu = __bfloat162float(__float2bfloat16(g / (1.f + expf(-g))));
        Store(y + static_cast<int64_t>(j) * m + row0, silu * u);
      }
    }
    return;
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t i = row0 + r;
      if (i >= m) break;
      const float b = bias != nullptr ? __bfloat162float(bias[i]) : 0.f;
#pragma unroll
      for (int j = 0; j < kN; ++j) Store(y + static_cast<int64_t>(j) * m + i, acc[r][j] + b);
    }
  }
}

}  // namespace kvfleet::kernels::gemv
