#include "worker/backend/cuda/lt_gemm.h"

#include <memory>
#include <string>

#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {

Result<std::unique_ptr<LtGemm>> LtGemm::Make() {
  std::unique_ptr<LtGemm> g(new LtGemm());
  KVF_CUBLAS_RETURN(cublasLtCreate(&g->handle_));
  KVF_CUDA_RETURN(cudaMalloc(&g->workspace_, config::kLtWorkspaceBytes));
  return g;
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Result<LtGemm::Plan*> LtGemm::PlanFor(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  const auto [m, n, k, out, bias] = key;
  Plan p;
  KVF_CUBLAS_RETURN(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  KVF_CUBLAS_RETURN(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  KVF_CUBLAS_RETURN(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    KVF_CUBLAS_RETURN(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    KVF_CUBLAS_RETURN(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  const cudaDataType_t d_type = out == Out::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  KVF_CUBLAS_RETURN(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k));
  KVF_CUBLAS_RETURN(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k));
  KVF_CUBLAS_RETURN(cublasLtMatrixLayoutCreate(&p.d, d_type, static_cast<uint64_t>(m), static_cast<uint64_t>(n), m));

  cublasLtMatmulPreference_t pref = nullptr;
  KVF_CUBLAS_RETURN(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = config::kLtWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
    return Internal("cuBLASLt has no algorithm for a bf16 GEMM m=" + std::to_string(m) + " n=" + std::to_string(n) +
                    " k=" + std::to_string(k));
  }
  p.algo = result.algo;
  return &plans_.emplace(key, p).first->second;
}

Status LtGemm::Run(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, void* y, Out out,
                   int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  KVF_ASSIGN_OR_RETURN(Plan * p, PlanFor(Key{m, n, k, out, bias != nullptr}));
  if (bias != nullptr) {
    KVF_CUBLAS_RETURN(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  const float alpha = 1.0f, beta = 0.0f;
  KVF_CUBLAS_RETURN(cublasLtMatmul(handle_, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d, &p->algo,
                                   workspace_, config::kLtWorkspaceBytes, stream));
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
