#include <algorithm>

#include "kernels/paged_prefill.cuh"

namespace kvfleet::kernels {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // CUDA's limit on gridDim.y and gridDim.z

// K/V tiles one part takes at least: shorter parts cost more in partials and merging than
// they gain in parallelism.
constexpr int kMinTilesPerSplit = 4;
constexpr int kMaxSplits = 64;

// Parts per block: 1 when the blocks (KV head x sequence x row tile) fill half the SMs
// already, else about one wave of blocks in all, within the workspace and at least
// kMinTilesPerSplit tiles of the longest sequence each.
int Splits(const PagedPrefillParams& p, int64_t row_tiles, int head_dim) {
  if (p.num_seqs <= 0 || p.max_q_len <= 0 || p.layout.num_kv_heads <= 0 || p.workspace == nullptr || p.num_sms <= 0 || p.max_seq_len <= 0) return 1;
  const int64_t blocks = int64_t(p.layout.num_kv_heads) * p.num_seqs * row_tiles;
  if (2 * blocks > p.num_sms) return 1;
  const int64_t tiles = (int64_t(p.max_seq_len) + prefill::kCols - 1) / prefill::kCols;
  int64_t splits = std::min<int64_t>({(p.num_sms + blocks - 1) / blocks, tiles / kMinTilesPerSplit, kMaxSplits});
  const int64_t row_bytes = (int64_t(head_dim) + 2) * int64_t(sizeof(float));
  const int64_t split_bytes = int64_t(p.num_seqs) * p.max_q_len * p.num_q_heads * row_bytes;
  splits = std::min<int64_t>(splits, split_bytes > 0 ? int64_t(p.workspace_bytes) / split_bytes : 1);
  return static_cast<int>(std::max<int64_t>(1, splits));
}

template <int kHeadDim, typename E>
cudaError_t Launch(const PagedPrefillParams& p, cudaStream_t stream) {
  constexpr int kSmem = prefill::SmemBytes<kHeadDim, E>();
  auto kernel = prefill::PagedPrefillKernel<kHeadDim, E>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (e != cudaSuccess) return e;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int64_t row_tiles = (int64_t(p.max_q_len) * group + prefill::kRows - 1) / prefill::kRows;
  if (row_tiles > kMaxGridYZ || p.num_seqs > kMaxGridYZ) return cudaErrorInvalidValue;
  PagedPrefillParams q = p;
  q.num_splits = Splits(p, row_tiles, kHeadDim);
  q.split_rows = int64_t(p.num_seqs) * p.max_q_len * p.num_q_heads;
  if (row_tiles * q.num_splits > kMaxGridYZ) return cudaErrorInvalidValue;
  dim3 grid(p.layout.num_kv_heads, p.num_seqs, static_cast<unsigned>(row_tiles * q.num_splits));
  kernel<<<grid, prefill::kThreads, kSmem, stream>>>(q);
  KVF_RETURN_LAUNCH_ERROR();
  if (q.num_splits > 1) {
    const dim3 merge(static_cast<unsigned>(p.num_seqs * p.max_q_len), static_cast<unsigned>(p.num_q_heads));
    prefill::MergeSplitsKernel<kHeadDim><<<merge, kHeadDim, 0, stream>>>(q);
    KVF_RETURN_LAUNCH_ERROR();
  }
  return cudaSuccess;
}

}  // namespace

size_t PagedPrefillWorkspaceBytes(int32_t head_dim, int32_t num_sms) {
  return size_t(2) * std::max(num_sms, 1) * prefill::kRows * (size_t(head_dim) + 2) * sizeof(float);
}

int32_t PagedPrefillChooseSplits(const PagedPrefillParams& p) {
  if (p.layout.num_kv_heads <= 0) return 1;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int64_t row_tiles = (int64_t(p.max_q_len) * group + prefill::kRows - 1) / prefill::kRows;
  return Splits(p, row_tiles, p.layout.head_dim);
}

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
