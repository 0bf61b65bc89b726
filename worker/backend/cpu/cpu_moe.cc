#include "worker/backend/cpu/cpu_moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "worker/backend/cpu/cpu_kernels.h"

namespace kvfleet::backend::cpu {

namespace {

// experts[0..k) = the k largest of score[0..E), descending: k rounds of argmax (the first of
// equals: the lower id), so no comparator for a sort to trip over should a NaN reach the router.
void PickTopK(const float* score, int64_t E, int64_t k, std::vector<char>& taken, int32_t* experts) {
  std::fill(taken.begin(), taken.end(), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (!taken[e] && (best < 0 || score[e] > score[best])) best = e;
    }
    taken[best] = 1;
    experts[j] = static_cast<int32_t>(best);
  }
}

// out[n][H] = down(silu(gate · x) ⊙ (up · x)) over n rows: gate_up [2·I][H], down [H][I].
void SwiGlu(ThreadPool& pool, const float* x, int64_t n, int64_t H, int64_t I, const float* gate_up,
            const float* down, MoeScratch* s, float* out) {
  s->gate_up.resize(static_cast<size_t>(n * 2 * I));
  s->act.resize(static_cast<size_t>(n * I));
  MatMul(pool, x, n, H, gate_up, 2 * I, nullptr, s->gate_up.data());
  for (int64_t i = 0; i < n; ++i) SiluMul(&s->gate_up[i * 2 * I], &s->gate_up[i * 2 * I + I], I, &s->act[i * I]);
  MatMul(pool, s->act.data(), n, I, down, H, nullptr, out);
}

}  // namespace

void RouteTopK(const float* logits, int64_t T, int64_t E, int64_t k, bool normalize, int32_t* experts,
               float* weights) {
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    // softmax in fp32, as torch's: exp(z - max) / Σ exp(z - max)
    const float zmax = *std::max_element(z, z + E);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(z[e] - zmax);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    PickTopK(p.data(), E, k, taken, experts + t * k);
    float chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += weights[t * k + j] = p[experts[t * k + j]];
    if (normalize) {
      for (int64_t j = 0; j < k; ++j) weights[t * k + j] /= chosen;
    }
  }
}

void RouteTopKSigmoid(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* experts, float* weights) {
  std::vector<char> taken(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    PickTopK(z, E, k, taken, experts + t * k);
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = 1.0f / (1.0f + std::exp(-z[experts[t * k + j]]));
  }
}

void MoeMlp(ThreadPool& pool, const model::MoeConfig& moe, const CpuLayerWeights& lw, const float* x, int64_t T,
            int64_t H, int64_t I, MoeScratch* s, float* out) {
  const int64_t E = moe.num_experts, k = moe.experts_per_token;
  s->logits.resize(static_cast<size_t>(T * E));
  s->experts.resize(static_cast<size_t>(T * k));
  s->weights.resize(static_cast<size_t>(T * k));
  MatMul(pool, x, T, H, lw.router.data(), E, nullptr, s->logits.data());
  const bool scale_input = moe.sigmoid_routing;
  if (scale_input) {
    RouteTopKSigmoid(s->logits.data(), T, E, k, s->experts.data(), s->weights.data());
  } else {
    RouteTopK(s->logits.data(), T, E, k, moe.norm_topk_prob, s->experts.data(), s->weights.data());
  }

  // Group the T·k routes by expert (a counting sort keeps each expert's tokens ascending).
  s->offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t r = 0; r < T * k; ++r) ++s->offsets[s->experts[r] + 1];
  for (int64_t e = 0; e < E; ++e) s->offsets[e + 1] += s->offsets[e];
  s->slots.resize(static_cast<size_t>(T * k));
  std::vector<int64_t> fill(s->offsets.begin(), s->offsets.end() - 1);
  for (int64_t r = 0; r < T * k; ++r) s->slots[fill[s->experts[r]]++] = r;

  if (lw.shared_gate_up.empty()) {
    std::fill(out, out + T * H, 0.0f);
  } else {  // the shared expert over every token
    SwiGlu(pool, x, T, H, I, lw.shared_gate_up.data(), lw.shared_down.data(), s, out);
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t begin = s->offsets[e], n = s->offsets[e + 1] - begin;
    if (n == 0) continue;
    s->rows.resize(static_cast<size_t>(n * H));
    s->down.resize(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = s->slots[begin + i];
      float* row = &s->rows[i * H];
      std::memcpy(row, x + (r / k) * H, H * sizeof(float));
      if (scale_input) {
        for (int64_t h = 0; h < H; ++h) row[h] *= s->weights[r];
      }
    }
    SwiGlu(pool, s->rows.data(), n, H, I, lw.expert_gate_up[e].data(), lw.expert_down[e].data(), s, s->down.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = s->slots[begin + i];
      Axpy(scale_input ? 1.0f : s->weights[r], &s->down[i * H], out + (r / k) * H, H);
    }
  }
}

}  // namespace kvfleet::backend::cpu
