#include "kernels/paged_prefill.cuh"

namespace kvfleet::kernels {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // CUDA's limit on gridDim.y and gridDim.z

template <int kHeadDim, typename E>
cudaError_t Launch(const PagedPrefillParams& p, cudaStream_t stream) {
  constexpr int kSmem = prefill::SmemBytes<kHeadDim, E>();
  auto kernel = prefill::PagedPrefillKernel<kHeadDim, E>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int64_t row_tiles = (int64_t(p.max_q_len) * group + prefill::kRows - 1) / prefill::kRows;
  if (row_tiles > kMaxGridYZ || p.num_seqs > kMaxGridYZ) return cudaErrorInvalidValue;
  dim3 grid(p.layout.num_kv_heads, p.num_seqs, static_cast<unsigned>(row_tiles));
  kernel<<<grid, prefill::kThreads, kSmem, stream>>>(p);
  KVF_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchPagedPrefill(const PagedPrefillParams& p, cudaStream_t stream) {
  if (p.num_seqs <= 0 || p.max_q_len <= 0) return cudaSuccess;
  if (p.layout.num_kv_heads <= 0 || p.num_q_heads % p.layout.num_kv_heads != 0) return cudaErrorInvalidValue;
  const bool fp8 = p.kv_fp8 != nullptr;
  if (p.layout.elem_bytes != (fp8 ? 1 : 2) || (fp8 && (p.scales.k == nullptr || p.scales.v == nullptr)))
    return cudaErrorInvalidValue;
  switch (p.layout.head_dim) {
    case 64: return fp8 ? Launch<64, uint8_t>(p, stream) : Launch<64, __nv_bfloat16>(p, stream);
    case 128: return fp8 ? Launch<128, uint8_t>(p, stream) : Launch<128, __nv_bfloat16>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kvfleet::kernels
