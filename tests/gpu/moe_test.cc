// The MoE kernels (kernels/moe.h) against their CPU references at several sizes: routing
// (softmax, top-k with ties to the lower id, renormalisation), the device-side grouping by
// expert, the grouped tensor-core GEMM (gathered token rows and grouped rows, groups of 0 to
// several tiles, N and K not multiples of the tile), the decode gemv over the same groups, and
// the weighted un-permute; Llama 4's sigmoid router, scaled gather and unweighted combine plus
// the shared expert's rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "kernels/moe.h"
#include "kernels/moe_ref.h"
#include "kernels/small_kernels_ref.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

TEST_CASE("routing equals the reference: top-k by probability, ties to the lower id, renormalised when asked") {
  std::mt19937 rng(21);
  struct Shape {
    int T, E, k, ld;
  };
  for (Shape s : {Shape{1, 4, 2, 8}, Shape{37, 8, 2, 8}, Shape{64, 128, 8, 128}, Shape{5, 60, 4, 64},
                  Shape{9, 512, 16, 512}})
    for (bool normalize : {false, true}) {
      auto logits = gputest::RandomBf16(size_t(s.T) * s.ld, rng, -4, 4);
      // A tie in token 0 between experts 1 and 3 (and the largest logit): the lower id first.
      logits[1] = logits[3] = FloatToBf16(6.0f);
      DeviceBuffer<bf16_bits> dl(logits);
      DeviceBuffer<int32_t> de(size_t(s.T) * s.k);
      DeviceBuffer<float> dw(size_t(s.T) * s.k);
      de.Poison();
      dw.Poison();
      KVF_CUDA_OK(LaunchMoeRoute(dl.as<__nv_bfloat16>(), s.ld, s.T, s.E, s.k, normalize, de.get(), dw.get(), nullptr));
      KVF_CUDA_OK(cudaDeviceSynchronize());
      std::vector<int32_t> experts(size_t(s.T) * s.k);
      std::vector<float> weights(experts.size());
      MoeRouteRef(logits.data(), s.ld, s.T, s.E, s.k, normalize, experts.data(), weights.data());
      CAPTURE(s.T);
      CAPTURE(s.E);
      CAPTURE(s.k);
      CAPTURE(normalize);
      CHECK(de.Download() == experts);
      const std::vector<float> got = dw.Download();
      float worst = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - weights[i]));
      CHECK(worst <= 1e-6f);
      CHECK(experts[0] == 1);
      CHECK(experts[1] == 3);
      // The fp32 overload (the backend's router product) over the same values: the same routes.
      std::vector<float> wide(logits.size());
      for (size_t i = 0; i < wide.size(); ++i) wide[i] = Bf16ToFloat(logits[i]);
      DeviceBuffer<float> dlf(wide);
      de.Poison();
      dw.Poison();
      KVF_CUDA_OK(LaunchMoeRoute(dlf.get(), s.ld, s.T, s.E, s.k, normalize, de.get(), dw.get(), nullptr));
      KVF_CUDA_OK(cudaDeviceSynchronize());
      CHECK(de.Download() == experts);
      const std::vector<float> got_f32 = dw.Download();
      worst = 0;
      for (size_t i = 0; i < got_f32.size(); ++i) worst = std::max(worst, std::fabs(got_f32[i] - weights[i]));
      CHECK(worst <= 1e-6f);
    }
  // Out of range: refused, nothing launched.
  const __nv_bfloat16* none = nullptr;
  CHECK(LaunchMoeRoute(none, 4, 1, 4, 5, true, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(LaunchMoeRoute(none, 1024, 1, 1024, 2, true, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(LaunchMoeRoute(static_cast<const float*>(nullptr), 8, 1, 8, 9, true, nullptr, nullptr, nullptr) ==
        cudaErrorInvalidValue);
}

// The grouping: offsets and tile offsets as the reference's; within each group the same
// set of routes; position the inverse of sorted.
void CheckGroup(const std::vector<int32_t>& experts, int E) {
  const int S = static_cast<int>(experts.size());
  std::vector<int32_t> sorted(S), position(S), offsets(E + 1), tiles(E + 1);
  MoeGroupRef(experts.data(), S, E, sorted.data(), position.data(), offsets.data(), tiles.data());
  DeviceBuffer<int32_t> de(experts), ds(std::max(S, 1)), dp(std::max(S, 1)), doff(E + 1), dt(E + 1), da(E + 1);
  da.Poison();
  KVF_CUDA_OK(LaunchMoeGroup(de.get(), S, E, ds.get(), dp.get(), doff.get(), dt.get(), nullptr, da.get()));
  KVF_CUDA_OK(cudaDeviceSynchronize());
  CHECK(doff.Download() == offsets);
  CHECK(dt.Download() == tiles);
  // The non-empty groups' experts, ascending, after their count.
  std::vector<int32_t> active = {0};
  for (int e = 0; e < E; ++e)
    if (offsets[e + 1] > offsets[e]) active.push_back(e);
  active[0] = static_cast<int32_t>(active.size()) - 1;
  const std::vector<int32_t> got_active = da.Download();
  CHECK(std::vector<int32_t>(got_active.begin(), got_active.begin() + active.size()) == active);
  const std::vector<int32_t> gs = ds.Download(), gp = dp.Download();
  for (int e = 0; e < E; ++e) {
    std::set<int32_t> want(sorted.begin() + offsets[e], sorted.begin() + offsets[e + 1]);
    std::set<int32_t> got(gs.begin() + offsets[e], gs.begin() + offsets[e + 1]);
    CHECK(want == got);
  }
  for (int r = 0; r < S; ++r) CHECK(gs[gp[r]] == r);
}

TEST_CASE("grouping by expert: offsets, tiles, and every route once in its expert's group") {
  std::mt19937 rng(22);
  for (auto [S, E] : {std::pair{1, 4}, std::pair{16, 8}, std::pair{1000, 128}, std::pair{4096, 8}, std::pair{333, 512}}) {
    std::vector<int32_t> experts(S);
    std::uniform_int_distribution<int> pick(0, E - 1);
    for (auto& e : experts) e = pick(rng);
    CAPTURE(S);
    CAPTURE(E);
    CheckGroup(experts, E);
  }
  // Skewed: every route to one expert (many tiles), the others empty.
  CheckGroup(std::vector<int32_t>(300, 5), 8);
}

TEST_CASE("the grouped GEMM equals the reference, from token rows and from grouped rows") {
  std::mt19937 rng(23);
  struct Shape {
    int T, k, E, N, K;
  };
  for (Shape s : {Shape{1, 2, 4, 192, 64}, Shape{3, 2, 8, 96, 64}, Shape{40, 8, 16, 72, 40}, Shape{200, 2, 8, 128, 256},
                  Shape{7, 4, 6, 64, 200}})
    for (int gather : {1, 0}) {
      const int S = s.T * s.k;
      std::vector<int32_t> experts(S);
      std::uniform_int_distribution<int> pick(0, s.E - 1);
      for (auto& e : experts) e = pick(rng);
      if (S > 100) std::fill(experts.begin(), experts.begin() + 100, 1);  // one group of two tiles
      std::vector<int32_t> sorted(S), position(S), offsets(s.E + 1), tiles(s.E + 1);
      MoeGroupRef(experts.data(), S, s.E, sorted.data(), position.data(), offsets.data(), tiles.data());
      const int rows = gather ? s.T : S;
      auto w = gputest::RandomBf16(size_t(s.E) * s.N * s.K, rng, -0.5f, 0.5f);
      auto x = gputest::RandomBf16(size_t(rows) * s.K, rng, -1, 1);
      DeviceBuffer<bf16_bits> dw(w), dx(x), dy(size_t(S) * s.N);
      DeviceBuffer<int32_t> ds(sorted), doff(offsets), dt(tiles);
      dy.Poison();
      KVF_CUDA_OK(LaunchMoeGroupedGemm(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), ds.get(), gather ? s.k : 0,
                                       doff.get(), dt.get(), dy.as<__nv_bfloat16>(), S, s.E, s.N, s.K, nullptr));
      KVF_CUDA_OK(cudaDeviceSynchronize());
      std::vector<bf16_bits> y(size_t(S) * s.N);
      MoeGroupedGemmRef(w.data(), x.data(), sorted.data(), gather ? s.k : 0, offsets.data(), y.data(), S, s.E, s.N,
                        s.K);
      CAPTURE(s.T);
      CAPTURE(s.E);
      CAPTURE(s.N);
      CAPTURE(s.K);
      CAPTURE(gather);
      // fp32 accumulation against the reference's double, each rounded to bf16 once: the
      // relative error of the whole output is a fraction of bf16's 2^-8.
      const std::vector<bf16_bits> got = dy.Download();
      CHECK(gputest::RelativeError(got, gputest::ToFloat(y)) <= 4e-3);
    }
  CHECK(LaunchMoeGroupedGemm(nullptr, nullptr, nullptr, 0, nullptr, nullptr, nullptr, 8, 4, 64, 60, nullptr) ==
        cudaErrorInvalidValue);
}

TEST_CASE("the decode gemv equals the reference, from token rows and grouped rows, with and without SiLU-mul") {
  std::mt19937 rng(25);
  struct Shape {
    int T, k, E, N, K;
  };
  // T = 1 (one row a group), 2 and 3 (the 2- and 4-row passes), 8 routed to few experts (full
  // passes), 40 with one expert taking every token (five passes); N not a multiple of the
  // block's rows, K not a multiple of the warp's stride.
  for (Shape s : {Shape{1, 8, 128, 96, 256}, Shape{2, 2, 4, 72, 64}, Shape{3, 2, 8, 40, 200}, Shape{8, 2, 3, 64, 1032},
                  Shape{40, 2, 6, 56, 48}})
    for (int gather : {1, 0})
      for (bool silu : {false, true}) {
        const int S = s.T * s.k;
        std::vector<int32_t> experts(S);
        for (int t = 0; t < s.T; ++t) {  // k distinct experts a token, as routing picks them
          std::vector<int32_t> ids(s.E);
          std::iota(ids.begin(), ids.end(), 0);
          std::shuffle(ids.begin(), ids.end(), rng);
          if (s.T == 40) std::swap(*std::find(ids.begin(), ids.end(), 4), ids[0]);  // expert 4 in every token
          std::copy(ids.begin(), ids.begin() + s.k, experts.begin() + t * s.k);
        }
        std::vector<int32_t> sorted(S), position(S), offsets(s.E + 1), tiles(s.E + 1);
        MoeGroupRef(experts.data(), S, s.E, sorted.data(), position.data(), offsets.data(), tiles.data());
        const int rows = gather ? s.T : S, wn = silu ? 2 * s.N : s.N;
        auto w = gputest::RandomBf16(size_t(s.E) * wn * s.K, rng, -0.5f, 0.5f);
        auto x = gputest::RandomBf16(size_t(rows) * s.K, rng, -1, 1);
        DeviceBuffer<bf16_bits> dw(w), dx(x), dy(size_t(S) * s.N);
        DeviceBuffer<int32_t> de(experts), ds(S), dp(S), doff(s.E + 1), dt(s.E + 1), da(s.E + 1);
        dy.Poison();
        KVF_CUDA_OK(LaunchMoeGroup(de.get(), S, s.E, ds.get(), dp.get(), doff.get(), dt.get(), nullptr, da.get()));
        KVF_CUDA_OK(LaunchMoeGroupedGemv(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), ds.get(), gather ? s.k : 0,
                                         doff.get(), da.get(), dy.as<__nv_bfloat16>(), silu, s.T, S, s.E, s.N, s.K,
                                         nullptr));
        KVF_CUDA_OK(cudaDeviceSynchronize());
        // The reference over the kernel's own grouping (rows within a group come in any order).
        const std::vector<int32_t> gsorted = ds.Download();
        std::vector<bf16_bits> prod(size_t(S) * wn), y(size_t(S) * s.N);
        MoeGroupedGemmRef(w.data(), x.data(), gsorted.data(), gather ? s.k : 0, offsets.data(), prod.data(), S, s.E,
                          wn, s.K);
        if (silu) {
          SiluMulRef(prod.data(), y.data(), S, s.N);
        } else {
          y = prod;
        }
        CAPTURE(s.T);
        CAPTURE(s.E);
        CAPTURE(s.N);
        CAPTURE(s.K);
        CAPTURE(gather);
        CAPTURE(silu);
        // As the grouped GEMM's bar: fp32 sums against double, one bf16 rounding (SiLU-mul
        // rounds g and u first, as the reference does).
        CHECK(gputest::RelativeError(dy.Download(), gputest::ToFloat(y)) <= 4e-3);
      }
  CHECK(LaunchMoeGroupedGemv(nullptr, nullptr, nullptr, 0, nullptr, nullptr, nullptr, false, 1, 8, 4, 64, 60,
                             nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("the combine sums each token's weighted expert rows") {
  std::mt19937 rng(24);
  struct Shape {
    int T, k, H;
  };
  for (Shape shape : {Shape{1, 2, 64}, Shape{37, 8, 2048}, Shape{5, 1, 96}}) {
    const int T = shape.T, k = shape.k, H = shape.H, S = T * k;
    auto y = gputest::RandomBf16(size_t(S) * H, rng, -2, 2);
    std::vector<int32_t> position(S);
    std::iota(position.begin(), position.end(), 0);
    std::shuffle(position.begin(), position.end(), rng);
    std::vector<float> weights(S);
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& w : weights) w = u(rng);
    DeviceBuffer<bf16_bits> dy(y), dout(size_t(T) * H);
    DeviceBuffer<int32_t> dp(position);
    DeviceBuffer<float> dw(weights);
    dout.Poison();
    KVF_CUDA_OK(LaunchMoeCombine(dy.as<__nv_bfloat16>(), dw.get(), dp.get(), dout.as<__nv_bfloat16>(), T, k, H, nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bf16_bits> out(size_t(T) * H);
    MoeCombineRef(y.data(), weights.data(), position.data(), out.data(), T, k, H);
    CAPTURE(T);
    CAPTURE(k);
    // The same fp32 sums in the same order; a fused multiply-add may move the last bit.
    CHECK(gputest::RelativeError(dout.Download(), gputest::ToFloat(out)) <= 1e-3);
  }
}

// Llama 4's MoE: the sigmoid router (top-k by logit, weights bf16(sigmoid), not normalised),
// the gather of each route's token row scaled by its weight in grouped order, and the
// unweighted combine added to the shared expert's rows, in place.
TEST_CASE("Llama 4: sigmoid routing, the scaled gather and the combine with the shared expert equal the references") {
  std::mt19937 rng(25);
  struct Shape {
    int T, E, k, ld, H;
  };
  for (Shape s : {Shape{1, 4, 1, 8, 64}, Shape{37, 16, 1, 16, 128}, Shape{64, 128, 1, 128, 96}, Shape{9, 60, 4, 64, 64},
                  Shape{5, 512, 16, 512, 40}}) {
    CAPTURE(s.T);
    CAPTURE(s.E);
    CAPTURE(s.k);
    const int S = s.T * s.k;
    std::vector<float> logits(size_t(s.T) * s.ld);
    std::uniform_real_distribution<float> u(-4, 4);
    for (float& z : logits) z = u(rng);
    // Token 0: experts 1 and 3 tie at the top (the lower id first); a large negative logit
    // elsewhere keeps a softmax router's choice from equalling this one by chance.
    logits[1] = logits[3] = 6.0f;
    if (s.T > 1) logits[s.ld] = -30.0f;
    DeviceBuffer<float> dl(logits), dw(S);
    DeviceBuffer<int32_t> de(S);
    de.Poison();
    dw.Poison();
    KVF_CUDA_OK(LaunchMoeRouteSigmoid(dl.get(), s.ld, s.T, s.E, s.k, de.get(), dw.get(), nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<int32_t> experts(S);
    std::vector<float> weights(S);
    MoeRouteSigmoidRef(logits.data(), s.ld, s.T, s.E, s.k, experts.data(), weights.data());
    CHECK(de.Download() == experts);
    CHECK(experts[0] == 1);
    const std::vector<float> got_w = dw.Download();
    float worst = 0;
    for (size_t i = 0; i < got_w.size(); ++i) worst = std::max(worst, std::fabs(got_w[i] - weights[i]));
    CHECK(worst <= 4e-3f);  // bf16 roundings of fp32 sigmoids that may differ in the last bit
    CHECK(std::fabs(got_w[0] - 1.f / (1.f + std::exp(-6.0f))) <= 4e-3f);  // the sigmoid, not a softmax share

    // Grouped by expert, as LaunchMoeGroup would; then the scaled gather from token rows.
    std::vector<int32_t> sorted(S), position(S), offsets(s.E + 1), tiles(s.E + 1);
    MoeGroupRef(experts.data(), S, s.E, sorted.data(), position.data(), offsets.data(), tiles.data());
    auto x = gputest::RandomBf16(size_t(s.T) * s.H, rng, -3, 3);
    DeviceBuffer<bf16_bits> dx(x), dxs(size_t(S) * s.H);
    DeviceBuffer<int32_t> ds(sorted);
    DeviceBuffer<float> dref_w(weights);
    dxs.Poison();
    KVF_CUDA_OK(LaunchMoeGatherScaled(dx.as<__nv_bfloat16>(), ds.get(), s.k, dref_w.get(), dxs.as<__nv_bfloat16>(), S,
                                      s.H, nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bf16_bits> xs(size_t(S) * s.H);
    MoeGatherScaledRef(x.data(), sorted.data(), s.k, weights.data(), xs.data(), S, s.H);
    CHECK(dxs.Download() == xs);  // one fp32 product, one rounding: exact

    // The combine: the routes' rows (stand-ins for the experts' outputs) summed unweighted,
    // rounded, added to the shared expert's rows in place.
    auto y = gputest::RandomBf16(size_t(S) * s.H, rng, -2, 2);
    auto shared = gputest::RandomBf16(size_t(s.T) * s.H, rng, -2, 2);
    DeviceBuffer<bf16_bits> dy(y), dout(shared);
    DeviceBuffer<int32_t> dp(position);
    KVF_CUDA_OK(LaunchMoeCombineAdd(dy.as<__nv_bfloat16>(), dp.get(), dout.as<__nv_bfloat16>(), dout.as<__nv_bfloat16>(),
                                    s.T, s.k, s.H, nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bf16_bits> out(size_t(s.T) * s.H);
    MoeCombineAddRef(y.data(), position.data(), shared.data(), out.data(), s.T, s.k, s.H);
    CHECK(dout.Download() == out);  // the same fp32 additions in the same order: exact
  }
  CHECK(LaunchMoeRouteSigmoid(nullptr, 8, 1, 8, 9, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
  CHECK(LaunchMoeGatherScaled(nullptr, nullptr, 1, nullptr, nullptr, 4, 60, nullptr) == cudaErrorInvalidValue);
  CHECK(LaunchMoeCombineAdd(nullptr, nullptr, nullptr, nullptr, 4, 1, 60, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvfleet::kernels
