// LtGemm: the cuda backend's matrix products through cuBLASLt, bf16 inputs with fp32
// accumulation, optionally a bf16 bias added in the epilogue.
//
//   Y[n][m] = X[n][k] · W[m][k]^T (+ bias[m])
// W is a projection as Hugging Face stores it ([out][in], row-major), X and Y are
// row-major activations (n tokens). In cuBLAS's column-major terms that is
// D[m x n] = op_T(A[k x m]) · B[k x n].
//
// Each (m, n, k, output type, bias) shape is planned once (descriptors + the heuristic's
// first algorithm) and cached; later calls with that shape only launch.
//
// Thread safety: thread-compatible (the engine thread runs every step).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/status.h"

namespace kvfleet::backend::cuda {

namespace config {
// cuBLASLt workspace: enough for its split-K and stream-K algorithms on Hopper
// (NVIDIA recommends 32 MiB for sm_90).
constexpr size_t kLtWorkspaceBytes = 32ull << 20;
}  // namespace config

class LtGemm {
 public:
  enum class Out : uint8_t { kBf16, kF32 };

  // Creates the handle and the workspace.
  static Result<std::unique_ptr<LtGemm>> Make();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // y = x · wᵀ (+ bias). x: [n][k] bf16; w: [m][k] bf16; bias: [m] bf16 or null;
  // y: [n][m] in `out`. REQUIRES: 16-byte aligned pointers, k % 8 == 0.
  Status Run(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, void* y, Out out,
             int64_t m, int64_t n, int64_t k, cudaStream_t stream);

  // Shapes planned so far.
  size_t plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, Out, bool>;
  LtGemm() = default;
  Result<Plan*> PlanFor(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace kvfleet::backend::cuda
