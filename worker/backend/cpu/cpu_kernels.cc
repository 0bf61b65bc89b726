#include "worker/backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvfleet::backend::cpu {
namespace {

typedef float V8 __attribute__((vector_size(32)));

inline V8 Load(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float Sum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Rows of w per work item: enough that a task amortizes its scheduling, few enough that
// two cores share a 64-row projection.
constexpr int64_t kMinRowsPerTask = 16;
// Tasks per thread for a large matrix, so a slow thread does not hold everyone up.
constexpr int64_t kTasksPerThread = 4;
// Below this many multiply-adds a product runs on the calling thread: waking another
// thread costs more (tens of microseconds on a busy machine).
constexpr int64_t kMinParallelMacs = 1 << 19;

// y[m][n0..n1) for rows m of x, four rows of x at a time so each w row is loaded once per
// four dot products.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx2", "default")))
#endif
void MatMulBlock(const float* x, int64_t M, int64_t K, const float* w, int64_t n0, int64_t n1, const float* bias,
                 float* y, int64_t ldy) {
  const int64_t k8 = K / 8 * 8;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {
    const float* x0 = x + (m + 0) * K;
    const float* x1 = x + (m + 1) * K;
    const float* x2 = x + (m + 2) * K;
    const float* x3 = x + (m + 3) * K;
    for (int64_t n = n0; n < n1; ++n) {
      const float* wr = w + n * K;
      V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t k = 0; k < k8; k += 8) {
        V8 wv = Load(wr + k);
        a0 += wv * Load(x0 + k);
        a1 += wv * Load(x1 + k);
        a2 += wv * Load(x2 + k);
        a3 += wv * Load(x3 + k);
      }
      float s0 = Sum(a0), s1 = Sum(a1), s2 = Sum(a2), s3 = Sum(a3);
      for (int64_t k = k8; k < K; ++k) {
        s0 += wr[k] * x0[k];
        s1 += wr[k] * x1[k];
        s2 += wr[k] * x2[k];
        s3 += wr[k] * x3[k];
      }
      const float b = bias ? bias[n] : 0.0f;
      y[(m + 0) * ldy + n] = s0 + b;
      y[(m + 1) * ldy + n] = s1 + b;
      y[(m + 2) * ldy + n] = s2 + b;
      y[(m + 3) * ldy + n] = s3 + b;
    }
  }
  for (; m < M; ++m) {
    const float* x0 = x + m * K;
    for (int64_t n = n0; n < n1; ++n) {
      const float* wr = w + n * K;
      V8 a0 = {}, a1 = {};
      int64_t k = 0;
      for (; k + 16 <= k8; k += 16) {
        a0 += Load(wr + k) * Load(x0 + k);
        a1 += Load(wr + k + 8) * Load(x0 + k + 8);
      }
      for (; k < k8; k += 8) a0 += Load(wr + k) * Load(x0 + k);
      float s = Sum(a0 + a1);
      for (k = k8; k < K; ++k) s += wr[k] * x0[k];
      y[m * ldy + n] = s + (bias ? bias[n] : 0.0f);
    }
  }
}

}  // namespace

