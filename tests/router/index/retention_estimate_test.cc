// RetentionEstimate: per worker and priority, blocks held and their eviction rate, and the
// share of a matched prefix expected to survive a wait.
#include "router/index/retention_estimate.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::router {
namespace {

BlockOp Store(BlockHash h, uint8_t priority, kv::Tier tier = kv::Tier::kDevice) {
  return BlockOp{h, BlockOp::kStore, tier, priority};
}
BlockOp Remove(BlockHash h, kv::Tier tier = kv::Tier::kDevice) { return BlockOp{h, BlockOp::kRemove, tier}; }

// A worker under KV pressure: `held` blocks of priority 35 stay cached, and every 100 ms ten
// are evicted and ten new ones stored (100 evictions/s), for `seconds`.
void Churn(RetentionEstimate* r, ManualClock* clock, WorkerId w, int held, int seconds, BlockHash* next) {
  std::vector<BlockOp> ops;
  for (int i = 0; i < held; ++i) ops.push_back(Store((*next)++, kv::kDefaultPriority));
  r->Apply(w, ops);
  BlockHash oldest = *next - held;
  for (int tick = 0; tick < seconds * 10; ++tick) {
    clock->AdvanceMs(100);
    ops.clear();
    for (int i = 0; i < 10; ++i) ops.push_back(Remove(oldest++));
    for (int i = 0; i < 10; ++i) ops.push_back(Store((*next)++, kv::kDefaultPriority));
    r->Apply(w, ops);
  }
}

}  // namespace

TEST_CASE("the eviction rate settles at the rate blocks leave the device, per priority") {
  ManualClock clock;
  RetentionEstimate r(&clock);
  r.Enable();
  BlockHash next = 1;
  Churn(&r, &clock, 0, 200, 60, &next);
  CHECK(r.Held(0, kv::kDefaultPriority) == 200);
  CHECK(r.Held(0) == 200);
  CHECK(r.EvictionRate(0, kv::kDefaultPriority) == doctest::Approx(100).epsilon(0.05));
  CHECK(r.EvictionRate(0, 100) == 0);
  // 200 blocks turning over at 100/s: a block lives about 2 s.
  CHECK(r.Lifetime(0, kv::kDefaultPriority) == doctest::Approx(2.0).epsilon(0.05));
  CHECK(std::isinf(r.Lifetime(0, 100)));
  // Without evictions the rate decays: a window later it is down by e.
  const double before = r.EvictionRate(0, kv::kDefaultPriority);
  clock.AdvanceMs(static_cast<int64_t>(config::kEvictionRateWindowSeconds * 1000));
  CHECK(r.EvictionRate(0, kv::kDefaultPriority) == doctest::Approx(before / std::exp(1.0)));
  r.CheckInvariants();
}

TEST_CASE("a block with priority 100 outlives the churn of priority 35 blocks: its hit is not discounted") {
  ManualClock clock;
  RetentionEstimate r(&clock);
  r.Enable();
  r.Apply(0, std::vector<BlockOp>{Store(1'000'000, 100), Store(1'000'001, 100)});  // the system prompt
  BlockHash next = 1;
  Churn(&r, &clock, 0, 200, 30, &next);
  CHECK(r.Priority(0, 1'000'000) == 100);
  CHECK(r.Priority(0, 1) == kv::kDefaultPriority);  // evicted long ago: untracked, the default
  // A prefix of the two retained blocks then two recent default ones, after a 1 s wait with
  // no spare blocks: the retained blocks stay (1 each), the default ones survive
  // exp(-1 / 2) each.
  std::vector<BlockHash> prefix = {1'000'000, 1'000'001, next - 1, next - 2};
  const double s = std::exp(-1.0 / r.Lifetime(0, kv::kDefaultPriority));
  CHECK(r.ExpectedSurvivingBlocks(0, prefix, 1.0, 0, 50) == doctest::Approx(2 + s + s));
  // The same prefix at default priority: usable only as far as its first lost block.
  std::vector<BlockHash> plain = {next - 1, next - 2, next - 3, next - 4};
  CHECK(r.ExpectedSurvivingBlocks(0, plain, 1.0, 0, 50) == doctest::Approx(4 * s));
  CHECK(r.ExpectedSurvivingBlocks(0, plain, 1.0, 0, 50) < r.ExpectedSurvivingBlocks(0, prefix, 1.0, 0, 50));
}

