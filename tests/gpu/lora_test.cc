// The LoRA shrink and expand kernels (kernels/lora.h) against their CPU reference: slots of
// ranks 8, 16 and 64 mixed in one step with rows that have no adapter (-1), one to three
// segments (a fused [q|k|v] output with its own B per target), a column range inside a
// wider output, tiles of 1 to 16 rows, decode-sized and prefill-sized steps, `in` split across
// blocks (the last block's ordered sum, the counters left zero).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/lora.h"
#include "kernels/lora_ref.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

struct Case {
  int32_t tokens, in, max_rank, segments;
  std::vector<int32_t> seg_cols;  // columns of each segment
  std::vector<int32_t> ranks;     // one per slot
  int32_t tile_rows;              // 0: LoraTileRowsFor
  int32_t col0, extra_cols;       // y: [tokens][col0 + out + extra_cols]
  int32_t splits = 0;             // slices of in; 0: LoraShrinkSplits
};

void Run(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int32_t slots = static_cast<int32_t>(c.ranks.size());
  const int32_t width = c.segments * c.max_rank;
  int32_t out = 0;
  int32_t seg_end[kLoraMaxSegments] = {0, 0, 0};
  for (int32_t s = 0; s < c.segments; ++s) seg_end[s] = out += c.seg_cols[s];
  const int32_t y_stride = c.col0 + out + c.extra_cols;
  // Rows: runs of one slot (prefill chunks) and single rows (decode), -1 among them.
  std::vector<int32_t> row_slot(c.tokens);
  for (int32_t r = 0; r < c.tokens;) {
    const int32_t run = 1 + static_cast<int32_t>(rng() % 40);
    const int32_t s = static_cast<int32_t>(rng() % (slots + 1)) - 1;
    for (int32_t i = 0; i < run && r < c.tokens; ++i) row_slot[r++] = s;
  }
  if (std::count(row_slot.begin(), row_slot.end(), -1) == c.tokens) row_slot[0] = 0;
  const auto x = gputest::RandomBf16(size_t(c.tokens) * c.in, rng);
  const auto a = gputest::RandomBf16(size_t(slots) * width * c.in, rng, -0.1f, 0.1f);
  const auto b = gputest::RandomBf16(size_t(slots) * out * c.max_rank, rng, -0.1f, 0.1f);
  const auto y0 = gputest::RandomBf16(size_t(c.tokens) * y_stride, rng);
  std::vector<float> scaling(slots);
  for (int32_t s = 0; s < slots; ++s) scaling[s] = 0.5f + static_cast<float>(s);

  const LoraGroupsHost g = GroupLoraRows(row_slot, c.tile_rows > 0 ? c.tile_rows : LoraTileRowsFor(c.tokens));
  DeviceBuffer<int32_t> rows_d(g.rows), begin_d(g.tile_begin), slot_d(g.tile_slot), rank_d(c.ranks);
  DeviceBuffer<float> scaling_d(scaling);
  DeviceBuffer<bf16_bits> x_d(x), a_d(a), b_d(b), y_d(y0);
  const int32_t splits = c.splits > 0 ? c.splits : LoraShrinkSplits(g.num_tiles(), c.in, width);
  DeviceBuffer<float> t_d(size_t(g.rows.size()) * splits * width);
  t_d.Poison();
  DeviceBuffer<int32_t> counters_d(std::vector<int32_t>(kLoraShrinkTargetBlocks, 0));
  LoraGroups groups;
  groups.rows = rows_d.get();
  groups.tile_begin = begin_d.get();
  groups.tile_slot = slot_d.get();
  groups.num_tiles = g.num_tiles();
  LoraShrinkParams sp;
  sp.x = x_d.as<__nv_bfloat16>();
  sp.a = a_d.as<__nv_bfloat16>();
  sp.slot_rank = rank_d.get();
  sp.t = t_d.get();
  sp.counters = counters_d.get();
  sp.in = c.in;
  sp.max_rank = c.max_rank;
  sp.segments = c.segments;
  sp.splits = splits;
  sp.groups = groups;
  // Twice: the split counters must be back at zero for the next launch (a graph's replay).
  KVF_CUDA_OK(LaunchLoraShrink(sp, nullptr));
  KVF_CUDA_OK(LaunchLoraShrink(sp, nullptr));
  LoraExpandParams ep;
  ep.t = t_d.get();
  ep.b = b_d.as<__nv_bfloat16>();
  ep.slot_rank = rank_d.get();
  ep.slot_scaling = scaling_d.get();
  ep.y = y_d.as<__nv_bfloat16>();
  ep.y_stride = y_stride;
  ep.col0 = c.col0;
  ep.out = out;
  ep.max_rank = c.max_rank;
  ep.segments = c.segments;
  ep.splits = splits;
  for (int32_t s = 0; s < kLoraMaxSegments; ++s) ep.seg_end[s] = seg_end[s];
  ep.groups = groups;
  KVF_CUDA_OK(LaunchLoraExpand(ep, nullptr));
  KVF_CUDA_OK(cudaDeviceSynchronize());

  std::vector<float> t_ref(size_t(c.tokens) * width, 0.f);
  LoraShrinkRef(x.data(), a.data(), c.ranks.data(), row_slot, t_ref.data(), c.in, c.max_rank, c.segments);
  std::vector<bf16_bits> y_ref = y0;
  LoraExpandRef(t_ref.data(), b.data(), c.ranks.data(), scaling.data(), row_slot, y_ref.data(), y_stride, c.col0, out,
                c.max_rank, c.segments, seg_end);
  // t of each grouped row: split 0's place holds the sum of the splits.
  const std::vector<float> parts = t_d.Download();
  std::vector<float> t_gpu(size_t(c.tokens) * width, 0.f);
  for (size_t i = 0; i < g.rows.size(); ++i) {
    for (int32_t rr = 0; rr < width; ++rr) t_gpu[size_t(g.rows[i]) * width + rr] = parts[i * splits * width + rr];
  }
  const std::vector<int32_t> counters = counters_d.Download();
  CHECK(std::count(counters.begin(), counters.end(), 0) == kLoraShrinkTargetBlocks);
  const std::vector<bf16_bits> y_gpu = y_d.Download();
  int64_t t_checked = 0, t_bad = 0, y_bad = 0, untouched_bad = 0;
  for (int32_t row = 0; row < c.tokens; ++row) {
    const int32_t s = row_slot[row];
    if (s >= 0) {
      for (int32_t rr = 0; rr < width; ++rr) {
        if (rr % c.max_rank >= c.ranks[s]) continue;
        const float ref = t_ref[size_t(row) * width + rr], got = t_gpu[size_t(row) * width + rr];
        ++t_checked;
        // fp32 sums in another order: a few ulps apart.
        if (!(std::fabs(got - ref) <= std::fabs(ref) * 1e-4f + 1e-4f)) ++t_bad;
      }
    }
    for (int32_t col = 0; col < y_stride; ++col) {
      const size_t i = size_t(row) * y_stride + col;
      if (s < 0 || col < c.col0 || col >= c.col0 + out) {
        untouched_bad += y_gpu[i] != y0[i] ? 1 : 0;
        continue;
      }
      const float ref = Bf16ToFloat(y_ref[i]), got = Bf16ToFloat(y_gpu[i]);
      if (!(std::fabs(got - ref) <= std::fabs(ref) * (1.f / 64) + 2e-3f)) ++y_bad;
    }
  }
  INFO("tokens " << c.tokens << " in " << c.in << " R " << c.max_rank << " segments " << c.segments << " tiles "
                 << g.num_tiles() << " splits " << splits);
  CHECK(t_checked > 0);
  CHECK(t_bad == 0);
  CHECK(y_bad == 0);
  CHECK(untouched_bad == 0);
}

