// Streamed pulls (TransferService::StartPull, TakeArrivals): the receiver hands a pull's blocks
// to the engine a frame at a time as they pass their checks (TakeArrivals), as views over the
// frames it received, and reads no further replies while config::kArrivalsAhead frames wait
// for the engine. Two services over loopback; waits are bounded, nothing is timed.
#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "tests/worker/transfer/transfer_test_util.h"

namespace kvfleet::transfer {
namespace {

using testing::AwaitPull;
using testing::Blocks;
using testing::Chain;
using testing::Make;
using testing::ServeRun;

// Takes `arrivals` of pull `r` (`id`), checked in order from block `*next`.
void TakeInOrder(PullRequest r, uint64_t id, std::vector<Arrival> arrivals, uint32_t* next) {
  r.transfer_id = id;
  CHECK(arrivals.size() <= config::kArrivalsAhead);
  for (const Arrival& a : arrivals) {
    CHECK(a.transfer_id == id);
    CHECK(a.first == *next);
    CHECK(a.frame != nullptr);
    for (const BlockView& b : a.blocks) {
      CHECK(CheckBlock(r, b, *next, /*verify_checksums=*/true).ok());
      REQUIRE(b.data.size() == 1);
      CHECK(b.data[0].back() == static_cast<std::byte>(*next * 7 + 1));  // Blocks()' bytes
      ++*next;
    }
  }
}

TEST_CASE("a streamed pull hands its blocks over a frame at a time, at most kArrivalsAhead frames untaken") {
  auto holder = Make();
  auto receiver = Make();
  constexpr uint32_t kBlocks = 10;
  const PullRequest r = Chain(kBlocks, uint64_t{8} << 20);  // 8 MiB blocks: one a frame
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", r);
  const IncomingPull pull = AwaitPull(*holder);
  // Every frame and the `done` leave the holder: they wait in the receiver's queue.
  CHECK_FALSE(ServeRun(*holder, pull, Blocks(pull.request, kBlocks)).expired);
  CHECK(holder->Stats().served == 1);
  // The engine takes none: the receiver stops reading at kArrivalsAhead frames, so the pull
  // cannot reach its `done` (a receiver reading on would end it here within the waits).
  std::vector<PullResult> results;
  for (int i = 0; i < 20 && results.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    results = receiver->TakeResults();
  }
  CHECK(results.empty());
  uint32_t next = 0;
  std::vector<Arrival> first = receiver->TakeArrivals();
  CHECK(first.size() == config::kArrivalsAhead);
  TakeInOrder(r, id, std::move(first), &next);
  // Taken a batch at a time, the rest follows, then the result; arrivals taken after the
  // results hold every block of a result just taken.
  for (int i = 0; i < testing::kWaitRounds && results.empty(); ++i) {
    results = receiver->TakeResults();
    TakeInOrder(r, id, receiver->TakeArrivals(), &next);
    if (results.empty()) receiver->WaitForWork(testing::kWaitStep);
  }
  REQUIRE(results.size() == 1);
  const PullResult& res = results[0];
  CHECK(res.outcome == PullOutcome::kOk);
  CHECK(res.streamed_blocks == kBlocks);
  CHECK(res.bytes == uint64_t{kBlocks} * (uint64_t{8} << 20));
  CHECK(next == kBlocks);
  CHECK(receiver->Stats().pulls.at(holder->endpoint()).blocks == kBlocks);
}

TEST_CASE("a streamed pull whose block is corrupted ends bad-checksum, with no arrival of that frame") {
  TransferOptions o;
  o.test_corrupt_served_data = true;
  auto holder = Make(o);
  auto receiver = Make();
  const PullRequest r = Chain(3);
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", r);
  const IncomingPull pull = AwaitPull(*holder);
  ServeRun(*holder, pull, Blocks(pull.request, 3));
  const testing::Pulled res = testing::AwaitPulled(*receiver, id);
  CHECK(res.result.outcome == PullOutcome::kBadChecksum);
  CHECK(res.result.streamed_blocks == 0);
  CHECK(res.blocks.empty());
}

}  // namespace
}  // namespace kvfleet::transfer
