// Mixture-of-experts kernels (Mixtral, Qwen3-MoE, Llama 4; worker/model/model_config.h
// MoeConfig has the math): routing, grouping a step's S = T·k routes (token, chosen expert) by expert on
// the device, the experts' products as one grouped GEMM over those groups, and the weighted
// un-permute back to token rows. Every grid is fixed by T and k alone: no host sync and no
// data-dependent launch, so decode steps stay inside CUDA graphs.
// Framework-free: raw pointers, every shape in a comment; launchers take a stream and return
// cudaError_t; shape checks live in the backend. CPU references: moe_ref.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/moe_limits.h"

namespace kvfleet::kernels {

// Routing as HF's routers: p = softmax(fp32(logits[t])) over the E experts, the top k by
// probability (ties: the lower expert id first), divided by their sum when `normalize`.
//   logits: [T][ld] bf16, the first E of each row the router's product (ld >= E: a router
//   padded to whole 16-byte rows); experts: [T][k] int32; weights: [T][k] fp32.
// REQUIRES: 1 <= k <= min(E, kMoeMaxTopK), E <= kMoeMaxExperts.
cudaError_t LaunchMoeRoute(const __nv_bfloat16* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                           int32_t* experts, float* weights, cudaStream_t stream);
// The same over fp32 logits (the cuda backend's router product: a routing decision is
// discrete, so the logits are not rounded to bf16 before it; HF's fp32 reference flips
// experts within bf16 rounding of a near-tie otherwise).
cudaError_t LaunchMoeRoute(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                           int32_t* experts, float* weights, cudaStream_t stream);

// Llama 4's router (the sigmoid mode of routing): the top k of the E logits by value (ties:
// the lower expert id first), each weighted bf16(sigmoid(logit)) (HF: sigmoid in fp32, cast to
// the model's bf16), not normalised. The weights scale the experts' inputs
// (LaunchMoeGatherScaled), and LaunchMoeCombineAdd sums the outputs unweighted.
//   logits: [T][ld] fp32; experts: [T][k]; weights: [T][k]. REQUIRES: as LaunchMoeRoute.
cudaError_t LaunchMoeRouteSigmoid(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k, int32_t* experts,
                                  float* weights, cudaStream_t stream);

// Groups the S routes by expert. Rows within a group come in no fixed order; nothing depends
// on it (each row of the grouped GEMM is computed alone, and the combine reads by position).
//   experts: [S] (route r = t·k + j); sorted: [S] route ids, expert 0's group first;
//   position: [S] each route's row in sorted; offsets: [E + 1] each group's first row;
//   tile_offsets: [E + 1] each group's first tile of kMoeTileRows rows.
//   active: null, or [E + 1]: active[0] the number of non-empty groups, then those experts in
//   ascending order (what LaunchMoeGroupedGemv walks).
// REQUIRES: E <= kMoeMaxExperts.
cudaError_t LaunchMoeGroup(const int32_t* experts, int32_t S, int32_t E, int32_t* sorted, int32_t* position,
                           int32_t* offsets, int32_t* tile_offsets, cudaStream_t stream, int32_t* active = nullptr);

// The experts' products over their groups, on tensor cores (WMMA bf16, tiles staged by
// cp.async; fp32 accumulation, one bf16 rounding): row r of expert e's group gets
//   y[r][n] = bf16(Σ_c x[src(r)][c] · w[e][n][c]),  src(r) = sorted[r] / gather_div
// (x holds token rows, k routes each), or src(r) = r when gather_div == 0 (x is already in
// grouped order).
//   w: [E][N][K] bf16 (each expert's [out][in] projection); x: [rows][K]; y: [S][N].
// REQUIRES: K % 8 == 0, N % 8 == 0, w and x 16-byte aligned; y must not alias x.
cudaError_t LaunchMoeGroupedGemm(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted,
                                 int32_t gather_div, const int32_t* offsets, const int32_t* tile_offsets,
                                 __nv_bfloat16* y, int32_t S, int32_t E, int32_t N, int32_t K, cudaStream_t stream);

// The routed rows in grouped order, each scaled by its route's weight (Llama 4 scales an
// expert's input, HF: bf16(hidden · bf16 score)): xs[r] = bf16(x[sorted[r] / k] · weights[sorted[r]])
// for r < S; LaunchMoeGroupedGemm then reads xs with gather_div 0.
//   x: [T][H]; sorted: [S] (LaunchMoeGroup's); weights: [S]; xs: [S][H]. REQUIRES: H % 8 == 0, k >= 1.
cudaError_t LaunchMoeGatherScaled(const __nv_bfloat16* x, const int32_t* sorted, int32_t k, const float* weights,
                                  __nv_bfloat16* xs, int32_t S, int32_t H, cudaStream_t stream);
// The same unscaled: xs[r] = x[sorted[r] / k], each expert's rows one contiguous matrix (the
// cuBLAS grouped products of worker/backend/cuda/moe_blas.h read them so).
cudaError_t LaunchMoeGather(const __nv_bfloat16* x, const int32_t* sorted, int32_t k, __nv_bfloat16* xs, int32_t S,
                            int32_t H, cudaStream_t stream);

// Llama 4's un-permute: out[t][h] = bf16(addend[t][h] + bf16(Σ_j y[position[t·k + j]][h])), the
// routes' rows summed unweighted in fp32 in j order (their weights scaled the experts' inputs)
// and rounded, then added to addend, the shared expert's output (HF: shared_expert(x), then
// add_ of the experts' bf16 sum). addend may alias out (each element is read, then written).
//   y: [S][H]; position: [T·k]; addend, out: [T][H]. REQUIRES: H % 8 == 0.
cudaError_t LaunchMoeCombineAdd(const __nv_bfloat16* y, const int32_t* position, const __nv_bfloat16* addend,
                                __nv_bfloat16* out, int32_t T, int32_t k, int32_t H, cudaStream_t stream);

// The same products for decode steps, where a group holds a few rows (at most T: a token
// chooses an expert once): memory-bound, so each expert's weights are streamed once per
// kMoeGemvChunk rows (gemv.h's scheme: one warp per weight row pair, 16-byte streaming loads,
// several in flight per lane) instead of through 64-row tensor-core tiles that are mostly empty.
// One block column per possible non-empty group (min(S, E)), read from `active`. With
// silu_mul, w holds each expert's gate rows then up rows ([E][2N][K]) and y[r][n] =
// bf16(bf16(silu(g)) · u) with g, u the bf16 products (LaunchMoeGroupedGemm into [S][2N]
// followed by LaunchSiluMul, without the round trip).
//   w: [E][N][K] (or [E][2N][K]); x, sorted, gather_div, offsets: as LaunchMoeGroupedGemm;
//   active: from LaunchMoeGroup; y: [S][N]; T: the step's tokens (bounds a group's rows).
// REQUIRES: as LaunchMoeGroupedGemm.
cudaError_t LaunchMoeGroupedGemv(const __nv_bfloat16* w, const __nv_bfloat16* x, const int32_t* sorted,
                                 int32_t gather_div, const int32_t* offsets, const int32_t* active, __nv_bfloat16* y,
                                 bool silu_mul, int32_t T, int32_t S, int32_t E, int32_t N, int32_t K,
                                 cudaStream_t stream);

// The un-permute: out[t][h] = bf16(Σ_j weights[t·k + j] · y[position[t·k + j]][h]), summed in
// fp32 in j order (HF rounds each weighted expert output to bf16 and sums those in bf16).
//   y: [S][H] bf16; weights, position: [T·k]; out: [T][H]. REQUIRES: H % 8 == 0.
cudaError_t LaunchMoeCombine(const __nv_bfloat16* y, const float* weights, const int32_t* position,
                             __nv_bfloat16* out, int32_t T, int32_t k, int32_t H, cudaStream_t stream);

}  // namespace kvfleet::kernels
