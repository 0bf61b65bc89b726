// Status from CUDA runtime and cuBLAS errors, for the cuda backend.
// Thread safety: pure functions.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "common/status.h"

namespace kvfleet::backend::cuda {

inline Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

inline Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

}  // namespace kvfleet::backend::cuda

// Returns from the enclosing function (Status or Result) on a CUDA / cuBLAS error.
#define KVF_CUDA_RETURN(call) KVF_RETURN_IF_ERROR(::kvfleet::backend::cuda::CudaStatus((call), #call))
#define KVF_CUBLAS_RETURN(call) KVF_RETURN_IF_ERROR(::kvfleet::backend::cuda::CublasStatus((call), #call))
