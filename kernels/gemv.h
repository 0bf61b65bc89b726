// Skinny matrix products for decode steps with few token rows: y = x · wᵀ (+ bias) when x
// has at most kGemvMaxRows rows. Memory-bound: the whole of w is read once, 16 bytes per
// load, several loads in flight per lane; x is small and stays in L1/L2. Framework-free: raw
// pointers, every shape in a comment. CPU reference: gemv_ref.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvfleet::kernels {

// Largest number of x rows LaunchGemv takes: each row adds one accumulator per weight row
// held by a lane and one L1 read of x per 16 bytes of w; past 8 rows the tensor-core GEMM
// (cuBLASLt) is the right tool.
constexpr int32_t kGemvMaxRows = 8;

// y[j][i] = sum_c x[j][c] * w[i][c] (+ bias[i]), fp32 accumulation, written as bf16
// (out_f32 == false) or fp32 (out_f32 == true).
//   w: [m][k] bf16 (a projection as HF stores it, [out][in]); x: [n][k] bf16;
//   bias: [m] bf16 or null; y: [n][m].
// REQUIRES: 1 <= n <= kGemvMaxRows, k % 8 == 0, w, x 16-byte aligned; y must not alias x.
cudaError_t LaunchGemv(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, void* y,
                       bool out_f32, int32_t m, int32_t n, int32_t k, cudaStream_t stream);

// The gate/up projection fused with SiLU-and-mul: out[j][i] = bf16(bf16(silu(g)) * u) with
// g = bf16(x[j] · w[i] (+ bias[i])) and u = bf16(x[j] · w[inter + i] (+ bias[inter + i])),
// exactly LaunchGemv into [n][2 * inter] followed by LaunchSiluMul (small_kernels.h), without
// the intermediate's round trip and the second launch.
//   w: [2 * inter][k] bf16 (gate rows, then up rows); x: [n][k]; bias: [2 * inter] or null;
//   out: [n][inter] bf16.
// REQUIRES: as LaunchGemv; out must not alias x.
cudaError_t LaunchGemvSiluMul(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                              __nv_bfloat16* out, int32_t inter, int32_t n, int32_t k, cudaStream_t stream);

}  // namespace kvfleet::kernels
