// PredictedIndex: the router's own decisions, with a TTL.
#include "router/routing/predicted_index.h"

#include <thread>

#include <doctest/doctest.h>

namespace kvfleet::router {

TEST_CASE("predicted blocks match as leading prefixes per worker") {
  ManualClock clock;
  PredictedIndex index(&clock);
  std::vector<BlockHash> a = {1, 2, 3, 4};
  index.InsertPredicted(7, a, kNsPerSec);
  index.InsertPredicted(8, std::span<const BlockHash>(a).first(2), kNsPerSec);
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  REQUIRE(out.size() == 2);
  for (auto& m : out) CHECK(m.device_blocks == (m.worker == 7 ? 4u : 2u));
  // A worker that lacks block 0 matches nothing even if it holds later blocks.
  index.InsertPredicted(9, std::span<const BlockHash>(a).subspan(1), kNsPerSec);
  out.clear();
  index.FindMatches(a, &out);
  CHECK(out.size() == 2);
}

TEST_CASE("predicted entries expire after their TTL and go with their worker") {
  ManualClock clock;
  PredictedIndex index(&clock);
  std::vector<BlockHash> a = {1, 2};
  index.InsertPredicted(1, a, 2 * kNsPerSec);
  index.InsertPredicted(2, a, 2 * kNsPerSec);
  clock.AdvanceMs(1000);
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  CHECK(out.size() == 2);
  index.RemoveWorker(2);
  CHECK(index.entries() == 2);
  clock.AdvanceMs(1001 + 1);
  out.clear();
  index.FindMatches(a, &out);
  CHECK(out.empty());
}

TEST_CASE("a full predicted index sweeps expired entries before refusing new ones") {
  ManualClock clock;
  PredictedIndex index(&clock, 4);
  std::vector<BlockHash> a = {1, 2, 3, 4};
  index.InsertPredicted(1, a, kNsPerSec);
  index.InsertPredicted(2, a, kNsPerSec);  // over the cap: not added
  CHECK(index.entries() == 4);
  clock.AdvanceMs(2000);
  index.InsertPredicted(2, a, kNsPerSec);  // the sweep makes room
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].worker == 2);
}

TEST_CASE("expired entries are dropped by later inserts, without reaching the cap") {
  ManualClock clock;
  PredictedIndex index(&clock);
  std::vector<BlockHash> a = {1, 2, 3}, b = {4, 5};
  index.InsertPredicted(1, a, kNsPerSec);
  CHECK(index.entries() == 3);
  clock.AdvanceMs(1001);
  index.InsertPredicted(1, b, kNsPerSec);
  CHECK(index.entries() == 2);  // a's three went, b's two came
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  CHECK(out.empty());
}

TEST_CASE("a refreshed prediction outlives its first TTL") {
  ManualClock clock;
  PredictedIndex index(&clock);
  std::vector<BlockHash> a = {1, 2};
  index.InsertPredicted(3, a, kNsPerSec);
  clock.AdvanceMs(600);
  index.InsertPredicted(3, a, kNsPerSec);  // now expires at 1.6 s
  CHECK(index.entries() == 2);
  clock.AdvanceMs(600);                    // 1.2 s: the first records are stale, not the pair
  index.InsertPredicted(4, std::vector<BlockHash>{9}, kNsPerSec);
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].device_blocks == 2);
  clock.AdvanceMs(500);                    // 1.7 s: gone
  index.InsertPredicted(4, std::vector<BlockHash>{9}, kNsPerSec);
  CHECK(index.entries() == 1);
  out.clear();
  index.FindMatches(a, &out);
  CHECK(out.empty());
}

TEST_CASE("expired predictions are swept as inserts go on: the index holds what the TTL keeps alive") {
  ManualClock clock;
  PredictedIndex index(&clock);
  // A steady stream of prompts never seen again: 1,000 new hashes a second, 1 s TTL.
  BlockHash next = 1;
  for (int second = 0; second < 100; ++second) {
    std::vector<BlockHash> hashes(1000);
    for (auto& h : hashes) h = next++;
    index.InsertPredicted(1, hashes, kNsPerSec);
    clock.AdvanceMs(1000);
  }
  // 100,000 predicted in all; about 1,000 alive at a time.
  CHECK(index.entries() <= 2000);
}

TEST_CASE("concurrent inserts and lookups are safe") {
  SystemClock clock;
  PredictedIndex index(&clock);
  std::vector<std::thread> threads;
  for (WorkerId w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::vector<PrefixMatch> out;
      for (BlockHash i = 0; i < 500; ++i) {
        std::vector<BlockHash> h = {i, i + 1, i + 2};
        index.InsertPredicted(w, h, kNsPerSec);
        out.clear();
        index.FindMatches(h, &out);
        CHECK(!out.empty());
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace kvfleet::router
