#include <algorithm>

#include "kernels/paged_decode.cuh"
#include "kernels/paged_decode_fp8.cuh"

namespace kvfleet::kernels {
namespace {

// Query heads one thread block serves: the group rounded up to 1, 2, 4 or 8.
int GroupChunk(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

int MaxParts(const PagedDecodeParams& p) { return (p.max_seq_len + p.partition_size - 1) / p.partition_size; }

// The attention kernel over `grid`, then the partitions' merge when there are several.
template <int kHeadDim>
cudaError_t LaunchWithCombine(void (*kernel)(PagedDecodeParams), dim3 grid, size_t smem, const PagedDecodeParams& p,
                              cudaStream_t stream) {
  const cudaError_t e = LaunchKernel(kernel, grid, decode::kThreads, smem, stream, p);
  if (e != cudaSuccess || grid.x <= 1) return e;
  return LaunchKernel(decode::PagedDecodeCombine<kHeadDim>, dim3(p.num_q_heads, p.num_seqs), decode::kThreads, 0,
                      stream, p, static_cast<int>(grid.x));
}

template <int kHeadDim, int kGroup, bool kShift, typename E>
cudaError_t Launch(const PagedDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + kGroup - 1) / kGroup;
  const int max_parts = MaxParts(p);
  constexpr size_t kMergeBytes = sizeof(float) * decode::kWarps * kGroup * (kHeadDim + 2);
  constexpr size_t smem = std::max<size_t>(decode::Tiling<kHeadDim, E>::kSmemBytes, kMergeBytes);
  auto kernel = decode::PagedDecodeKernel<kHeadDim, kGroup, kShift, E>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  return LaunchWithCombine<kHeadDim>(kernel, dim3(max_parts, p.layout.num_kv_heads, p.num_seqs * chunks), smem, p,
                                     stream);
}

template <int kHeadDim, int kGroup, typename E>
cudaError_t DispatchShift(const PagedDecodeParams& p, cudaStream_t s) {
  return p.rope_inv_freq ? Launch<kHeadDim, kGroup, true, E>(p, s) : Launch<kHeadDim, kGroup, false, E>(p, s);
}

// The bf16 tensor-core kernel: head_dim <= 128, no shifted RoPE, query heads in chunks of 16.
template <int kHeadDim>
cudaError_t LaunchMma(const PagedDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + 15) / 16;
  const int max_parts = MaxParts(p);
  constexpr size_t kMergeBytes = sizeof(float) * decode::kWarps * 16 * (decode::mma::MergeStride<kHeadDim>() + 2);
  constexpr size_t smem = std::max<size_t>(decode::mma::SmemBytes<kHeadDim>(), kMergeBytes);
  auto kernel = decode::mma::PagedDecodeMmaKernel<kHeadDim>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  return LaunchWithCombine<kHeadDim>(kernel, dim3(max_parts, p.layout.num_kv_heads, p.num_seqs * chunks), smem, p,
                                     stream);
}

// fp8 pages on tensor cores (paged_decode_fp8.cuh): query heads in chunks of 8 or 16.
template <int kHeadDim, int kNT>
cudaError_t LaunchFp8(const PagedDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + 8 * kNT - 1) / (8 * kNT);
  constexpr size_t smem =
      std::max<size_t>(decode::fp8::SmemBytes<kHeadDim>(), decode::fp8::MergeBytes<kHeadDim, kNT>());
  auto kernel = decode::fp8::PagedDecodeFp8Kernel<kHeadDim, kNT>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  return LaunchWithCombine<kHeadDim>(kernel, dim3(MaxParts(p), p.layout.num_kv_heads, p.num_seqs * chunks), smem, p,
                                     stream);
}

template <int kHeadDim>
cudaError_t LaunchFp8(const PagedDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  return group <= 8 ? LaunchFp8<kHeadDim, 1>(p, stream) : LaunchFp8<kHeadDim, 2>(p, stream);
}

template <int kHeadDim, typename E>
cudaError_t DispatchGroup(const PagedDecodeParams& p, cudaStream_t s) {
  switch (GroupChunk(p.num_q_heads / p.layout.num_kv_heads)) {
    case 1: return DispatchShift<kHeadDim, 1, E>(p, s);
    case 2: return DispatchShift<kHeadDim, 2, E>(p, s);
    case 4: return DispatchShift<kHeadDim, 4, E>(p, s);
    default: return DispatchShift<kHeadDim, 8, E>(p, s);
  }
}

template <typename E>
cudaError_t DispatchHeadDim(const PagedDecodeParams& p, cudaStream_t stream) {
  const bool cuda_cores = p.rope_inv_freq != nullptr || p.force_cuda_cores;
  switch (p.layout.head_dim) {
    case 64:
      if (cuda_cores) return DispatchGroup<64, E>(p, stream);
      if constexpr (sizeof(E) == 1) {
        return LaunchFp8<64>(p, stream);
      } else {
        return LaunchMma<64>(p, stream);
      }
    case 128:
      if (cuda_cores) return DispatchGroup<128, E>(p, stream);
      if constexpr (sizeof(E) == 1) {
        return LaunchFp8<128>(p, stream);
      } else {
        return LaunchMma<128>(p, stream);
      }
    case 256: return DispatchGroup<256, E>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p) {
  if (p.partition_size <= 0) return 0;
  const int max_parts = MaxParts(p);
  if (max_parts <= 1) return 0;
  return sizeof(float) * size_t(p.num_seqs) * p.num_q_heads * max_parts * (p.layout.head_dim + 2);
}

cudaError_t LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.num_seqs <= 0 || p.partition_size <= 0 || p.partition_size % 128 != 0 || p.max_seq_len <= 0 ||
      p.layout.num_kv_heads <= 0 || p.num_q_heads % p.layout.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  if (MaxParts(p) > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;
  const bool fp8 = p.kv_fp8 != nullptr;
  if (p.layout.elem_bytes != (fp8 ? 1 : 2) || (fp8 && (p.scales.k == nullptr || p.scales.v == nullptr)))
    return cudaErrorInvalidValue;
  return fp8 ? DispatchHeadDim<uint8_t>(p, stream) : DispatchHeadDim<__nv_bfloat16>(p, stream);
}

}  // namespace kvfleet::kernels
