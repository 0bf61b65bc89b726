// The decode's split-K partition chooser (kernels/decode_partition.h): host code, tested
// without a GPU; tests/gpu/paged_attention_test.cc runs the decode at the partitions it picks.
#include "kernels/decode_partition.h"

#include <doctest/doctest.h>

#include <initializer_list>

namespace kvfleet::kernels {
namespace {

TEST_CASE("the partition chooser: waves for full batches, one wave of long partitions for small grids") {
  // 132 SMs (an H100 or H200), 32 query heads over 8 KV heads: 8 blocks per partition and sequence.
  auto choose = [](int seqs, int ctx) { return PagedDecodeChoosePartition(seqs, 32, 8, ctx, 132); };
  // Full batches: four waves or more, at most 32 partitions per sequence.
  CHECK(choose(64, 4096) == 1024);
  CHECK(choose(8, 32768) == 1024);
  CHECK(choose(32, 2048) == 256);
  CHECK(choose(256, 1024) == 2048);
  // Small grids: one wave, at least half full, of the longest partitions.
  CHECK(choose(1, 32768) == 1024);  // 256 blocks of 1024 tokens, not 1024 of 256
  CHECK(choose(1, 65536) == 2048);  // 32 partitions to merge, not 256
  CHECK(choose(2, 32768) == 2048);
  CHECK(choose(1, 16384) == 512);
  CHECK(choose(8, 4096) == 1024);
  // Neither: the waves without the bound on partitions.
  CHECK(choose(4, 32768) == 512);
  // Too few blocks: parallelism first.
  CHECK(choose(1, 4096) == 128);
  CHECK(choose(1, 512) == 128);
  for (int seqs : {1, 2, 3, 7, 16, 64, 128}) {
    for (int ctx : {1, 100, 1000, 5000, 40000, 131072}) {
      const int p = choose(seqs, ctx);
      CAPTURE(seqs);
      CAPTURE(ctx);
      CHECK(p % 128 == 0);
      CHECK(p >= 128);
      CHECK(p <= 2048);
    }
  }
}

}  // namespace
}  // namespace kvfleet::kernels
