// The fp32 building blocks of the cpu backend's forward pass. Row-major throughout;
// every pointer's shape is in its comment. The inner loops are written for the compiler
// to vectorize (GCC vector extensions); the hot ones are built for AVX2+FMA as well as
// baseline x86-64 and picked at run time.
//
// Thread safety: pure functions; MatMul splits its rows over the given pool.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/rope.h"
#include "worker/backend/cpu/thread_pool.h"

namespace kvfleet::backend::cpu {

// y[m][n] = sum_k x[m][k] · w[n][k] (+ bias[n]).
//   x: [M][K], w: [N][K] (a PyTorch Linear weight), bias: [N] or null, y: [M][N].
void MatMul(ThreadPool& pool, const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias,
            float* y);

// Dot product of two n-vectors.
float Dot(const float* a, const float* b, int64_t n);
// y[i] += a · x[i], n elements.
void Axpy(float a, const float* x, float* y, int64_t n);

// LoRA (Hu et al. 2021): y[out] += scaling · B·(A·x) for one token and one adapter's target.
//   x: [in], a: [rank][in] (lora_A), b: [out][rank] (lora_B), y: [out], scratch: [rank].
// The reference the CUDA kernels (kernels/lora.h) are checked against computes the same sums.
void LoraAddRow(const float* x, int64_t in, const float* a, const float* b, int32_t rank, int64_t out, float scaling,
                float* scratch, float* y);

// One KV head of one layer in a paged arena: token t's key starts at
//   arena + table[t / block_size] · block_stride + k_offset + (t % block_size) · head_dim
// and its value at v_offset in the same way.
struct PagedKvHead {
  const float* arena = nullptr;    // [blocks][block_stride]
  const uint32_t* table = nullptr; // the sequence's block ids: [positions / block_size]
  int64_t block_stride = 0;        // floats per block
  int64_t block_size = 0;          // tokens per block
  int64_t k_offset = 0, v_offset = 0;  // floats from a block's start to the head's first key, value
  int64_t head_dim = 0;
};

// Attention of one query: out = Σ_j softmax(s)_j · v_j with s_j = q_j · k_j · scale over the
// positions [sink_lo, sink_hi) scored with q_sink (StreamingLLM's sinks, seen at their cache
// positions), then [lo, hi) scored with q.
//   q, q_sink: [head_dim]; scores: [(sink_hi - sink_lo) + (hi - lo)] scratch;
//   acc: [head_dim] scratch; out: [head_dim].
void PagedAttentionRow(const PagedKvHead& kv, const float* q, const float* q_sink, int64_t sink_lo, int64_t sink_hi,
                       int64_t lo, int64_t hi, float scale, float* scores, float* acc, float* out);

// out = x / sqrt(mean(x²) + eps) · weight, one row of n (Llama RMSNorm); weight null: none
// (Llama 4's q/k norm). out may be x.
void RmsNorm(const float* x, const float* weight, int64_t n, double eps, float* out);

// out[i] = silu(gate[i]) · up[i]: the SwiGLU activation of n elements.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// RoPE (HF rotate_half convention, or Llama 4's interleaved pairs when the config says so)
// with the frequencies and attention scaling of kernels/rope.h.
class Rope {
 public:
  explicit Rope(const kernels::RopeConfig& config);
  int64_t head_dim() const { return head_dim_; }
  // The frequencies of a sequence whose step ends at position seq_len - 1: [head_dim / 2].
  // Only dynamic NTK scaling depends on seq_len; other types always return inv_freq().
  std::vector<float> InvFreqFor(int64_t seq_len) const;
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  bool depends_on_length() const { return kernels::RopeDependsOnLength(config_); }
  // HF multiplies cos and sin by this (yarn); attention scores scale by its square.
  double attention_scaling() const { return attention_scaling_; }
  // cos/sin for `position` under `inv_freq` (inv_freq() when omitted): [head_dim / 2] each.
  void Angles(const float* inv_freq, double position, float* cos_out, float* sin_out) const;
  void Angles(double position, float* cos_out, float* sin_out) const {
    Angles(inv_freq_.data(), position, cos_out, sin_out);
  }
  // Rotates one head vector x[head_dim] in place by the angles from Angles().
  void Apply(const float* cos_v, const float* sin_v, float* x) const;

 private:
  kernels::RopeConfig config_;
  int64_t head_dim_;
  std::vector<float> inv_freq_;  // [head_dim / 2], for every length unless dynamic
  double attention_scaling_;
};

}  // namespace kvfleet::backend::cpu
