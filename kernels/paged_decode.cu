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

int32_t PagedDecodeChoosePartition(int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t max_seq_len,
                                   int32_t num_sms) {
  // Blocks per partition of the tensor-core kernels: one per 16 query heads of a KV head.
  const int group = num_q_heads / num_kv_heads;
  const int64_t blocks_per_part = int64_t(num_seqs) * num_kv_heads * ((group + 15) / 16);
  // Three regimes, each measured on an H200 (tests/bench/results/2026-11-25-fp8-decode.txt and
  // 2026-11-28-decode-partitions.txt, launches back to back, bf16 and fp8 pages):
  //
  // 1. Full batches: the largest partition (256..2048 tokens) that gives at least kMinWaves
  //    waves of resident blocks, so the last, partly filled wave is a small part of the time,
  //    with at most kMaxParts partitions per sequence: with 80 to 256 of them the waves were
  //    slower than one wave of long partitions. One sequence at 64K, P=256 against P=2048:
  //    149 us against 94 (bf16) and 118 against 49 (fp8) when the merge walked a row's
  //    partitions one after another; 91 against 88 and 62 against 45 with the merge spread
  //    over its warps (PagedDecodeCombine now). Batch 64 at 4K, % of copy bandwidth:
  //      P       128    256    512    1024   2048
  //      bf16    84.6   88.8   91.3   93.4   90.9
  //      fp8     63.4   80.9   84.2   86.3   87.6
  //    The fp8 kernel keeps four blocks resident, not three; sizing its waves by four picks
  //    smaller partitions, so both are sized by three.
  // 2. Small grids (a few sequences): a single wave, at least half full, of the longest
  //    partitions. Each block pays its start (q, the first tiles in flight) once, and fewer
  //    partitions leave less to merge. The fastest partition of eleven such shapes, from one
  //    sequence at 8K to three at 20K, gave grids of 128 to 512 blocks; this rule picks the
  //    fastest for bf16 in all eleven, for fp8 in six and within 3 us in three more (batch 8
  //    at 4K and 16 at 2K: 32 us against 27). One sequence, us per launch (with the old merge;
  //    with the new one at 64K: 109 91 83 87 88 bf16, 85 62 51 45 45 fp8):
  //      context  P=128  256  512  1024  2048      context  P=128  256  512  1024  2048
  //      32K bf16   115   78   58    51    61      64K bf16   221  149  112   101    94
  //      32K fp8    104   49   35    31    35      64K fp8    199  118   80    53    49
  // 3. Neither (a grid between one and four waves at every partition): regime 1's rule
  //    without the bound on partitions, else 256 when that fills a wave, else 128 (too few
  //    blocks: parallelism first).
  //
  // Decode graphs size the grid for their length bucket, up to twice the real length, so the
  // real grid can have half the waves planned.
  constexpr int64_t kMinWaves = 4;
  constexpr int64_t kMaxParts = 32;
  const int64_t slots = int64_t(decode::mma::kResidentBlocksPerSm) * num_sms;
  auto parts = [&](int32_t part) { return (int64_t(max_seq_len) + part - 1) / part; };
  auto blocks = [&](int32_t part) { return blocks_per_part * parts(part); };
  for (int32_t part = 2048; part >= 256; part /= 2)
    if (blocks(part) >= kMinWaves * slots && parts(part) <= kMaxParts) return part;
  for (int32_t part = 2048; part >= 256; part /= 2)
    if (2 * blocks(part) >= slots && blocks(part) <= slots) return part;
  for (int32_t part = 2048; part >= 256; part /= 2)
    if (blocks(part) >= kMinWaves * slots) return part;
  return blocks(256) >= slots ? 256 : 128;
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
  const bool fp8 = p.kv_fp8 != nullptr;
  if (p.layout.elem_bytes != (fp8 ? 1 : 2) || (fp8 && (p.scales.k == nullptr || p.scales.v == nullptr)))
    return cudaErrorInvalidValue;
  return fp8 ? DispatchHeadDim<uint8_t>(p, stream) : DispatchHeadDim<__nv_bfloat16>(p, stream);
}

}  // namespace kvfleet::kernels
