// LaunchMoeGroupedGemv (moe.h): the experts' products for decode steps.
//
// Grid: x over the expert's output rows, kWarps warps a block, each warp one row pair (its
// rows n and n + 1, or with silu_mul the gate row n and the up row N + n); y over the groups
// that can be non-empty (min(S, E)), block column j taking the j-th of `active`. A warp walks
// its two weight rows in 16-byte vectors strided by the warp, kUnroll vectors of each loaded
// before the first is used (streaming loads: each weight byte is used once per chunk), and
// keeps kChunk·2 fp32 sums: up to kChunk of the group's rows at a time, their x rows read
// through the read-only path (every warp of the expert re-reads them). A group of more rows
// takes several passes; the later ones find the block's weight rows in L2. PDL as gemv.cuh:
// the routing that names the expert is waited for first (the weights read depend on it), the
// next kernel is let in once the weights are consumed.
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/moe.h"

namespace kvfleet::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;

template <int kChunk, bool kSilu>
__global__ void __launch_bounds__(kThreads)
    MoeGemvKernel(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted, int32_t gather_div,
                  const int32_t* offsets, const int32_t* active, __nv_bfloat16* y, int32_t N, int32_t K) {
  GridDependencyWait();
  const int32_t j = blockIdx.y;
  if (j >= active[0]) {
    GridDependentsLaunch();
    return;
  }
  const int32_t e = active[1 + j];
  const int32_t r0 = offsets[e], count = offsets[e + 1] - r0;
  const int lane = threadIdx.x % 32;
  const int64_t pair = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  // kSilu: pair n is the rows (n, N + n) of [2N][K]; else the rows (2n, 2n + 1) of [N][K].
  const int64_t first = kSilu ? pair : 2 * pair;
  if (first >= N) {
    GridDependentsLaunch();
    return;
  }
  const bool second = kSilu || first + 1 < N;
  const int64_t rows_w = kSilu ? 2 * int64_t(N) : N;
  const int kv = K / 8;
  const uint4* wr[2];
  wr[0] = reinterpret_cast<const uint4*>(w + (int64_t(e) * rows_w + first) * K);
  wr[1] = reinterpret_cast<const uint4*>(w + (int64_t(e) * rows_w + (kSilu ? N + first : second ? first + 1 : first)) *
                                                 K);
  for (int32_t c0 = 0; c0 < count; c0 += kChunk) {
    const int n = min(kChunk, count - c0);
    const uint4* xr[kChunk];
#pragma unroll
    for (int q = 0; q < kChunk; ++q) {
      const int32_t r = r0 + c0 + min(q, n - 1);  // past n: a real row, its sums unused
      const int64_t src = gather_div > 0 ? sorted[r] / gather_div : r;
      xr[q] = reinterpret_cast<const uint4*>(x + src * K);
    }
    float acc[2][kChunk];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < kChunk; ++q) acc[i][q] = 0.f;
    for (int v0 = lane; v0 < kv; v0 += 32 * kUnroll) {
      uint4 wv[kUnroll][2];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          wv[u][i] = v0 + u * 32 < kv ? LoadStreaming(wr[i] + v0 + u * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * 32;
        if (v >= kv) break;
        float wf[2][8];
#pragma unroll
        for (int i = 0; i < 2; ++i) Bf16x8ToFloat(wv[u][i], wf[i]);
#pragma unroll
        for (int q = 0; q < kChunk; ++q) {
          if (q >= n) break;
          float xf[8];
          Bf16x8ToFloat(__ldg(xr[q] + v), xf);
#pragma unroll
          for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[i][q] = fmaf(wf[i][c], xf[c], acc[i][q]);
        }
      }
    }
    if (c0 + kChunk >= count) GridDependentsLaunch();
#pragma unroll
    for (int q = 0; q < kChunk; ++q) {
      if (q >= n) break;
      const float a0 = WarpSum(acc[0][q]), a1 = WarpSum(acc[1][q]);
      if (lane != 0) continue;
      __nv_bfloat16* yr = y + int64_t(r0 + c0 + q) * N;
      if constexpr (kSilu) {
        const float g = Bf16Round(a0), u = Bf16Round(a1);
        yr[first] = __float2bfloat16(Bf16Round(g / (1.f + expf(-g))) * u);
      } else {
        yr[first] = __float2bfloat16(a0);
        if (second) yr[first + 1] = __float2bfloat16(a1);
      }
    }
  }
}

template <int kChunk>
cudaError_t Launch(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted, int32_t gather_div,
                   const int32_t* offsets, const int32_t* active, __nv_bfloat16* y, bool silu_mul, int32_t S,
                   int32_t E, int32_t N, int32_t K, cudaStream_t stream) {
  const int64_t pairs = silu_mul ? N : (N + 1) / 2;
  const dim3 grid(static_cast<unsigned>((pairs + kWarps - 1) / kWarps), static_cast<unsigned>(std::min(S, E)));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return silu_mul ? LaunchKernel(MoeGemvKernel<kChunk, true>, grid, kThreads, 0, stream, w, x, sorted, gather_div,
                                 offsets, active, y, N, K)
                  : LaunchKernel(MoeGemvKernel<kChunk, false>, grid, kThreads, 0, stream, w, x, sorted, gather_div,
                                 offsets, active, y, N, K);
}

}  // namespace

cudaError_t LaunchMoeGroupedGemv(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted,
                                 int32_t gather_div, const int32_t* offsets, const int32_t* active, __nv_bfloat16* y,
                                 bool silu_mul, int32_t T, int32_t S, int32_t E, int32_t N, int32_t K,
                                 cudaStream_t stream) {
  if (S <= 0) return cudaSuccess;
  if (K % 8 != 0 || N % 8 != 0 || E < 1 || T < 1 || gather_div < 0) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 != 0) return cudaErrorInvalidValue;
  // A group holds at most T rows: the accumulators a pass needs, up to kMoeGemvChunk.
  if (T == 1) return Launch<1>(w, x, sorted, gather_div, offsets, active, y, silu_mul, S, E, N, K, stream);
  if (T == 2) return Launch<2>(w, x, sorted, gather_div, offsets, active, y, silu_mul, S, E, N, K, stream);
  if (T <= 4) return Launch<4>(w, x, sorted, gather_div, offsets, active, y, silu_mul, S, E, N, K, stream);
  static_assert(kMoeGemvChunk == 8);
  return Launch<8>(w, x, sorted, gather_div, offsets, active, y, silu_mul, S, E, N, K, stream);
}

}  // namespace kvfleet::kernels
