#include "worker/kv/block_allocator.h"

#include <doctest/doctest.h>

namespace kvfleet::kv {
namespace {

TEST_CASE("a fresh allocator hands out one contiguous run") {
  BlockAllocator a(16);
  std::vector<BlockId> got;
  a.Allocate(5, &got);
  CHECK(got == std::vector<BlockId>{0, 1, 2, 3, 4});
  CHECK(a.num_free() == 11);
  CHECK(a.CheckInvariants().ok());
}

TEST_CASE("freeing a sequence last block first rebuilds a contiguous run") {
  BlockAllocator a(8);
  std::vector<BlockId> all;
  a.Allocate(8, &all);
  for (int i = 7; i >= 2; --i) a.Free(all[i]);
  std::vector<BlockId> got;
  a.Allocate(6, &got);
  CHECK(got == std::vector<BlockId>{2, 3, 4, 5, 6, 7});
  CHECK(a.CheckInvariants().ok());
}

TEST_CASE("a single block comes from scattered free blocks, keeping the run for new sequences") {
  BlockAllocator a(8);
  std::vector<BlockId> all;
  a.Allocate(8, &all);
  a.Free(7);
  a.Free(6);  // run [6, 8)
  a.Free(2);  // scattered
  CHECK(a.AllocateOne() == 2);
  std::vector<BlockId> got;
  a.Allocate(2, &got);
  CHECK(got == std::vector<BlockId>{6, 7});
  CHECK(a.num_free() == 0);
  CHECK(a.CheckInvariants().ok());
}

TEST_CASE("every block can be allocated and freed again") {
  BlockAllocator a(64);
  std::vector<BlockId> got;
  for (int round = 0; round < 3; ++round) {
    got.clear();
    a.Allocate(64, &got);
    CHECK(a.num_free() == 0);
    for (size_t i = 0; i < got.size(); i += 2) a.Free(got[i]);
    for (size_t i = 1; i < got.size(); i += 2) a.Free(got[i]);
    CHECK(a.num_free() == 64);
    CHECK(a.CheckInvariants().ok());
  }
}

TEST_CASE("AllocateAfter takes the next block from the run or the scattered ones, else any") {
  BlockAllocator a(16);
  std::vector<BlockId> got;
  a.Allocate(4, &got);                 // 0..3; the run is [4, 16)
  CHECK(a.AllocateAfter(3) == 4);      // the run's first block
  a.Free(1);                           // scattered
  CHECK(a.AllocateAfter(0) == 1);      // a scattered next block
  CHECK(a.AllocateAfter(9) == 5);      // 10 is inside the run: the run's first block instead
  CHECK(a.AllocateAfter(15) == 6);     // past the end
  CHECK(a.num_free() == 9);
  CHECK(a.CheckInvariants().ok());
}

}  // namespace
}  // namespace kvfleet::kv
