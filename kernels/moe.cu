// The kernels of moe.h. Each waits for the previous kernel of the stream (PDL, launch.h)
// before it reads activations or routing.
#include <mma.h>

#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/mma.cuh"
#include "kernels/moe.h"

namespace kvfleet::kernels {
namespace {

// One warp per token: the router row in registers (lane + 32·i), softmax, then k rounds of a
// warp argmax (larger probability, then lower id), each removing its winner.
constexpr int kRouteWarps = 4;
constexpr int kRoutePerLane = kMoeMaxExperts / 32;

__device__ __forceinline__ float LogitValue(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float LogitValue(float v) { return v; }

// The warp's largest (value, expert) by value, ties to the lower expert id, into every lane;
// kNoExpert in `best_e` marks a lane with nothing to offer.
constexpr int kNoExpert = 0x7fffffff;
__device__ __forceinline__ void WarpArgMax(float& best, int& best_e) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oe = __shfl_xor_sync(0xffffffffu, best_e, off);
    if (oe != kNoExpert && (best_e == kNoExpert || ob > best || (ob == best && oe < best_e))) {
      best = ob;
      best_e = oe;
    }
  }
}

template <typename Logit>
__global__ void MoeRouteKernel(const Logit* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                               int32_t* experts, float* weights) {
  GridDependentsLaunch();
  GridDependencyWait();
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (t >= T) return;
  float p[kRoutePerLane];
  float zmax = -INFINITY;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? LogitValue(logits[t * ld + e]) : -INFINITY;
    zmax = fmaxf(zmax, p[i]);
  }
  zmax = WarpMax(zmax);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    p[i] = lane + 32 * i < E ? expf(p[i] - zmax) : 0.f;
    sum += p[i];
  }
  sum = WarpSum(sum);
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) p[i] = lane + 32 * i < E ? p[i] / sum : -1.f;  // -1: no expert
  float chosen[kMoeMaxTopK];
  float chosen_sum = 0.f;
  for (int j = 0; j < k; ++j) {
    float best = -2.f;
    int best_e = kNoExpert;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      if (p[i] > best) {  // ascending ids within a lane: the first of equals stays
        best = p[i];
        best_e = lane + 32 * i;
      }
    }
    WarpArgMax(best, best_e);
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      if (lane + 32 * i == best_e) p[i] = -1.f;
    }
    chosen[j] = best;
    chosen_sum += best;
    if (lane == 0) experts[t * k + j] = best_e;
  }
  if (lane == 0) {
    for (int j = 0; j < k; ++j) weights[t * k + j] = normalize ? chosen[j] / chosen_sum : chosen[j];
  }
}

