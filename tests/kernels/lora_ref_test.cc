// The LoRA kernels' CPU reference (kernels/lora_ref.h) against a dense computation per
// target, and the row groups the kernels walk: every row with an adapter exactly once, tiles
// of one slot, rows without an adapter untouched.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/lora_ref.h"

namespace kvfleet::kernels {
namespace {

// Small integers: every product and sum below is exact in fp32, and x, A, B exact in bf16.
std::vector<bf16_bits> SmallInts(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-3, 3);
  std::vector<bf16_bits> v(n);
  for (auto& x : v) x = FloatToBf16(static_cast<float>(d(rng)));
  return v;
}

TEST_CASE("LoRA row groups hold every row with a slot once, in tiles of one slot and at most tile_rows rows") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int32_t T = 1 + static_cast<int32_t>(rng() % 70), slots = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t tile_rows = 1 + static_cast<int32_t>(rng() % kLoraMaxTileRows);
    std::vector<int32_t> row_slot(T);
    for (auto& s : row_slot) s = static_cast<int32_t>(rng() % (slots + 1)) - 1;
    const LoraGroupsHost g = GroupLoraRows(row_slot, tile_rows);
    REQUIRE(g.tile_begin.size() == g.tile_slot.size() + 1);
    REQUIRE(g.tile_begin.front() == 0);
    REQUIRE(g.tile_begin.back() == static_cast<int32_t>(g.rows.size()));
    std::set<int32_t> seen;
    for (int32_t i = 0; i < g.num_tiles(); ++i) {
      const int32_t n = g.tile_begin[i + 1] - g.tile_begin[i];
      CHECK(n >= 1);
      CHECK(n <= tile_rows);
      for (int32_t k = g.tile_begin[i]; k < g.tile_begin[i + 1]; ++k) {
        CHECK(row_slot[g.rows[k]] == g.tile_slot[i]);
        CHECK(seen.insert(g.rows[k]).second);
      }
      if (i > 0) CHECK(g.tile_slot[i] >= g.tile_slot[i - 1]);
    }
    int32_t with_slot = 0;
    for (int32_t s : row_slot) with_slot += s >= 0 ? 1 : 0;
    CHECK(static_cast<int32_t>(seen.size()) == with_slot);
  }
}

TEST_CASE("LoRA tiles grow with the rows of a step, from one row to kLoraMaxTileRows") {
  CHECK(LoraTileRowsFor(1) == 1);
  int32_t prev = 1;
  for (int64_t n = 1; n < 5000; ++n) {
    const int32_t t = LoraTileRowsFor(n);
    CHECK(t >= prev);
    CHECK(t <= kLoraMaxTileRows);
    prev = t;
  }
  CHECK(prev == kLoraMaxTileRows);
}

// A fused [q|k|v]-like output of three segments with their own A and B, two slots of ranks 8
// and 3 (rows past the rank hold NaN: never read), rows with slot -1, and a column range
// inside a wider y.
TEST_CASE("LoRA shrink + expand reference: y += scaling · (x·Aᵀ)·Bᵀ per segment, only where a row has a slot") {
  std::mt19937 rng(3);
  const int32_t T = 7, in = 16, R = 8, segs = 3, slots = 2;
  const int32_t seg_end[3] = {12, 16, 20};  // q 12 columns, k 4, v 4
  const int32_t out = seg_end[2], col0 = 5, y_stride = 30;
  const std::vector<int32_t> rank = {8, 3};
  const std::vector<float> scaling = {0.5f, 2.0f};
  const std::vector<int32_t> row_slot = {1, -1, 0, 0, -1, 1, 0};
  std::vector<bf16_bits> x = SmallInts(size_t{T} * in, rng), a = SmallInts(size_t{slots} * segs * R * in, rng);
  std::vector<bf16_bits> b = SmallInts(size_t{slots} * out * R, rng), y = SmallInts(size_t{T} * y_stride, rng);
  const bf16_bits nan = FloatToBf16(NAN);
  for (int32_t s = 0; s < slots; ++s) {
    for (int32_t rr = 0; rr < segs * R; ++rr) {
      if (rr % R < rank[s]) continue;
      for (int32_t c = 0; c < in; ++c) a[(size_t(s) * segs * R + rr) * in + c] = nan;
    }
    for (int32_t j = 0; j < out; ++j) {
      for (int32_t r = rank[s]; r < R; ++r) b[(size_t(s) * out + j) * R + r] = nan;
    }
  }
  const std::vector<bf16_bits> y0 = y;
  std::vector<float> t(size_t{T} * segs * R, NAN);
  LoraShrinkRef(x.data(), a.data(), rank.data(), row_slot, t.data(), in, R, segs);
  LoraExpandRef(t.data(), b.data(), rank.data(), scaling.data(), row_slot, y.data(), y_stride, col0, out, R, segs,
                seg_end);
  for (int32_t row = 0; row < T; ++row) {
    const int32_t s = row_slot[row];
    for (int32_t c = 0; c < y_stride; ++c) {
      INFO("row " << row << " column " << c);
      const size_t i = size_t(row) * y_stride + c;
      if (s < 0 || c < col0 || c >= col0 + out) {
        CHECK(y[i] == y0[i]);  // untouched, bit for bit
        continue;
      }
      const int32_t j = c - col0, seg = j < seg_end[0] ? 0 : j < seg_end[1] ? 1 : 2;
      double delta = 0;
      for (int32_t r = 0; r < rank[s]; ++r) {
        double tr = 0;
        for (int32_t k = 0; k < in; ++k) {
          tr += double(Bf16ToFloat(x[size_t(row) * in + k])) *
                Bf16ToFloat(a[(size_t(s) * segs * R + seg * R + r) * in + k]);
        }
        delta += tr * Bf16ToFloat(b[(size_t(s) * out + j) * R + r]);
      }
      CHECK(Bf16ToFloat(y[i]) == RoundBf16(static_cast<float>(Bf16ToFloat(y0[i]) + scaling[s] * delta)));
    }
  }
}

TEST_CASE("LoRA shrink reference keeps t in fp32, as PEFT computes an adapter over a bf16 model") {
  const std::vector<bf16_bits> x = {FloatToBf16(1.0f), FloatToBf16(1.0f / 256), 0, 0, 0, 0, 0, 0};
  std::vector<bf16_bits> a(8, 0);
  a[0] = FloatToBf16(1.0f);
  a[1] = FloatToBf16(1.0f);
  const int32_t rank = 1;
  const std::vector<int32_t> row_slot = {0};
  std::vector<float> t(1);
  LoraShrinkRef(x.data(), a.data(), &rank, row_slot, t.data(), 8, 1, 1);
  CHECK(t[0] == 1.0f + 1.0f / 256);  // not a bf16 (it would round to 1)
}

}  // namespace
}  // namespace kvfleet::kernels
