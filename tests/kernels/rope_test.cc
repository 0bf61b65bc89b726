// RoPE frequencies and attention scaling (kernels/rope.h) against expectations derived by hand
// from the formulas of transformers' modeling_rope_utils: default, linear, YaRN (its ramp
// boundaries, factor 1, the mscale variants, truncate) and dynamic NTK (its growth past
// max_position_embeddings). tests/worker/model/rope_reference_test.cc compares the same
// functions with transformers' own numbers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/rope.h"
#include "kernels/small_kernels_ref.h"

namespace kvfleet::kernels {
namespace {

using Type = RopeScaling::Type;

RopeConfig Config(int head_dim, double theta, Type type = Type::kNone, double factor = 1.0) {
  RopeConfig c;
  c.head_dim = head_dim;
  c.theta = theta;
  c.scaling.type = type;
  c.scaling.factor = factor;
  return c;
}

double Plain(double theta, int i, int head_dim) { return std::pow(theta, -2.0 * i / head_dim); }

TEST_CASE("default frequencies are theta^(-2i/d), and linear divides them by the factor") {
  const auto plain = RopeInvFreq(Config(128, 1e6));
  const auto linear = RopeInvFreq(Config(128, 1e6, Type::kLinear, 4.0));
  REQUIRE(plain.size() == 64);
  REQUIRE(linear.size() == 64);
  for (int i = 0; i < 64; ++i) {
    CHECK(plain[i] == doctest::Approx(Plain(1e6, i, 128)).epsilon(1e-6));
    CHECK(linear[i] == doctest::Approx(plain[i] / 4).epsilon(1e-7));
  }
  CHECK(plain[0] == 1.0f);
  CHECK(RopeAttentionScaling(Config(128, 1e6)) == 1.0);
  CHECK(RopeAttentionScaling(Config(128, 1e6, Type::kLinear, 4.0)) == 1.0);
}

// YaRN with Qwen3's model-card setting: theta 1e6, head_dim 128, factor 4 from 32768. The
// ramp's ends are the dims that turn beta_fast = 32 and beta_slow = 1 times over 32768
// positions: d·ln(32768 / (β·2π)) / (2·ln 1e6) = 23.59 and 39.65, so 23 and 40 once
// truncated outward. Dims up to 23 keep their frequency, dims from 40 on are divided by 4,
// and the ramp blends linearly between: r = (i − 23) / 17.
TEST_CASE("yarn keeps fast dims, divides slow dims by the factor, and ramps between at the derived bounds") {
  RopeConfig c = Config(128, 1e6, Type::kYarn, 4.0);
  c.scaling.original_max_position_embeddings = 32768;
  const auto inv = RopeInvFreq(c);
  REQUIRE(inv.size() == 64);
  for (int i = 0; i < 64; ++i) {
    CAPTURE(i);
    const double plain = Plain(1e6, i, 128);
    const double r = std::clamp((i - 23.0) / 17.0, 0.0, 1.0);
    CHECK(inv[i] == doctest::Approx(plain / 4 * r + plain * (1 - r)).epsilon(2e-6));
    if (i <= 23) CHECK(inv[i] == doctest::Approx(plain).epsilon(1e-6));
    if (i >= 40) CHECK(inv[i] == doctest::Approx(plain / 4).epsilon(1e-6));
  }
  // 0.1·ln(4) + 1: the cos/sin scaling YaRN's paper suggests.
  CHECK(RopeAttentionScaling(c) == doctest::Approx(0.1 * std::log(4.0) + 1).epsilon(1e-12));

  // Without truncation the ramp starts at 23.59, not 23: dim 23 is still wholly fast, and
  // dim 24 is (24 − 23.59) / (39.65 − 23.59) of the way.
  c.scaling.truncate = false;
  const auto smooth = RopeInvFreq(c);
  const double lo = 128 * std::log(32768 / (32 * 2 * M_PI)) / (2 * std::log(1e6));
  const double hi = 128 * std::log(32768 / (1 * 2 * M_PI)) / (2 * std::log(1e6));
  CHECK(lo == doctest::Approx(23.59).epsilon(1e-3));
  CHECK(hi == doctest::Approx(39.65).epsilon(1e-3));
  for (int i : {23, 24, 30, 39, 40}) {
    CAPTURE(i);
    const double r = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    const double plain = Plain(1e6, i, 128);
    CHECK(smooth[i] == doctest::Approx(plain / 4 * r + plain * (1 - r)).epsilon(2e-6));
  }
  CHECK(smooth[24] != inv[24]);
}

TEST_CASE("yarn with factor 1 is the default RoPE, attention unscaled") {
  RopeConfig c = Config(64, 10000, Type::kYarn, 1.0);
  c.scaling.original_max_position_embeddings = 4096;
  const auto yarn = RopeInvFreq(c), plain = RopeInvFreq(Config(64, 10000));
  for (int i = 0; i < 32; ++i) CHECK(yarn[i] == doctest::Approx(plain[i]).epsilon(1e-7));
  CHECK(RopeAttentionScaling(c) == 1.0);
}

TEST_CASE("yarn's attention scaling: explicit, from mscale and mscale_all_dim, or from the factor alone") {
  RopeConfig c = Config(64, 10000, Type::kYarn, 40.0);
  c.scaling.original_max_position_embeddings = 4096;
  CHECK(RopeAttentionScaling(c) == doctest::Approx(0.1 * std::log(40.0) + 1).epsilon(1e-12));
  c.scaling.mscale = 0.707;  // DeepSeek-V2: equal mscales cancel
  c.scaling.mscale_all_dim = 0.707;
  CHECK(RopeAttentionScaling(c) == doctest::Approx(1.0).epsilon(1e-12));
  c.scaling.mscale = 1.0;
  CHECK(RopeAttentionScaling(c) ==
        doctest::Approx((0.1 * std::log(40.0) + 1) / (0.0707 * std::log(40.0) + 1)).epsilon(1e-12));
  c.scaling.mscale_all_dim = 0;  // HF's `if mscale and mscale_all_dim`: one unset, factor alone
  CHECK(RopeAttentionScaling(c) == doctest::Approx(0.1 * std::log(40.0) + 1).epsilon(1e-12));
  c.scaling.attention_factor = 0.8;
  CHECK(RopeAttentionScaling(c) == 0.8);
}

// Dynamic NTK: up to max_position_embeddings the frequencies are the plain ones; past it,
// theta becomes theta · (factor · L / max − (factor − 1))^(d / (d − 2)) for length L.
TEST_CASE("dynamic NTK frequencies are plain up to max_position_embeddings and slow down past it") {
  RopeConfig c = Config(64, 10000, Type::kDynamic, 2.0);
  c.max_position_embeddings = 4096;
  CHECK(RopeDependsOnLength(c));
  CHECK_FALSE(RopeDependsOnLength(Config(64, 10000, Type::kYarn, 2.0)));
  const auto plain = RopeInvFreq(Config(64, 10000));
  CHECK(RopeInvFreq(c) == plain);        // at load
  CHECK(RopeInvFreq(c, 100) == plain);   // a short sequence
  CHECK(RopeInvFreq(c, 4096) == plain);  // exactly at the limit
  std::vector<float> previous = plain;
  for (int64_t len : {4097, 8192, 20000}) {
    CAPTURE(len);
    const auto inv = RopeInvFreq(c, len);
    const double theta = 10000 * std::pow(2.0 * len / 4096 - 1, 64.0 / 62);
    for (int i = 0; i < 32; ++i) CHECK(inv[i] == doctest::Approx(Plain(theta, i, 64)).epsilon(2e-6));
    CHECK(inv[0] == 1.0f);
    for (int i = 1; i < 32; ++i) CHECK(inv[i] < previous[i]);  // longer: slower
    previous = inv;
  }
  CHECK(RopeAttentionScaling(c) == 1.0);
}

// Llama 4's q/k transforms (Llama4QkKvStoreRef) against the formulas in double: RoPE layers
// rotate pairs (2i, 2i + 1) as complex numbers by position·inv_freq[i], then each head has unit
// RMS; NoPE layers keep q and K, q scaled by 1 + 0.1·log1p(floor((p + 1) / 8)); V as given.
TEST_CASE("Llama 4 q/k reference: interleaved rotation, L2 norm after it, NoPE temperature on q only") {
  const int hq = 2, hkv = 1, d = 8;
  PagedKvLayout layout{1, hkv, 4, d};
  std::vector<bf16_bits> qkv((hq + 2 * hkv) * d);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = FloatToBf16(0.25f * static_cast<float>(int(i % 7) - 3) + 0.125f);
  RopeConfig rc;
  rc.head_dim = d;
  rc.theta = 10000.0;
  rc.interleaved = true;
  const std::vector<float> inv = RopeInvFreq(rc);
  const int32_t pos = 5, slot = 1;
  std::vector<bf16_bits> q(hq * d), pool(layout.BlockElems(), 0);
  Llama4QkKvStoreRef(qkv.data(), &pos, &slot, inv.data(), q.data(), pool.data(), layout, 0, 1, hq, true, true, 1e-5f,
                     0.f, 0.f);
  const bf16_bits* k = pool.data() + layout.Offset(0, 0, 0, 0, 1);
  for (int h = 0; h <= hq; ++h) {  // q heads, then the k head
    const bf16_bits* in = qkv.data() + h * d;
    const bf16_bits* out = h < hq ? q.data() + h * d : k;
    std::vector<double> want(d);
    double ss = 0;
    for (int i = 0; i < d / 2; ++i) {
      const double a = Bf16ToFloat(in[2 * i]), b = Bf16ToFloat(in[2 * i + 1]);
      const double c = std::cos(pos * double(inv[i])), s = std::sin(pos * double(inv[i]));
      want[2 * i] = a * c - b * s;
      want[2 * i + 1] = a * s + b * c;
      ss += want[2 * i] * want[2 * i] + want[2 * i + 1] * want[2 * i + 1];
    }
    for (int e = 0; e < d; ++e) {
      CHECK(Bf16ToFloat(out[e]) == doctest::Approx(want[e] / std::sqrt(ss / d + 1e-5)).epsilon(2e-2));
    }
  }
  for (int e = 0; e < d; ++e) CHECK(pool[layout.Offset(0, 0, 1, 0, 1) + e] == qkv[(hq + hkv) * d + e]);  // V

  // NoPE: no rotation, no norm; q times its position's temperature (1 below position 7).
  for (int32_t p : {6, 7, 100}) {
    std::vector<bf16_bits> q2(hq * d), pool2(layout.BlockElems(), 0);
    Llama4QkKvStoreRef(qkv.data(), &p, &slot, inv.data(), q2.data(), pool2.data(), layout, 0, 1, hq, false, false, 1e-5f,
                       0.1f, 8.f);
    const double temp = 1.0 + 0.1 * std::log1p(std::floor((p + 1) / 8.0));
    CAPTURE(p);
    for (int e = 0; e < hq * d; ++e) CHECK(Bf16ToFloat(q2[e]) == doctest::Approx(Bf16ToFloat(qkv[e]) * temp).epsilon(8e-3));
    for (int e = 0; e < d; ++e) CHECK(pool2[layout.Offset(0, 0, 0, 0, 1) + e] == qkv[hq * d + e]);  // K unscaled
  }
}

}  // namespace
}  // namespace kvfleet::kernels