TEST_CASE("LoRA shrink + expand equal the CPU reference: mixed slots and ranks, -1 rows, fused segments") {
  // Decode-sized: one row per sequence, few rows per slot.
  Run({1, 64, 64, 1, {64}, {8}, 0, 0, 0}, 1);
  Run({64, 256, 64, 3, {128, 32, 32}, {8, 16, 64}, 0, 0, 0}, 2);
  Run({64, 256, 16, 2, {200, 200}, {16, 8, 16, 16, 8, 16, 16, 8}, 0, 0, 0}, 3);
  // Prefill-sized: runs of one slot, full tiles and one-row tiles.
  for (int32_t tile : {0, 1, 7, 16}) Run({300, 512, 64, 3, {256, 64, 64}, {64, 8, 16}, tile, 0, 0}, 4 + tile);
  // A column range of a wider output: [gate|up] written at col0 of y, the rest untouched.
  Run({40, 128, 32, 2, {96, 96}, {32, 8}, 0, 24, 40}, 30);
  // The down projection's shape: a wide input, a narrow output.
  Run({17, 1408, 16, 1, {128}, {16, 16}, 0, 0, 0}, 31);
  // `in` cut into slices across blocks: the decode default (many splits for few tiles), an
  // uneven cut (chunks not a multiple of the splits) and the most splits `in` allows.
  Run({64, 4096, 16, 1, {256}, {16, 8}, 0, 0, 0}, 32);
  CHECK(LoraShrinkSplits(GroupLoraRows(std::vector<int32_t>(64, 0), LoraTileRowsFor(64)).num_tiles(), 14336, 16) > 1);
  // A rank of 8 inside R = 16: half of the last rank fragment is padding.
  Run({48, 512, 16, 3, {64, 32, 32}, {8, 16}, 0, 0, 0}, 35);
  Run({24, 2056, 32, 2, {64, 64}, {32, 8}, 0, 0, 0, 5}, 33);
  Run({9, 1024, 64, 3, {64, 32, 32}, {64, 16}, 16, 0, 0, 4}, 34);
}