// One block: counts per expert, the groups' offsets (one thread: E is small), then each
// route takes the next row of its group.
__global__ void MoeGroupKernel(const int32_t* experts, int32_t S, int32_t E, int32_t* sorted, int32_t* position,
                               int32_t* offsets, int32_t* tile_offsets, int32_t* active) {
  __shared__ int32_t next[kMoeMaxExperts];
  GridDependentsLaunch();
  GridDependencyWait();
  for (int e = threadIdx.x; e < E; e += blockDim.x) next[e] = 0;
  __syncthreads();
  for (int r = threadIdx.x; r < S; r += blockDim.x) atomicAdd(&next[experts[r]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t row = 0, tile = 0, used = 0;
    for (int e = 0; e < E; ++e) {
      const int32_t count = next[e];
      if (active != nullptr && count > 0) active[1 + used++] = e;
      offsets[e] = row;
      tile_offsets[e] = tile;
      next[e] = row;
      row += count;
      tile += (count + kMoeTileRows - 1) / kMoeTileRows;
    }
    offsets[E] = row;
    tile_offsets[E] = tile;
    if (active != nullptr) active[0] = used;
  }
  __syncthreads();
  for (int r = threadIdx.x; r < S; r += blockDim.x) {
    const int32_t at = atomicAdd(&next[experts[r]], 1);
    sorted[at] = r;
    position[r] = at;
  }
}

// A 64 x 64 tile of one expert's group per block: 4 warps of 2 x 2 WMMA bf16 fragments
// (32 x 32 each), K in steps of 32 staged through shared memory by cp.async, kGemmStages
// steps in flight; rows past the group and columns past N load as zeros and are not stored.
constexpr int kGemmTileN = 64;
constexpr int kGemmTileK = 32;
constexpr int kGemmLd = kGemmTileK + 8;  // bf16 elements per staged row (keeps 32-byte fragment alignment)
constexpr int kGemmThreads = 128;
constexpr int kGemmStages = 3;
static_assert(kMoeTileRows == 64, "the tile loops below assume 64 rows");

__global__ void __launch_bounds__(kGemmThreads)
    MoeGroupedGemmKernel(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted, int32_t gather_div,
                         const int32_t* offsets, const int32_t* tile_offsets, __nv_bfloat16* y, int32_t E, int32_t N,
                         int32_t K) {
  using namespace nvcuda;
  __shared__ __align__(128) __nv_bfloat16 a_s[kGemmStages][kMoeTileRows][kGemmLd];
  __shared__ __align__(128) __nv_bfloat16 b_s[kGemmStages][kGemmTileN][kGemmLd];
  __shared__ __align__(32) float c_s[kMoeTileRows][kGemmTileN + 4];
  GridDependentsLaunch();
  GridDependencyWait();
  const int32_t tile = blockIdx.y;
  if (tile >= tile_offsets[E]) return;
  // The expert: the last e with tile_offsets[e] <= tile (empty groups share their offset
  // with the next, so the last one is the group that holds the tile).
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_offsets[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int32_t e = lo;
  const int32_t row0 = offsets[e] + (tile - tile_offsets[e]) * kMoeTileRows;
  const int32_t rows = min(kMoeTileRows, offsets[e + 1] - row0);
  const int32_t n0 = blockIdx.x * kGemmTileN;
  const __nv_bfloat16* we = w + int64_t(e) * N * K;

  // Each thread stages 2 rows x 8 columns of the A (x) and B (w) tiles per K step.
  const int vec = threadIdx.x % 4;
  const __nv_bfloat16* a_row[2];
  const __nv_bfloat16* b_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = threadIdx.x / 4 + 32 * i;
    const bool a_ok = r < rows;
    const int64_t src = !a_ok ? 0 : gather_div > 0 ? sorted[row0 + r] / gather_div : row0 + r;
    a_row[i] = a_ok ? x + src * K : nullptr;
    b_row[i] = n0 + r < N ? we + int64_t(n0 + r) * K : nullptr;
  }
  const int32_t steps = (K + kGemmTileK - 1) / kGemmTileK;
  auto stage_in = [&](int stage, int32_t step) {
    const int32_t c = step * kGemmTileK + vec * 8;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = threadIdx.x / 4 + 32 * i;
      const bool a_ok = a_row[i] != nullptr && c < K, b_ok = b_row[i] != nullptr && c < K;
      CpAsync16(&a_s[stage][r][vec * 8], a_ok ? a_row[i] + c : x, a_ok);  // !ok: zero-filled, nothing read
      CpAsync16(&b_s[stage][r][vec * 8], b_ok ? b_row[i] + c : w, b_ok);
    }
  };
#pragma unroll
  for (int s = 0; s < kGemmStages - 1; ++s) {
    if (s < steps) stage_in(s, s);
    CpAsyncCommit();
  }
  const int warp = threadIdx.x / 32;
  const int wr = warp / 2, wc = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int32_t step = 0; step < steps; ++step) {
    CpAsyncWait<kGemmStages - 2>();  // this step's copies have landed (this thread's) ...
    __syncthreads();                 // ... everyone's, and the stage refilled below is read by no one
    const int32_t next = step + kGemmStages - 1;
    if (next < steps) stage_in(next % kGemmStages, next);
    CpAsyncCommit();
    const int stage = step % kGemmStages;
#pragma unroll
    for (int kk = 0; kk < kGemmTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> af[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bf[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(af[i], &a_s[stage][wr * 32 + i * 16][kk], kGemmLd);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(bf[j], &b_s[stage][wc * 32 + j * 16][kk], kGemmLd);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(&c_s[wr * 32 + i * 16][wc * 32 + j * 16], acc[i][j], kGemmTileN + 4,
                              wmma::mem_row_major);
    }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kMoeTileRows * (kGemmTileN / 8); idx += kGemmThreads) {
    const int r = idx / (kGemmTileN / 8), v = idx % (kGemmTileN / 8);
    if (r >= rows || n0 + v * 8 >= N) continue;
    float f[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) f[q] = c_s[r][v * 8 + q];
    *reinterpret_cast<uint4*>(y + int64_t(row0 + r) * N + n0 + v * 8) = FloatToBf16x8(f);
  }
}

// One block per token row; each thread 8 columns at a time. kWeighted: out = Σ_j w_tj·y_tj (the
// routes' scores weight the outputs). Otherwise (Llama 4: the scores scaled the experts' inputs)
// out = addend + bf16(Σ_j y_tj), the addend being the shared expert's output.
template <bool kWeighted>
__global__ void MoeCombineKernel(const __nv_bfloat16* y, const float* weights, const int32_t* position,
                                 const __nv_bfloat16* addend, __nv_bfloat16* out, int32_t k, int32_t H) {
  GridDependentsLaunch();
  GridDependencyWait();
  const int64_t t = blockIdx.x;
  for (int v = threadIdx.x; v < H / 8; v += blockDim.x) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; j < k; ++j) {
      float f[8];
      Bf16x8ToFloat(reinterpret_cast<const uint4*>(y + int64_t(position[t * k + j]) * H)[v], f);
      const float wt = kWeighted ? weights[t * k + j] : 1.f;
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] += wt * f[q];
    }
    if constexpr (!kWeighted) {
      float a[8];
      Bf16x8ToFloat(reinterpret_cast<const uint4*>(addend + t * H)[v], a);
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[q] = a[q] + Bf16Round(acc[q]);
    }
    reinterpret_cast<uint4*>(out + t * H)[v] = FloatToBf16x8(acc);
  }
}

}  // namespace

