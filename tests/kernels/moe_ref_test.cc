// The MoE kernels' CPU references (kernels/moe_ref.h): the grouping by expert the kernels
// walk (offsets, 64-row tiles, every route once, position the inverse of sorted), routing's
// top-k and renormalisation, and the grouped product and combine against a dense
// per-token computation on values exact in fp32 and bf16; Llama 4's sigmoid routing, scaled
// gather and combine onto the shared expert.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/moe_limits.h"
#include "kernels/moe_ref.h"

namespace kvfleet::kernels {
namespace {

TEST_CASE("MoE grouping: every route once in its expert's group, 64-row tiles, position inverts sorted") {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t E = 1 + static_cast<int32_t>(rng() % 40), S = static_cast<int32_t>(rng() % 300);
    std::vector<int32_t> experts(S);
    for (auto& e : experts) e = static_cast<int32_t>(rng() % E);
    std::vector<int32_t> sorted(S), position(S), offsets(E + 1), tiles(E + 1);
    MoeGroupRef(experts.data(), S, E, sorted.data(), position.data(), offsets.data(), tiles.data());
    REQUIRE(offsets[0] == 0);
    REQUIRE(offsets[E] == S);
    int32_t tile_total = 0;
    for (int32_t e = 0; e < E; ++e) {
      const int32_t n = offsets[e + 1] - offsets[e];
      CHECK(tiles[e] == tile_total);
      tile_total += (n + kMoeTileRows - 1) / kMoeTileRows;
      for (int32_t r = offsets[e]; r < offsets[e + 1]; ++r) CHECK(experts[sorted[r]] == e);
    }
    CHECK(tiles[E] == tile_total);
    CHECK(tile_total <= MoeMaxTiles(S, E));
    for (int32_t r = 0; r < S; ++r) CHECK(sorted[position[r]] == r);
  }
}

TEST_CASE("MoE routing reference: the k most probable experts, ties to the lower id, renormalised on request") {
  // logits 0, ln 3, ln 3, ln 2 (bf16-rounded): experts 1 and 2 tie, then 3.
  const bf16_bits logits[4] = {FloatToBf16(0.f), FloatToBf16(1.0986123f), FloatToBf16(1.0986123f),
                               FloatToBf16(0.6931472f)};
  int32_t experts[3];
  float weights[3];
  MoeRouteRef(logits, 4, 1, 4, 3, false, experts, weights);
  CHECK(experts[0] == 1);
  CHECK(experts[1] == 2);
  CHECK(experts[2] == 3);
  const float sum = weights[0] + weights[1] + weights[2];
  CHECK(sum < 1.0f);  // expert 0's share is left out
  MoeRouteRef(logits, 4, 1, 4, 3, true, experts, weights);
  CHECK(weights[0] + weights[1] + weights[2] == doctest::Approx(1.0));
  CHECK(weights[0] == weights[1]);
}

TEST_CASE("grouped product then combine equals each token's weighted experts, computed densely") {
  std::mt19937 rng(6);
  std::uniform_int_distribution<int> small(-3, 3);
  const int32_t T = 13, k = 3, E = 5, N = 16, K = 24, S = T * k;
  std::vector<bf16_bits> w(size_t(E) * N * K), x(size_t(T) * K);
  for (auto& v : w) v = FloatToBf16(static_cast<float>(small(rng)));
  for (auto& v : x) v = FloatToBf16(static_cast<float>(small(rng)));
  std::vector<int32_t> experts(S);
  std::vector<float> weights(S);
  for (int32_t t = 0; t < T; ++t) {
    for (int32_t j = 0; j < k; ++j) {
      experts[t * k + j] = (t + 2 * j) % E;  // distinct experts per token
      weights[t * k + j] = 0.25f * static_cast<float>(j + 1);
    }
  }
  std::vector<int32_t> sorted(S), position(S), offsets(E + 1), tiles(E + 1);
  MoeGroupRef(experts.data(), S, E, sorted.data(), position.data(), offsets.data(), tiles.data());
  std::vector<bf16_bits> y(size_t(S) * N), out(size_t(T) * N);
  MoeGroupedGemmRef(w.data(), x.data(), sorted.data(), k, offsets.data(), y.data(), S, E, N, K);
  MoeCombineRef(y.data(), weights.data(), position.data(), out.data(), T, k, N);
  for (int32_t t = 0; t < T; ++t) {
    for (int32_t n = 0; n < N; ++n) {
      float want = 0;  // each dot an integer below 256 (exact in bf16), times quarters: exact in fp32
      for (int32_t j = 0; j < k; ++j) {
        const int32_t e = experts[t * k + j];
        float dot = 0;
        for (int32_t c = 0; c < K; ++c) dot += Bf16ToFloat(w[(size_t(e) * N + n) * K + c]) * Bf16ToFloat(x[size_t(t) * K + c]);
        want += weights[t * k + j] * dot;
      }
      CHECK(Bf16ToFloat(out[size_t(t) * N + n]) == RoundBf16(want));
    }
  }
}

TEST_CASE("Llama 4 MoE references: top-k by logit with sigmoid weights, inputs scaled, outputs summed onto the shared") {
  // Token 0: logits -1, 2, 2, 0.5 (experts 1 and 2 tie: the lower first); token 1: 3, -2, 0, 1.
  const float logits[8] = {-1.f, 2.f, 2.f, 0.5f, 3.f, -2.f, 0.f, 1.f};
  int32_t experts[4];
  float weights[4];
  MoeRouteSigmoidRef(logits, 4, 2, 4, 2, experts, weights);
  CHECK(experts[0] == 1);
  CHECK(experts[1] == 2);
  CHECK(experts[2] == 0);
  CHECK(experts[3] == 3);
  CHECK(weights[0] == RoundBf16(1.f / (1.f + std::exp(-2.f))));  // not normalised: the two sum past 1
  CHECK(weights[2] == RoundBf16(1.f / (1.f + std::exp(-3.f))));
  // Routes grouped by expert: 0 (token 1), 1 (token 0), 2 (token 0), 3 (token 1).
  std::vector<int32_t> sorted(4), position(4), offsets(5), tiles(5);
  MoeGroupRef(experts, 4, 4, sorted.data(), position.data(), offsets.data(), tiles.data());
  const int H = 8;
  std::vector<bf16_bits> x(2 * H), xs(4 * H);
  for (int i = 0; i < 2 * H; ++i) x[i] = FloatToBf16(static_cast<float>(i - 5));
  MoeGatherScaledRef(x.data(), sorted.data(), 2, weights, xs.data(), 4, H);
  for (int r = 0; r < 4; ++r) {
    const int route = sorted[r];
    for (int h = 0; h < H; ++h) {
      CHECK(xs[r * H + h] == FloatToBf16(Bf16ToFloat(x[(route / 2) * H + h]) * weights[route]));
    }
  }
  // Combine: token t gets shared[t] + bf16(y of its two routes), unweighted.
  std::vector<bf16_bits> y(4 * H), shared(2 * H), out(2 * H);
  for (int i = 0; i < 4 * H; ++i) y[i] = FloatToBf16(0.5f * static_cast<float>(i % 5));
  for (int i = 0; i < 2 * H; ++i) shared[i] = FloatToBf16(static_cast<float>(i));
  MoeCombineAddRef(y.data(), position.data(), shared.data(), out.data(), 2, 2, H);
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < H; ++h) {
      const float routed = Bf16ToFloat(y[position[2 * t] * H + h]) + Bf16ToFloat(y[position[2 * t + 1] * H + h]);
      CHECK(Bf16ToFloat(out[t * H + h]) == static_cast<float>(t * H + h) + routed);  // small integers and halves: exact
    }
  }
}

}  // namespace
}  // namespace kvfleet::kernels
