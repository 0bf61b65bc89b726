#include "kernels/small_kernels.cuh"

namespace kvfleet::kernels {
namespace {
// Token counts up to which LaunchRopeKvStore uses 512-thread blocks (fewer blocks than SMs
// with room to spare: the step is latency-bound, not throughput-bound).
constexpr int32_t kRopeWideTokens = 128;
}  // namespace

cudaError_t LaunchRmsNorm(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                          __nv_bfloat16* out, int32_t rows, int32_t hidden, float eps, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (hidden % 8 != 0 || hidden > 32768) return cudaErrorInvalidValue;
  const int vecs = hidden / 8;
  // 4 vectors per thread at most; 256 threads up to hidden 8192, 1024 beyond.
  const int threads = vecs <= 1024 ? 256 : 1024;
  return LaunchKernel(small::RmsNormKernel<4>, rows, threads, 0, stream, x, residual, weight, out, hidden, eps);
}

cudaError_t LaunchRopeKvStore(const __nv_bfloat16* qkv, const int32_t* positions, const int32_t* slots,
                              const float* inv_freq, __nv_bfloat16* q_out, __nv_bfloat16* kv_pool,
                              const PagedKvLayout& layout, int32_t layer, int32_t tokens, int32_t num_q_heads,
                              bool rotate, cudaStream_t stream) {
  return LaunchRopeKvStore(qkv, positions, slots, inv_freq, q_out, kv_pool, layout, layer, tokens, num_q_heads, rotate,
                           RopeKvExtras{}, stream);
}

cudaError_t LaunchRopeKvStore(const __nv_bfloat16* qkv, const int32_t* positions, const int32_t* slots,
                              const float* inv_freq, __nv_bfloat16* q_out, __nv_bfloat16* kv_pool,
                              const PagedKvLayout& layout, int32_t layer, int32_t tokens, int32_t num_q_heads,
                              bool rotate, const RopeKvExtras& extras, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (layout.head_dim % 16 != 0) return cudaErrorInvalidValue;
  const bool norm = extras.q_norm != nullptr;
  if (norm != (extras.k_norm != nullptr) || (norm && layout.head_dim > 256)) return cudaErrorInvalidValue;
  const bool fp8 = extras.kv_fp8 != nullptr;
  if (layout.elem_bytes != (fp8 ? 1 : 2) || (fp8 && (extras.scales.k == nullptr || extras.scales.v == nullptr)))
    return cudaErrorInvalidValue;
  if (extras.llama4()) {  // a warp per q / k head: D <= 256, interleaved pairs when rotating
    if (norm || fp8 || layout.head_dim > 256 || (rotate && !extras.interleaved)) return cudaErrorInvalidValue;
    return LaunchKernel(small::Llama4QkKvStoreKernel, tokens, tokens <= kRopeWideTokens ? 512 : 256, 0, stream, qkv,
                        positions, slots, inv_freq, q_out, kv_pool, layout, layer, num_q_heads, rotate, extras);
  }
  // One block per token; a decode step's few tokens get 4x the threads so each does one or
  // two (rotation, store) items instead of a serial chain of four (llama-8b: 448 items).
  const int threads = tokens <= kRopeWideTokens ? 512 : 128;
  // With norms: one fp32 1/rms per q and k head.
  const size_t smem = norm ? sizeof(float) * static_cast<size_t>(num_q_heads + layout.num_kv_heads) : 0;
  return LaunchKernel(small::RopeKvStoreKernel, tokens, threads, smem, stream, qkv, positions, slots, inv_freq, q_out,
                      kv_pool, layout, layer, num_q_heads, rotate, extras);
}

cudaError_t LaunchSiluMul(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int32_t rows, int32_t inter,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (inter % 8 != 0) return cudaErrorInvalidValue;
  const int64_t vecs = int64_t(rows) * inter / 8;
  const int threads = 256;
  // Enough blocks to fill the GPU several times over; the grid-stride loop covers the rest.
  const int blocks = static_cast<int>(std::min<int64_t>((vecs + threads - 1) / threads, 132 * 16));
  return LaunchKernel(small::SiluMulKernel, blocks, threads, 0, stream, gate_up, out, rows, inter);
}

cudaError_t LaunchEmbedding(const int32_t* ids, const __nv_bfloat16* table, __nv_bfloat16* out, int32_t tokens,
                            int32_t vocab, int32_t hidden, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (hidden % 8 != 0) return cudaErrorInvalidValue;
  return LaunchKernel(small::EmbeddingKernel, tokens, 256, 0, stream, ids, table, out, vocab, hidden);
}

}  // namespace kvfleet::kernels