template <typename Logit>
cudaError_t LaunchRoute(const Logit* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                        int32_t* experts, float* weights, cudaStream_t stream) {
  if (T <= 0) return cudaSuccess;
  if (E < 1 || E > kMoeMaxExperts || ld < E || k < 1 || k > E || k > kMoeMaxTopK) return cudaErrorInvalidValue;
  return LaunchKernel(MoeRouteKernel<Logit>, (T + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream, logits,
                      ld, T, E, k, normalize, experts, weights);
}

cudaError_t LaunchMoeRoute(const __nv_bfloat16* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                           int32_t* experts, float* weights, cudaStream_t stream) {
  return LaunchRoute(logits, ld, T, E, k, normalize, experts, weights, stream);
}

cudaError_t LaunchMoeRoute(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                           int32_t* experts, float* weights, cudaStream_t stream) {
  return LaunchRoute(logits, ld, T, E, k, normalize, experts, weights, stream);
}

cudaError_t LaunchMoeGroup(const int32_t* experts, int32_t S, int32_t E, int32_t* sorted, int32_t* position,
                           int32_t* offsets, int32_t* tile_offsets, cudaStream_t stream, int32_t* active) {
  if (E < 1 || E > kMoeMaxExperts || S < 0) return cudaErrorInvalidValue;
  return LaunchKernel(MoeGroupKernel, 1, 1024, 0, stream, experts, S, E, sorted, position, offsets, tile_offsets,
                      active);
}

cudaError_t LaunchMoeGroupedGemm(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted,
                                 int32_t gather_div, const int32_t* offsets, const int32_t* tile_offsets,
                                 __nv_bfloat16* y, int32_t S, int32_t E, int32_t N, int32_t K, cudaStream_t stream) {
  if (S <= 0) return cudaSuccess;
  if (K % 8 != 0 || N % 8 != 0 || E < 1 || gather_div < 0) return cudaErrorInvalidValue;
  const dim3 grid((N + kGemmTileN - 1) / kGemmTileN, MoeMaxTiles(S, E));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return LaunchKernel(MoeGroupedGemmKernel, grid, kGemmThreads, 0, stream, w, x, sorted, gather_div, offsets,
                      tile_offsets, y, E, N, K);
}

cudaError_t LaunchMoeCombine(const __nv_bfloat16* y, const float* weights, const int32_t* position,
                             __nv_bfloat16* out, int32_t T, int32_t k, int32_t H, cudaStream_t stream) {
  if (T <= 0) return cudaSuccess;
  if (H % 8 != 0 || k < 1) return cudaErrorInvalidValue;
  return LaunchKernel(MoeCombineKernel<true>, T, 256, 0, stream, y, weights, position, nullptr, out, k, H);
}

}  // namespace kvfleet::kernels

