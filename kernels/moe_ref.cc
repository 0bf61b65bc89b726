#include "kernels/moe_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/moe_limits.h"

namespace kvfleet::kernels {

void MoeRouteRef(const bf16_bits* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                 int32_t* experts, float* weights) {
  std::vector<float> p(E);
  std::vector<int32_t> ids(E);
  for (int32_t t = 0; t < T; ++t) {
    float zmax = -INFINITY;
    for (int32_t e = 0; e < E; ++e) zmax = std::max(zmax, Bf16ToFloat(logits[int64_t(t) * ld + e]));
    float sum = 0;
    for (int32_t e = 0; e < E; ++e) sum += p[e] = std::exp(Bf16ToFloat(logits[int64_t(t) * ld + e]) - zmax);
    for (int32_t e = 0; e < E; ++e) p[e] /= sum;
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    float chosen = 0;
    for (int32_t j = 0; j < k; ++j) chosen += p[ids[j]];
    for (int32_t j = 0; j < k; ++j) {
      experts[t * k + j] = ids[j];
      weights[t * k + j] = normalize ? p[ids[j]] / chosen : p[ids[j]];
    }
  }
}

void MoeRouteSigmoidRef(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k, int32_t* experts,
                        float* weights) {
  std::vector<int32_t> ids(E);
  for (int32_t t = 0; t < T; ++t) {
    const float* z = logits + int64_t(t) * ld;
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    for (int32_t j = 0; j < k; ++j) {
      experts[t * k + j] = ids[j];
      weights[t * k + j] = RoundBf16(1.f / (1.f + std::exp(-z[ids[j]])));
    }
  }
}

void MoeGatherScaledRef(const bf16_bits* x, const int32_t* sorted, int32_t k, const float* weights, bf16_bits* xs,
                        int32_t S, int32_t H) {
  for (int32_t r = 0; r < S; ++r) {
    const int32_t route = sorted[r];
    for (int32_t h = 0; h < H; ++h) {
      xs[int64_t(r) * H + h] = FloatToBf16(Bf16ToFloat(x[int64_t(route / k) * H + h]) * weights[route]);
    }
  }
}

void MoeCombineAddRef(const bf16_bits* y, const int32_t* position, const bf16_bits* addend, bf16_bits* out, int32_t T,
                      int32_t k, int32_t H) {
  for (int32_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int32_t j = 0; j < k; ++j) acc += Bf16ToFloat(y[int64_t(position[t * k + j]) * H + h]);
      out[int64_t(t) * H + h] = FloatToBf16(Bf16ToFloat(addend[int64_t(t) * H + h]) + RoundBf16(acc));
    }
  }
}

void MoeGroupRef(const int32_t* experts, int32_t S, int32_t E, int32_t* sorted, int32_t* position, int32_t* offsets,
                 int32_t* tile_offsets) {
  std::fill(offsets, offsets + E + 1, 0);
  for (int32_t r = 0; r < S; ++r) ++offsets[experts[r] + 1];
  tile_offsets[0] = 0;
  for (int32_t e = 0; e < E; ++e) {
    tile_offsets[e + 1] = tile_offsets[e] + (offsets[e + 1] + kMoeTileRows - 1) / kMoeTileRows;
    offsets[e + 1] += offsets[e];
  }
  std::vector<int32_t> fill(offsets, offsets + E);
  for (int32_t r = 0; r < S; ++r) {
    position[r] = fill[experts[r]]++;
    sorted[position[r]] = r;
  }
}

void MoeGroupedGemmRef(const bf16_bits* w, const bf16_bits* x, const int32_t* sorted, int32_t gather_div,
                       const int32_t* offsets, bf16_bits* y, int32_t S, int32_t E, int32_t N, int32_t K) {
  for (int32_t e = 0; e < E; ++e) {
    for (int32_t r = offsets[e]; r < offsets[e + 1] && r < S; ++r) {
      const int64_t src = gather_div > 0 ? sorted[r] / gather_div : r;
      for (int32_t n = 0; n < N; ++n) {
        const bf16_bits* wr = w + (int64_t(e) * N + n) * K;
        double acc = 0;
        for (int32_t c = 0; c < K; ++c) acc += double(Bf16ToFloat(wr[c])) * Bf16ToFloat(x[src * K + c]);
        y[int64_t(r) * N + n] = FloatToBf16(static_cast<float>(acc));
      }
    }
  }
}

void MoeCombineRef(const bf16_bits* y, const float* weights, const int32_t* position, bf16_bits* out, int32_t T,
                   int32_t k, int32_t H) {
  for (int32_t t = 0; t < T; ++t) {
    for (int32_t h = 0; h < H; ++h) {
      float acc = 0;
      for (int32_t j = 0; j < k; ++j) {
        acc += weights[t * k + j] * Bf16ToFloat(y[int64_t(position[t * k + j]) * H + h]);
      }
      out[int64_t(t) * H + h] = FloatToBf16(acc);
    }
  }
}

}  // namespace kvfleet::kernels