void MatMul(ThreadPool& pool, const float* x, int64_t M, int64_t K, const float* w, int64_t N, const float* bias,
            float* y) {
  if (M * N * K < kMinParallelMacs) {
    MatMulBlock(x, M, K, w, 0, N, bias, y, N);
    return;
  }
  const int64_t want_tasks = static_cast<int64_t>(pool.size()) * kTasksPerThread;
  const int64_t rows = std::max(kMinRowsPerTask, (N + want_tasks - 1) / want_tasks);
  const int64_t tasks = (N + rows - 1) / rows;
  pool.ParallelFor(tasks, [&](int64_t t) {
    const int64_t n0 = t * rows, n1 = std::min(N, n0 + rows);
    MatMulBlock(x, M, K, w, n0, n1, bias, y, N);
  });
}

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx2", "default")))
#endif
float Dot(const float* a, const float* b, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  V8 acc = {};
  for (int64_t i = 0; i < n8; i += 8) acc += Load(a + i) * Load(b + i);
  float s = Sum(acc);
  for (int64_t i = n8; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

namespace {

// Visits positions [lo, hi) of kv block run by block run: fn(first score index, the K (or V)
// of the run's first token, run length).
template <typename Fn>
void ForRuns(const PagedKvHead& kv, int64_t lo, int64_t hi, int64_t score0, bool values, Fn&& fn) {
  const int64_t B = kv.block_size, hd = kv.head_dim;
  for (int64_t t = lo; t < hi;) {
    const int64_t off = t % B, len = std::min(hi - t, B - off);
    const float* block = kv.arena + static_cast<size_t>(kv.table[t / B]) * kv.block_stride;
    fn(score0 + (t - lo), block + (values ? kv.v_offset : kv.k_offset) + off * hd, len);
    t += len;
  }
}

}  // namespace

void PagedAttentionRow(const PagedKvHead& kv, const float* q, const float* q_sink, int64_t sink_lo, int64_t sink_hi,
                       int64_t lo, int64_t hi, float scale, float* scores, float* acc, float* out) {
  const int64_t hd = kv.head_dim, n_sink = sink_hi - sink_lo, n = n_sink + (hi - lo);
  auto score_run = [&](const float* qq) {
    return [&, qq](int64_t s0, const float* k, int64_t len) {
      for (int64_t j = 0; j < len; ++j) scores[s0 + j] = Dot(qq, k + j * hd, hd) * scale;
    };
  };
  ForRuns(kv, sink_lo, sink_hi, 0, false, score_run(q_sink));
  ForRuns(kv, lo, hi, n_sink, false, score_run(q));
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, scores[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  std::fill(acc, acc + hd, 0.0f);
  auto value_run = [&](int64_t s0, const float* v, int64_t len) {
    for (int64_t j = 0; j < len; ++j) Axpy(scores[s0 + j], v + j * hd, acc, hd);
  };
  ForRuns(kv, sink_lo, sink_hi, 0, true, value_run);
  ForRuns(kv, lo, hi, n_sink, true, value_run);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
}

void RmsNorm(const float* x, const float* weight, int64_t n, double eps, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (weight == nullptr) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv;
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

Rope::Rope(const kernels::RopeConfig& config)
    : config_(config),
      head_dim_(config.head_dim),
      inv_freq_(kernels::RopeInvFreq(config)),
      attention_scaling_(kernels::RopeAttentionScaling(config)) {}

std::vector<float> Rope::InvFreqFor(int64_t seq_len) const {
  return depends_on_length() ? kernels::RopeInvFreq(config_, seq_len) : inv_freq_;
}

void Rope::Angles(const float* inv_freq, double position, float* cos_out, float* sin_out) const {
  for (int64_t i = 0; i < head_dim_ / 2; ++i) {
    const double a = position * inv_freq[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void Rope::Apply(const float* cos_v, const float* sin_v, float* x) const {
  const int64_t half = head_dim_ / 2;
  if (config_.interleaved) {  // (x[2i] + i·x[2i+1]) · (cos + i·sin)
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = x[2 * i], x2 = x[2 * i + 1];
      x[2 * i] = x1 * cos_v[i] - x2 * sin_v[i];
      x[2 * i + 1] = x2 * cos_v[i] + x1 * sin_v[i];
    }
    return;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_v[i] - x2 * sin_v[i];
    x[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
  }
}

void LoraAddRow(const float* x, int64_t in, const float* a, const float* b, int32_t rank, int64_t out, float scaling,
                float* scratch, float* y) {
  // Shrink (x·Aᵀ) then expand (·Bᵀ), scaling folded into the rank-wide vector: rank
  // multiplies instead of out.
  for (int32_t r = 0; r < rank; ++r) scratch[r] = Dot(x, a + static_cast<int64_t>(r) * in, in) * scaling;
  for (int64_t o = 0; o < out; ++o) y[o] += Dot(scratch, b + o * rank, rank);
}

}  // namespace kvfleet::backend::cpu