TEST_CASE("the shrink's splits fill the device for decode, stay one for prefill, and fit the scratch") {
  CHECK(LoraShrinkSplits(16, 14336, 16) * 16 >= kLoraShrinkTargetBlocks / 2);
  CHECK(LoraShrinkSplits(512, 4096, 48) == 1);  // 8192 rows: enough tiles already
  CHECK(LoraShrinkSplits(1, 64, 64) == 1);      // in too short to cut
  CHECK(LoraShrinkSplits(1, 4096, 8) == 4096 / (kLoraSplitChunk * kLoraMinSplitRounds));
  for (int32_t tokens : {1, 7, 64, 300, 2048}) {
    for (int32_t width : {8, 16, 48, 192}) {
      for (int32_t in : {256, 4096, 14336}) {
        const LoraGroupsHost g = GroupLoraRows(std::vector<int32_t>(tokens, 0), LoraTileRowsFor(tokens));
        const LoraGroupsHost one = GroupLoraRows(std::vector<int32_t>(tokens, 0), 1);
        for (const LoraGroupsHost* h : {&g, &one}) {
          const int64_t need = int64_t(h->rows.size()) * LoraShrinkSplits(h->num_tiles(), in, width) * width;
          CHECK(need <= LoraShrinkScratchFloats(tokens, width));
        }
      }
    }
  }
}

TEST_CASE("LoRA launches refuse shapes they cannot take") {
  LoraShrinkParams sp;
  sp.groups.num_tiles = 1;
  sp.in = 12;  // not a multiple of 8
  sp.max_rank = 8;
  CHECK(LaunchLoraShrink(sp, nullptr) == cudaErrorInvalidValue);
  sp.in = 4096;
  sp.splits = 2;  // split without counters to order the final sum
  CHECK(LaunchLoraShrink(sp, nullptr) == cudaErrorInvalidValue);
  LoraExpandParams ep;
  ep.groups.num_tiles = 1;
  ep.out = 16;
  ep.y_stride = 16;
  ep.max_rank = 12;  // not a multiple of 8
  ep.seg_end[0] = 16;
  CHECK(LaunchLoraExpand(ep, nullptr) == cudaErrorInvalidValue);
  ep.max_rank = 8;
  ep.col0 = 4;  // columns past the stride
  CHECK(LaunchLoraExpand(ep, nullptr) == cudaErrorInvalidValue);
  ep.col0 = 0;
  ep.out = 12;  // a segment not a multiple of 8 columns
  ep.seg_end[0] = 12;
  CHECK(LaunchLoraExpand(ep, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvfleet::kernels
