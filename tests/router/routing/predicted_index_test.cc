// PredictedIndex: the router's own decisions, with a TTL and a per-worker LRU of its capacity.
#include "router/routing/predicted_index.h"

#include <random>
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

TEST_CASE("a worker of known capacity forgets its least recent blocks, as its LRU would") {
  ManualClock clock;
  PredictedIndex index(&clock);
  index.SetCapacity(1, 6);
  std::vector<BlockHash> a = {1, 2, 3}, b = {4, 5, 6}, c = {7, 8};
  index.InsertPredicted(1, a, 120 * kNsPerSec);
  index.InsertPredicted(1, b, 120 * kNsPerSec);
  index.InsertPredicted(1, a, 120 * kNsPerSec);  // a is reused: now more recent than b
  index.InsertPredicted(1, c, 120 * kNsPerSec);  // 8 blocks > 6: b's two least recent go
  index.CheckInvariants();
  CHECK(index.entries(1) == 6);
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].device_blocks == 3);
  // The tail of a prompt goes before its head (block 0 is the most recent of each insert):
  // b keeps its first block only.
  index.FindMatches(b, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].device_blocks == 1);
  // Another worker's capacity is its own.
  index.InsertPredicted(2, b, 120 * kNsPerSec);
  CHECK(index.entries(2) == 3);
  CHECK(index.entries(1) == 6);
  index.CheckInvariants();
}

TEST_CASE("with a capacity, predictions outlive the event-gap TTL for as long as the worker keeps them") {
  ManualClock clock;
  PredictedIndex index(&clock);
  index.SetCapacity(3, 1000);
  std::vector<BlockHash> a = {1, 2, 3, 4};
  index.InsertPredicted(3, a, 120 * kNsPerSec);
  clock.AdvanceMs(60'000);  // a minute without reuse and nothing else routed there
  std::vector<PrefixMatch> out;
  index.FindMatches(a, &out);
  REQUIRE(out.size() == 1);
  CHECK(out[0].device_blocks == 4);
  clock.AdvanceMs(60'001);  // past the TTL, the upper bound
  index.InsertPredicted(3, std::vector<BlockHash>{9}, 120 * kNsPerSec);
  index.FindMatches(a, &out);
  CHECK(out.empty());
  CHECK(index.entries() == 1);
  index.CheckInvariants();
}

TEST_CASE("random inserts, expiries, capacity changes and removals keep the LRU model consistent") {
  ManualClock clock;
  PredictedIndex index(&clock, 5000);
  std::mt19937_64 rng(7);
  for (int op = 0; op < 3000; ++op) {
    const WorkerId w = static_cast<WorkerId>(rng() % 4);
    switch (rng() % 10) {
      case 0: index.SetCapacity(w, rng() % 40); break;
      case 1: index.RemoveWorker(w); break;
      case 2: clock.AdvanceMs(static_cast<int64_t>(rng() % 500)); break;
      default: {
        std::vector<BlockHash> h(1 + rng() % 12);
        const BlockHash base = rng() % 64;  // overlapping prompts
        for (size_t i = 0; i < h.size(); ++i) h[i] = base * 100 + i;
        index.InsertPredicted(w, h, static_cast<DurationNs>(1 + rng() % 3) * kNsPerSec);
      }
    }
    if (op % 100 == 0) index.CheckInvariants();
  }
  index.CheckInvariants();
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