// ---- Llama 4: the sigmoid router, the scaled gather, the unweighted combine plus the shared expert ----
namespace kvfleet::kernels {
namespace {

// One warp per token, as MoeRouteKernel: the logits in registers, k rounds of a warp argmax
// (larger logit, then lower id) over the experts not yet taken.
__global__ void MoeRouteSigmoidKernel(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k,
                                      int32_t* experts, float* weights) {
  GridDependentsLaunch();
  GridDependencyWait();
  const int lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + threadIdx.x / 32;
  if (t >= T) return;
  float z[kRoutePerLane];
  uint32_t open = 0;  // bit i: expert lane + 32·i exists and is not taken
#pragma unroll
  for (int i = 0; i < kRoutePerLane; ++i) {
    const int e = lane + 32 * i;
    z[i] = e < E ? logits[t * ld + e] : 0.f;
    if (e < E) open |= 1u << i;
  }
  for (int j = 0; j < k; ++j) {
    float best = 0.f;
    int best_e = kNoExpert;
#pragma unroll
    for (int i = 0; i < kRoutePerLane; ++i) {
      if ((open >> i & 1u) && (best_e == kNoExpert || z[i] > best)) {  // ascending ids: the first of equals stays
        best = z[i];
        best_e = lane + 32 * i;
      }
    }
    WarpArgMax(best, best_e);
    // k <= E: some expert is still open, so best_e is one.
    if (best_e % 32 == lane) open &= ~(1u << (best_e / 32));
    if (lane == 0) {
      experts[t * k + j] = best_e;
      weights[t * k + j] = Bf16Round(1.f / (1.f + expf(-best)));
    }
  }
}

// One block per grouped row; each thread 8 columns at a time. kScaled: each row times its
// route's weight (Llama 4), else copied.
template <bool kScaled>
__global__ void MoeGatherKernel(const __nv_bfloat16* x, const int32_t* sorted, int32_t k, const float* weights,
                                __nv_bfloat16* xs, int32_t H) {
  GridDependentsLaunch();
  GridDependencyWait();
  const int64_t r = blockIdx.x;
  const int32_t route = sorted[r];
  const float wt = kScaled ? weights[route] : 1.f;
  const __nv_bfloat16* src = x + int64_t(route / k) * H;
  for (int v = threadIdx.x; v < H / 8; v += blockDim.x) {
    float f[8];
    Bf16x8ToFloat(reinterpret_cast<const uint4*>(src)[v], f);
#pragma unroll
    for (int q = 0; q < 8; ++q) f[q] *= wt;
    reinterpret_cast<uint4*>(xs + r * H)[v] = FloatToBf16x8(f);
  }
}

}  // namespace

cudaError_t LaunchMoeRouteSigmoid(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k, int32_t* experts,
                                  float* weights, cudaStream_t stream) {
  if (T <= 0) return cudaSuccess;
  if (E < 1 || E > kMoeMaxExperts || ld < E || k < 1 || k > E || k > kMoeMaxTopK) return cudaErrorInvalidValue;
  return LaunchKernel(MoeRouteSigmoidKernel, (T + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, stream, logits,
                      ld, T, E, k, experts, weights);
}

cudaError_t LaunchMoeGatherScaled(const __nv_bfloat16* x, const int32_t* sorted, int32_t k, const float* weights,
                                  __nv_bfloat16* xs, int32_t S, int32_t H, cudaStream_t stream) {
  if (S <= 0) return cudaSuccess;
  if (H % 8 != 0 || k < 1) return cudaErrorInvalidValue;
  return LaunchKernel(MoeGatherKernel<true>, S, 128, 0, stream, x, sorted, k, weights, xs, H);
}

cudaError_t LaunchMoeGather(const __nv_bfloat16* x, const int32_t* sorted, int32_t k, __nv_bfloat16* xs, int32_t S,
                            int32_t H, cudaStream_t stream) {
  if (S <= 0) return cudaSuccess;
  if (H % 8 != 0 || k < 1) return cudaErrorInvalidValue;
  return LaunchKernel(MoeGatherKernel<false>, S, 128, 0, stream, x, sorted, k, nullptr, xs, H);
}

cudaError_t LaunchMoeCombineAdd(const __nv_bfloat16* y, const int32_t* position, const __nv_bfloat16* addend,
                                __nv_bfloat16* out, int32_t T, int32_t k, int32_t H, cudaStream_t stream) {
  if (T <= 0) return cudaSuccess;
  if (H % 8 != 0 || k < 1) return cudaErrorInvalidValue;
  return LaunchKernel(MoeCombineKernel<false>, T, 256, 0, stream, y, nullptr, position, addend, out, k, H);
}

}  // namespace kvfleet::kernels
