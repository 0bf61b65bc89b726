// The fp8 e4m3 KV cache's CPU reference: the encoding (every code, rounding, saturation, NaN),
// the scaled round trip, the quantised pools and paged attention over fp8 pages.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/fp8.h"
#include "kernels/paged_attention_ref.h"
#include "kernels/small_kernels_ref.h"

namespace kvfleet::kernels {
namespace {

bool IsNanCode(int c) { return (c & 0x7f) == 0x7f; }

// The finite code nearest to x, ties to the even code (the one whose last mantissa bit is 0);
// beyond 448 it saturates. A brute-force model of FloatToFp8E4m3.
fp8_bits NearestCode(float x) {
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    if (IsNanCode(c)) continue;
    const double d = std::fabs(static_cast<double>(Fp8E4m3ToFloat(static_cast<fp8_bits>(c))) - x);
    const bool same_sign = (c >> 7) == (std::signbit(x) ? 1 : 0);
    if (best < 0 || d < best_d || (d == best_d && same_sign && ((c & 1) == 0 || (best >> 7) != (c >> 7)))) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<fp8_bits>(best);
}

TEST_CASE("e4m3 decodes the known codes: 448, 2^-6, the subnormals, one, NaN") {
  CHECK(Fp8E4m3ToFloat(0x7e) == 448.f);
  CHECK(Fp8E4m3ToFloat(0xfe) == -448.f);
  CHECK(Fp8E4m3ToFloat(0x38) == 1.f);
  CHECK(Fp8E4m3ToFloat(0x40) == 2.f);
  CHECK(Fp8E4m3ToFloat(0x08) == std::ldexp(1.f, -6));     // smallest normal
  CHECK(Fp8E4m3ToFloat(0x0f) == 1.875f * std::ldexp(1.f, -6));
  CHECK(Fp8E4m3ToFloat(0x07) == 0.875f * std::ldexp(1.f, -6));  // largest subnormal
  CHECK(Fp8E4m3ToFloat(0x01) == std::ldexp(1.f, -9));     // smallest subnormal
  CHECK(Fp8E4m3ToFloat(0x00) == 0.f);
  CHECK(std::signbit(Fp8E4m3ToFloat(0x80)));
  CHECK(std::isnan(Fp8E4m3ToFloat(0x7f)));
  CHECK(std::isnan(Fp8E4m3ToFloat(0xff)));
}

TEST_CASE("the decode kernel's bit-move e4m3 -> bf16 gives every finite code exactly, in both halves") {
  // Every pair (lo, hi) of codes, as Fp8x4ToBf16x4 lays them out: [0, lo, 0, hi].
  for (int lo = 0; lo < 256; ++lo) {
    for (int hi = 0; hi < 256; hi += 1 + (lo % 7)) {
      const uint32_t bits = Fp8PairToScaledBf16Pair(static_cast<uint32_t>(lo) << 8 | static_cast<uint32_t>(hi) << 24);
      const int codes[2] = {lo, hi};
      for (int h = 0; h < 2; ++h) {
        if (IsNanCode(codes[h])) continue;
        const float got = Bf16ToFloat(static_cast<bf16_bits>(bits >> (16 * h))) * kFp8ToBf16Rebias;
        const float want = Fp8E4m3ToFloat(static_cast<fp8_bits>(codes[h]));
        CHECK_MESSAGE(got == want, "code " << codes[h]);
        CHECK(std::signbit(got) == std::signbit(want));  // -0 stays -0
      }
    }
  }
}

TEST_CASE("every finite e4m3 code encodes back to itself, positive codes ascend, and only 0x7f/0xff are NaN") {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = Fp8E4m3ToFloat(static_cast<fp8_bits>(c));
    if (std::isnan(v)) {
      ++nans;
      CHECK(IsNanCode(c));
      CHECK(FloatToFp8E4m3(v) == ((c & 0x80) | 0x7f));
      continue;
    }
    CHECK(FloatToFp8E4m3(v) == c);
    CHECK(FloatToFp8E4m3(-v) == (c ^ 0x80));
    if (c > 0 && c < 0x7f) CHECK(v > Fp8E4m3ToFloat(static_cast<fp8_bits>(c - 1)));
  }
  CHECK(nans == 2);
}

TEST_CASE("e4m3 encoding rounds to nearest, ties to even, and saturates at +-448") {
  CHECK(FloatToFp8E4m3(1.0625f) == 0x38);   // halfway 1 .. 1.125: even mantissa 0
  CHECK(FloatToFp8E4m3(1.1875f) == 0x3a);   // halfway 1.125 .. 1.25: even mantissa 2
  CHECK(FloatToFp8E4m3(1.19f) == 0x3a);
  CHECK(FloatToFp8E4m3(std::ldexp(1.f, -10)) == 0x00);        // half the smallest subnormal: tie to 0
  CHECK(FloatToFp8E4m3(std::ldexp(1.5f, -10)) == 0x01);
  CHECK(FloatToFp8E4m3(15.5f * std::ldexp(1.f, -10)) == 0x08);  // rounds up into the normals
  CHECK(FloatToFp8E4m3(449.f) == 0x7e);
  CHECK(FloatToFp8E4m3(464.f) == 0x7e);
  CHECK(FloatToFp8E4m3(1e30f) == 0x7e);
  CHECK(FloatToFp8E4m3(std::numeric_limits<float>::infinity()) == 0x7e);
  CHECK(FloatToFp8E4m3(-std::numeric_limits<float>::infinity()) == 0xfe);
  CHECK(FloatToFp8E4m3(std::nanf("")) == 0x7f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-12.f, 10.f), sign(-1.f, 1.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::copysign(std::exp2(exponent(rng)), sign(rng));
    REQUIRE_MESSAGE(FloatToFp8E4m3(x) == NearestCode(x), "x = " << x);
  }
}

TEST_CASE("a scaled e4m3 round trip keeps 4 significant bits within the range the scale covers") {
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  for (float scale : {1.f / 448, 0.01f, 3.f / 448, 1.f}) {
    for (int i = 0; i < 5000; ++i) {
      const float x = u(rng);
      const float y = RoundTripFp8E4m3(x, scale);
      if (std::fabs(x) / scale >= 448.f) {
        CHECK(std::fabs(y) == doctest::Approx(448.f * scale));
      } else if (std::fabs(x) / scale >= std::ldexp(1.f, -6)) {
        CHECK(std::fabs(y - x) <= std::ldexp(std::fabs(x), -4) * 1.0001f);  // half a 3-bit mantissa step
      } else {
        CHECK(std::fabs(y - x) <= std::ldexp(scale, -10) * 1.0001f);  // half a subnormal step
      }
    }
  }
}

TEST_CASE("quantising the slots a store wrote equals quantising their whole blocks") {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  const PagedKvLayout layout{2, 2, 4, 16, 2};
  const int blocks = 3;
  std::vector<bf16_bits> pool(blocks * layout.BlockElems());
  for (auto& x : pool) x = FloatToBf16(u(rng));
  const std::vector<float> ks = {0.01f, 0.02f, 0.03f, 0.04f}, vs = {0.05f, 0.06f, 0.07f, 0.08f};
  std::vector<fp8_bits> whole(pool.size()), slots_q(pool.size(), 0xaa);
  QuantizeKvPoolRef(pool.data(), whole.data(), layout, blocks, ks.data(), vs.data());
  std::vector<int32_t> slots(blocks * layout.block_size);
  std::iota(slots.begin(), slots.end(), 0);
  for (int layer = 0; layer < 2; ++layer)
    QuantizeKvSlotsRef(pool.data(), slots_q.data(), layout, layer, slots.data(), static_cast<int32_t>(slots.size()),
                       ks.data() + layer * 2, vs.data() + layer * 2);
  CHECK(whole == slots_q);
  const int64_t off = layout.Offset(2, 1, 1, 1, 3) + 5;  // layer 1, V, head 1: scale vs[3]
  CHECK(whole[off] == FloatToFp8E4m3(Bf16ToFloat(pool[off]) / 0.08f));
  CHECK(layout.BlockBytes() == layout.BlockElems() * 2);
  PagedKvLayout fp8 = layout;
  fp8.elem_bytes = 1;
  CHECK(fp8.BlockBytes() * 2 == layout.BlockBytes());
}

TEST_CASE("paged attention over fp8 pages equals attention over the dequantised bf16 values") {
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const int d = 32, hkv = 2, hq = 8, block = 8, n = 61;
  const PagedKvLayout layout{1, hkv, block, d, 2};
  const int blocks = (n + block - 1) / block;
  std::vector<bf16_bits> pool(blocks * layout.BlockElems()), q(hq * d);
  for (auto& x : pool) x = FloatToBf16(u(rng));
  for (auto& x : q) x = FloatToBf16(u(rng));
  // Powers of two, so that e4m3 * scale is exact in bf16; |x| / scale <= 256: no saturation.
  const std::vector<float> ks = {1.f / 128, 1.f / 64}, vs = {1.f / 32, 1.f / 128};
  std::vector<fp8_bits> pool8(pool.size());
  QuantizeKvPoolRef(pool.data(), pool8.data(), layout, blocks, ks.data(), vs.data());
  std::vector<bf16_bits> dequant(pool.size());
  for (int b = 0; b < blocks; ++b)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < hkv; ++h) {
        const int64_t off = layout.Offset(b, 0, kv, h, 0);
        for (int64_t i = 0; i < layout.TileElems(); ++i)
          dequant[off + i] = FloatToBf16(Fp8E4m3ToFloat(pool8[off + i]) * (kv ? vs : ks)[h]);
      }
  std::vector<int32_t> table(blocks), cu = {0, 1}, lens = {n};
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<float> out8(hq * d), out16(hq * d), exact(hq * d);
  PagedAttentionRefArgs a;
  a.q = q.data();
  a.block_tables = table.data();
  a.cu_q_lens = cu.data();
  a.seq_lens = lens.data();
  a.layout = layout;
  a.num_seqs = 1;
  a.num_q_heads = hq;
  a.max_blocks_per_seq = blocks;
  a.scale = 0.2f;
  a.kv_pool = dequant.data();
  a.out = out16.data();
  PagedAttentionRef(a);
  a.kv_pool = pool.data();
  a.out = exact.data();
  PagedAttentionRef(a);
  a.kv_pool = nullptr;
  a.kv_fp8 = pool8.data();
  a.layout.elem_bytes = 1;
  a.k_scale = ks.data();
  a.v_scale = vs.data();
  a.out = out8.data();
  PagedAttentionRef(a);
  double max_err = 0;
  for (int i = 0; i < hq * d; ++i) {
    CHECK(out8[i] == doctest::Approx(out16[i]).epsilon(1e-6));
    max_err = std::max(max_err, std::fabs(double(out8[i]) - exact[i]));
  }
  // The quantisation moved the output, but by a small fraction of the values' range.
  CHECK(max_err > 0);
  CHECK(max_err < 0.1);
}

}  // namespace
}  // namespace kvfleet::kernels
