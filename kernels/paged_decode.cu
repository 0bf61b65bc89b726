#include <algorithm>

#include "kernels/paged_decode.cuh"

namespace kvfleet::kernels {
namespace {

// Query heads one thread block serves: the group rounded up to 1, 2, 4 or 8.
int GroupChunk(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }

int MaxParts(const PagedDecodeParams& p) { return (p.max_seq_len + p.partition_size - 1) / p.partition_size; }

template <int kHeadDim, int kGroup, bool kShift>
cudaError_t Launch(const PagedDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + kGroup - 1) / kGroup;
  const int max_parts = MaxParts(p);
  constexpr size_t kMergeBytes = sizeof(float) * decode::kWarps * kGroup * (kHeadDim + 2);
  constexpr size_t smem = std::max<size_t>(decode::Tiling<kHeadDim>::kSmemBytes, kMergeBytes);
  auto kernel = decode::PagedDecodeKernel<kHeadDim, kGroup, kShift>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  dim3 grid(max_parts, p.layout.num_kv_heads, p.num_seqs * chunks);
  kernel<<<grid, decode::kThreads, smem, stream>>>(p);
  KVF_RETURN_LAUNCH_ERROR();
  if (max_parts > 1) {
    decode::PagedDecodeCombine<kHeadDim><<<dim3(p.num_q_heads, p.num_seqs), decode::kThreads, 0, stream>>>(p, max_parts);
    KVF_RETURN_LAUNCH_ERROR();
  }
  return cudaSuccess;
}

template <int kHeadDim, int kGroup>
cudaError_t DispatchShift(const PagedDecodeParams& p, cudaStream_t s) {
  return p.rope_inv_freq ? Launch<kHeadDim, kGroup, true>(p, s) : Launch<kHeadDim, kGroup, false>(p, s);
}

// The tensor-core kernel: head_dim <= 128, no shifted RoPE, query heads in chunks of 16.
template <int kHeadDim>
cudaError_t LaunchMma(const PagedDecodeParams& p, cudaStream_t stream) {
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + 15) / 16;
  const int max_parts = MaxParts(p);
  constexpr size_t kMergeBytes = sizeof(float) * decode::kWarps * 16 * (kHeadDim + 2);
  constexpr size_t smem = std::max<size_t>(decode::mma::SmemBytes<kHeadDim>(), kMergeBytes);
  auto kernel = decode::mma::PagedDecodeMmaKernel<kHeadDim>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  dim3 grid(max_parts, p.layout.num_kv_heads, p.num_seqs * chunks);
  kernel<<<grid, decode::kThreads, smem, stream>>>(p);
  KVF_RETURN_LAUNCH_ERROR();
  if (max_parts > 1) {
    decode::PagedDecodeCombine<kHeadDim><<<dim3(p.num_q_heads, p.num_seqs), decode::kThreads, 0, stream>>>(p, max_parts);
    KVF_RETURN_LAUNCH_ERROR();
  }
  return cudaSuccess;
}

template <int kHeadDim>
cudaError_t DispatchGroup(const PagedDecodeParams& p, cudaStream_t s) {
  switch (GroupChunk(p.num_q_heads / p.layout.num_kv_heads)) {
    case 1: return DispatchShift<kHeadDim, 1>(p, s);
    case 2: return DispatchShift<kHeadDim, 2>(p, s);
    case 4: return DispatchShift<kHeadDim, 4>(p, s);
    default: return DispatchShift<kHeadDim, 8>(p, s);
  }
}

}  // namespace

int32_t PagedDecodeChoosePartition(int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t max_seq_len,
                                   int32_t num_sms) {
  const int group = num_q_heads / num_kv_heads;
  const int64_t blocks_per_part = int64_t(num_seqs) * num_kv_heads * ((group + GroupChunk(group) - 1) / GroupChunk(group));
  // Largest partition (at most 2048 tokens) that still gives two waves of thread blocks.
  // Measured on an H200 (tests/bench/results, v6 sweep at batch 64, 4K context): 128: 49.5%,
  // 256: 59.9%, 512: 65.0%, 1024: 67.7%, 2048: 68.9% of copy bandwidth.
  int32_t part = 2048;
  while (part > 128 && blocks_per_part * ((max_seq_len + part - 1) / part) < 2 * int64_t(num_sms)) part /= 2;
  return part;
}

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
  const bool cuda_cores = p.rope_inv_freq != nullptr || p.force_cuda_cores;
  switch (p.layout.head_dim) {
    case 64: return cuda_cores ? DispatchGroup<64>(p, stream) : LaunchMma<64>(p, stream);
    case 128: return cuda_cores ? DispatchGroup<128>(p, stream) : LaunchMma<128>(p, stream);
    case 256: return DispatchGroup<256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kvfleet::kernels
