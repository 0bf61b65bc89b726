// Skinny matrix products for decode steps with few token rows: y = x · wᵀ (+ bias) when x
// has at most kGemvMaxRows rows. Memory-bound: the whole of w is read once, 16 bytes per
// load, several loads in flight per lane; x is small and stays in L1/L2. Framework-free: raw
// pointers, every shape in a comment. CPU reference: gemv_ref.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/paged_kv.h"

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

// RMSNorm (with the residual add) as the matrix product's prologue: LaunchRmsNorm
// (small_kernels.h) followed by LaunchGemv / LaunchGemvSiluMul in one launch, same roundings.
// Every thread block normalises the n rows itself into shared memory (n * k bf16, L2-resident
// inputs: cheap against the m * k weights it streams); block 0 alone writes the residual, so
// it goes to a buffer no block reads.
struct GemvRmsNorm {
  const __nv_bfloat16* x = nullptr;            // [n][k]: the sublayer's output, or the hidden
                                               // state itself when residual_in is null
  const __nv_bfloat16* residual_in = nullptr;  // [n][k] or null
  __nv_bfloat16* residual_out = nullptr;       // [n][k]: bf16(residual_in + x), or null (not
                                               // stored); must not alias x or residual_in
  const __nv_bfloat16* weight = nullptr;       // [k]
  float eps = 0.f;
};

// Largest n * k * 2 (the normalised x in shared memory) LaunchRmsNormGemv takes.
constexpr int64_t kGemvRmsNormMaxXBytes = 96 * 1024;

// y = RMSNorm(norm) · wᵀ (+ bias) as LaunchGemv with bf16 output (silu_mul == false), or the
// SiLU-mul of the gate/up pair as LaunchGemvSiluMul (silu_mul == true: w [2m][k], bias [2m],
// y [n][m]).
// REQUIRES: as LaunchGemv; n * k * 2 <= kGemvRmsNormMaxXBytes; residual_out only with residual_in; 16-byte
// aligned norm pointers; y must not alias the norm's inputs.
cudaError_t LaunchRmsNormGemv(const GemvRmsNorm& norm, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                              __nv_bfloat16* y, bool silu_mul, int32_t m, int32_t n, int32_t k, cudaStream_t stream);

// The QKV product's epilogue: RoPE and the K/V store into the paged cache, as
// LaunchRopeKvStore (small_kernels.h) computes them from the product's bf16 output.
struct GemvRopeKvStore {
  const int32_t* positions = nullptr;  // [n]
  const int32_t* slots = nullptr;      // [n] block_id * block_size + slot, < 0 = not stored
  const float* inv_freq = nullptr;     // [head_dim / 2] (rope.h)
  __nv_bfloat16* q_out = nullptr;      // [n][num_q_heads][head_dim]
  __nv_bfloat16* kv_pool = nullptr;    // PagedKvLayout
  uint8_t* kv_fp8 = nullptr;           // instead of kv_pool: fp8 e4m3 pages (layout.elem_bytes 1),
  KvScales scales;                     // e4m3(bf16(x) / scale) with this layer's scales
  PagedKvLayout layout;
  int32_t layer = 0;                   // within the pool
  int32_t num_q_heads = 0;
  bool rotate = true;                  // false: q and K stored un-rotated (StreamingLLM)
};

// Largest n the RoPE epilogue takes: its per-row rotation (sincosf) at 8 rows spills registers.
constexpr int32_t kGemvRopeKvMaxRows = 4;

// x · wᵀ (+ bias) with w the stacked [(num_q_heads + 2 num_kv_heads) * head_dim][k] q, k, v
// projection, then RoPE + K/V store: LaunchGemv and LaunchRopeKvStore in one launch; the
// [n][q + 2 kv] intermediate is never written. A warp takes dims d and d + head_dim / 2 of one
// head, the rotate_half pair.  REQUIRES: as LaunchGemv; n <= kGemvRopeKvMaxRows; head_dim even.
cudaError_t LaunchGemvRopeKv(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                             const GemvRopeKvStore& rope, int32_t n, int32_t k, cudaStream_t stream);

// The same with RMSNorm(norm) as x: RMSNorm(norm) · wᵀ (+ bias) with w the stacked [(num_q_heads + 2 num_kv_heads) * head_dim][k]
// q, k, v projection, then RoPE + K/V store: LaunchRmsNorm, LaunchGemv and LaunchRopeKvStore
// in one launch; the [n][q + 2 kv] intermediate is never written. A warp takes dims d and
// d + head_dim / 2 of one head, the rotate_half pair.
// REQUIRES: as LaunchRmsNormGemv; n <= kGemvRopeKvMaxRows; head_dim even.
cudaError_t LaunchRmsNormGemvRopeKv(const GemvRmsNorm& norm, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                    const GemvRopeKvStore& rope, int32_t n, int32_t k, cudaStream_t stream);

}  // namespace kvfleet::kernels
