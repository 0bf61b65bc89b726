#include "worker/backend/cuda/moe_blas.h"

#include <vector>

#include "kernels/moe.h"
#include "kernels/small_kernels.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {

Result<std::unique_ptr<MoeBlas>> MoeBlas::Make(int32_t experts) {
  if (experts < 1) return InvalidArgument("MoeBlas: experts must be at least 1");
  std::unique_ptr<MoeBlas> b(new MoeBlas(experts));
  KVF_CUBLAS_RETURN(cublasCreate(&b->handle_));
  KVF_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&b->offsets_host_), sizeof(int32_t) * (experts + 1)));
  KVF_CUDA_RETURN(cudaMallocHost(reinterpret_cast<void**>(&b->pointers_host_), sizeof(void*) * 6 * experts));
  KVF_CUDA_RETURN(cudaMalloc(reinterpret_cast<void**>(&b->pointers_), sizeof(void*) * 6 * experts));
  return b;
}

MoeBlas::~MoeBlas() {
  if (pointers_ != nullptr) cudaFree(pointers_);
  if (pointers_host_ != nullptr) cudaFreeHost(pointers_host_);
  if (offsets_host_ != nullptr) cudaFreeHost(offsets_host_);
  if (handle_ != nullptr) cublasDestroy(handle_);
}

Status MoeBlas::Products(const __nv_bfloat16* w_gate_up, const __nv_bfloat16* w_down, const __nv_bfloat16* x,
                         int32_t gather_div, const int32_t* sorted, const int32_t* offsets, __nv_bfloat16* xs,
                         __nv_bfloat16* gate_up, __nv_bfloat16* act, __nv_bfloat16* y, int32_t S, int32_t E,
                         int32_t N, int32_t H, cudaStream_t stream) {
  if (S <= 0) return Status::Ok();
  if (E < 1 || E > experts_ || N % 8 != 0 || H % 8 != 0 || gather_div < 0) {
    return InvalidArgument("MoeBlas: unsupported shape");
  }
  // The gather runs while the offsets come back.
  const __nv_bfloat16* rows = x;
  if (gather_div > 0) {
    KVF_CUDA_RETURN(kernels::LaunchMoeGather(x, sorted, gather_div, xs, S, H, stream));
    rows = xs;
  }
  KVF_CUDA_RETURN(
      cudaMemcpyAsync(offsets_host_, offsets, sizeof(int32_t) * (E + 1), cudaMemcpyDeviceToHost, stream));
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream));  // also: the last call's pointer copy is done

  // One group of one product per non-empty expert, in cuBLAS's column-major terms
  // (lt_gemm.h): out[rows_e][m] = in[rows_e][k] · W[m][k]^T is D[m x rows_e] = op_T(W) · in.
  std::vector<int> m_gu, m_dn, n, k_gu, k_dn, ones;
  std::vector<float> alpha, beta;
  void** p = pointers_host_;
  int groups = 0;
  for (int32_t e = 0; e < E; ++e) {
    const int32_t r0 = offsets_host_[e], count = offsets_host_[e + 1] - r0;
    if (count <= 0) continue;
    if (r0 < 0 || offsets_host_[e + 1] > S) return Internal("MoeBlas: expert offsets out of range");
    p[0 * experts_ + groups] = const_cast<__nv_bfloat16*>(w_gate_up + int64_t{e} * 2 * N * H);
    p[1 * experts_ + groups] = const_cast<__nv_bfloat16*>(rows + int64_t{r0} * H);
    p[2 * experts_ + groups] = gate_up + int64_t{r0} * 2 * N;
    p[3 * experts_ + groups] = const_cast<__nv_bfloat16*>(w_down + int64_t{e} * H * N);
    p[4 * experts_ + groups] = act + int64_t{r0} * N;
    p[5 * experts_ + groups] = y + int64_t{r0} * H;
    n.push_back(count);
    ++groups;
  }
  if (groups == 0) return Status::Ok();
  m_gu.assign(groups, 2 * N);
  k_gu.assign(groups, H);
  m_dn.assign(groups, H);
  k_dn.assign(groups, N);
  ones.assign(groups, 1);
  alpha.assign(groups, 1.f);
  beta.assign(groups, 0.f);
  const std::vector<cublasOperation_t> trans(groups, CUBLAS_OP_T), keep(groups, CUBLAS_OP_N);
  KVF_CUDA_RETURN(
      cudaMemcpyAsync(pointers_, pointers_host_, sizeof(void*) * 6 * experts_, cudaMemcpyHostToDevice, stream));
  auto arr = [&](int i) { return pointers_ + i * experts_; };
  KVF_CUBLAS_RETURN(cublasSetStream(handle_, stream));
  KVF_CUBLAS_RETURN(cublasGemmGroupedBatchedEx(
      handle_, trans.data(), keep.data(), m_gu.data(), n.data(), k_gu.data(), alpha.data(), arr(0), CUDA_R_16BF,
      k_gu.data(), arr(1), CUDA_R_16BF, k_gu.data(), beta.data(), arr(2), CUDA_R_16BF,
      m_gu.data(), groups, ones.data(), CUBLAS_COMPUTE_32F));
  KVF_CUDA_RETURN(kernels::LaunchSiluMul(gate_up, act, S, N, stream));
  KVF_CUBLAS_RETURN(cublasGemmGroupedBatchedEx(
      handle_, trans.data(), keep.data(), m_dn.data(), n.data(), k_dn.data(), alpha.data(), arr(3), CUDA_R_16BF,
      k_dn.data(), arr(4), CUDA_R_16BF, k_dn.data(), beta.data(), arr(5), CUDA_R_16BF,
      m_dn.data(), groups, ones.data(), CUBLAS_COMPUTE_32F));
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
