// The fp32 building blocks of the cpu backend's forward pass. Row-major throughout;
// every pointer's shape is in its comment. The inner loops are written for the compiler
// to vectorize (GCC vector extensions); the hot ones are built for AVX2+FMA as well as
// baseline x86-64 and picked at run time.
//
// Thread safety: pure functions; MatMul splits its rows over the given pool.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/backend/cpu/thread_pool.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend::cpu {

// y[m][n] = sum_k x[m][k] · w[n][k] (+ bias[n]).
//   x: [M][K], w: [N][K] (a PyTorch Linear weight), bias: [N] or null, y: [M][N].
void MatMul(ThreadPool& pool, const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias,
            float* y);

// Dot product of two n-vectors.
float Dot(const float* a, const float* b, int64_t n);
// y[i] += a · x[i], n elements.
void Axpy(float a, const float* x, float* y, int64_t n);

// out = x / sqrt(mean(x²) + eps) · weight, one row of n (Llama RMSNorm). out may be x.
void RmsNorm(const float* x, const float* weight, int64_t n, double eps, float* out);

// out[i] = silu(gate[i]) · up[i]: the SwiGLU activation of n elements.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// RoPE frequencies (HF rotate_half convention) with the config's rope_scaling applied.
class Rope {
 public:
  explicit Rope(const model::ModelConfig& config);
  int64_t head_dim() const { return head_dim_; }
  // cos/sin for `position`: [head_dim / 2] each.
  void Angles(double position, float* cos_out, float* sin_out) const;
  // Rotates one head vector x[head_dim] in place by the angles from Angles().
  void Apply(const float* cos_v, const float* sin_v, float* x) const;

 private:
  int64_t head_dim_;
  std::vector<double> inv_freq_;  // [head_dim / 2]
};

}  // namespace kvfleet::backend::cpu