TEST_CASE("nothing is discounted without a wait, without evictions, or with spare blocks for the wait") {
  ManualClock clock;
  RetentionEstimate r(&clock);
  r.Enable();
  BlockHash next = 1;
  Churn(&r, &clock, 0, 100, 10, &next);
  std::vector<BlockHash> prefix = {next - 1, next - 2, next - 3};
  CHECK(r.ExpectedSurvivingBlocks(0, prefix, 0, 0, 10) == 3);     // runs at once
  CHECK(r.ExpectedSurvivingBlocks(0, prefix, 2.0, 64, 10) == 3);  // 64 unused blocks, 10 needed
  CHECK(r.ExpectedSurvivingBlocks(0, prefix, 2.0, 0, 10) < 3);
  CHECK(r.ExpectedSurvivingBlocks(1, prefix, 2.0, 0, 10) == 3);   // a worker with no events
  // A worker that evicts nothing (no pressure) keeps every block however long the wait.
  r.Apply(2, std::vector<BlockOp>{Store(7, 35), Store(8, 35)});
  CHECK(r.ExpectedSurvivingBlocks(2, std::vector<BlockHash>{7, 8}, 60.0, 0, 1000) == 2);
}

TEST_CASE("priority updates, offloads and onboards move blocks between the counts") {
  ManualClock clock;
  RetentionEstimate r(&clock);
  r.Enable();
  r.Apply(0, std::vector<BlockOp>{Store(1, 100), Store(2, 35), Store(3, 35), Store(4, 35, kv::Tier::kHost)});
  CHECK(r.Held(0) == 3);  // the host block is not on the device
  // The retention duration passed: block 1 falls back to the default priority.
  r.Apply(0, std::vector<BlockOp>{BlockOp{1, BlockOp::kPriority, kv::Tier::kDevice, kv::kDefaultPriority}});
  CHECK(r.Held(0, 100) == 0);
  CHECK(r.Held(0, kv::kDefaultPriority) == 3);
  // Offloaded to the host: it left the device, and counts as an eviction there.
  r.Apply(0, std::vector<BlockOp>{BlockOp{2, BlockOp::kMove, kv::Tier::kHost}});
  CHECK(r.Held(0) == 2);
  CHECK(r.EvictionRate(0, kv::kDefaultPriority) > 0);
  // Onboarded again, and a store repeated (idempotent).
  r.Apply(0, std::vector<BlockOp>{BlockOp{2, BlockOp::kMove, kv::Tier::kDevice}, Store(3, 35)});
  CHECK(r.Held(0) == 3);
  // A host removal leaves the device counts alone; unknown removals are ignored.
  r.Apply(0, std::vector<BlockOp>{Remove(4, kv::Tier::kHost), Remove(99)});
  CHECK(r.Held(0) == 3);
  r.CheckInvariants();
  r.RemoveWorker(0);
  CHECK(r.Held(0) == 0);
}

TEST_CASE("random batches keep the per-priority counts equal to the blocks tracked") {
  ManualClock clock;
  RetentionEstimate r(&clock);
  r.Enable();
  std::mt19937_64 rng(11);
  for (int batch = 0; batch < 500; ++batch) {
    std::vector<BlockOp> ops;
    for (int i = 0; i < 20; ++i) {
      const BlockHash h = 1 + rng() % 300;
      const auto tier = rng() % 4 == 0 ? kv::Tier::kHost : kv::Tier::kDevice;
      const uint8_t p = static_cast<uint8_t>(rng() % 101);
      switch (rng() % 4) {
        case 0: ops.push_back(Store(h, p, tier)); break;
        case 1: ops.push_back(Remove(h, tier)); break;
        case 2: ops.push_back(BlockOp{h, BlockOp::kMove, tier}); break;
        default: ops.push_back(BlockOp{h, BlockOp::kPriority, kv::Tier::kDevice, p});
      }
    }
    r.Apply(static_cast<WorkerId>(rng() % 3), ops);
    clock.AdvanceMs(10);
  }
  r.CheckInvariants();
}

TEST_CASE("the global index feeds its retention estimate from the batches it applies") {
  ManualClock clock;
  GlobalIndex index(GlobalIndexOptions{}, &clock);
  // Off until kv_retention is used: the event thread pays nothing for it before.
  index.Apply(3, std::vector<BlockOp>{Store(9, 100)});
  CHECK(index.retention().Held(3) == 0);
  index.retention().Enable();
  index.Apply(3, std::vector<BlockOp>{Store(1, 100), Store(2, 35),
                                      BlockOp{2, BlockOp::kPriority, kv::Tier::kDevice, 60}});
  CHECK(index.BlockCount(3, kv::Tier::kDevice) == 3);  // 9, 1, 2: the priority op changes nothing there
  CHECK(index.retention().Held(3, 100) == 1);
  CHECK(index.retention().Held(3, 60) == 1);
  index.RemoveWorker(3);
  CHECK(index.retention().Held(3) == 0);
  index.CheckInvariants();
}

}  // namespace kvfleet::router
