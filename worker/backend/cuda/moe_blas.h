// MoeBlas: an MoE block's two expert products for prefill through cuBLAS's grouped GEMM
// (cublasGemmGroupedBatchedEx, one group per non-empty expert) instead of kernels/moe.h's
// grouped tensor-core GEMM. The routed rows are first gathered in grouped order
// (LaunchMoeGather), so each expert's rows are one contiguous matrix, then
//
//   gate_up[r] = xs[r] · W_gu[e]^T    ([S][2N]: gate then up, as LaunchMoeGroupedGemm writes)
//   act = SiluMul(gate_up)            ([S][N])
//   y[r] = act[r] · W_down[e]^T       ([S][H])
//
// for the rows r of each expert e. cuBLAS takes the group sizes on the host, so a call copies
// LaunchMoeGroup's offsets back and waits for them: one stream synchronisation a call, which a
// CUDA graph cannot hold (prefill only; decode steps take the gemv or the tensor-core GEMM).
//
// Thread safety: thread-compatible (the engine thread runs every step).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace kvfleet::backend::cuda {

class MoeBlas {
 public:
  // For blocks of up to `experts` experts.
  static Result<std::unique_ptr<MoeBlas>> Make(int32_t experts);
  ~MoeBlas();
  MoeBlas(const MoeBlas&) = delete;
  MoeBlas& operator=(const MoeBlas&) = delete;

  // w_gate_up: [E][2N][H]; w_down: [E][H][N]; x: [T][H] token rows read through sorted[r] /
  // gather_div, or with gather_div 0 rows already in grouped order (x is then read as xs);
  // sorted, offsets: LaunchMoeGroup's, on the device; xs: [S][H] scratch (unused with
  // gather_div 0); gate_up: [S][2N]; act: [S][N]; y: [S][H].
  // REQUIRES: E <= experts; H, N multiples of 8; the stream not capturing.
  Status Products(const __nv_bfloat16* w_gate_up, const __nv_bfloat16* w_down, const __nv_bfloat16* x,
                  int32_t gather_div, const int32_t* sorted, const int32_t* offsets, __nv_bfloat16* xs,
                  __nv_bfloat16* gate_up, __nv_bfloat16* act, __nv_bfloat16* y, int32_t S, int32_t E, int32_t N,
                  int32_t H, cudaStream_t stream);

 private:
  explicit MoeBlas(int32_t experts) : experts_(experts) {}

  int32_t experts_;
  cublasHandle_t handle_ = nullptr;
  int32_t* offsets_host_ = nullptr;  // pinned [experts + 1]
  // The pointer arrays of both products, [6][experts] (A, B, C of gate/up, then of down):
  // filled in pinned memory, copied to the device, which cuBLAS reads them from.
  void** pointers_host_ = nullptr;
  void** pointers_ = nullptr;
};

}  // namespace kvfleet::backend::cuda
