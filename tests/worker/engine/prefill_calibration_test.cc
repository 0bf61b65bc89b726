// MeasurePrefillRate on the mock backend under a ManualClock: the steps' times are the cost
// model's, so the measured rate can be checked against the rate the cost model announces.
#include "worker/engine/prefill_calibration.h"

#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "worker/backend/mock/mock_backend.h"

namespace kvfleet::engine {
namespace {

// A mock of `a` µs per step and `b` µs per prefill token (no KV read cost, so a step's time
// is exactly linear in its tokens), on `clock`; `extra_first_us` more for its first step.
struct TimedMock {
  TimedMock(double a, double b, int64_t blocks = 1024, double extra_first_us = 0, uint64_t host_bytes = 0) {
    backend::BackendOptions bo;
    bo.host_kv_bytes = host_bytes;
    bo.block_size = 16;
    bo.max_num_tokens = 8192;
    bo.max_batch_size = 8;
    bo.max_context = 16384;
    bo.num_blocks = blocks;
    backend::mock::MockOptions mo;
    mo.cost.step_base_us = a;
    mo.cost.prefill_token_us = b;
    mo.cost.decode_seq_us = 0;
    mo.cost.kv_token_read_us = 0;
    mo.clock = &clock;
    mo.wait = [this, extra_first_us](TimeNs deadline) {
      if (steps++ == 0) deadline += static_cast<DurationNs>(extra_first_us * kNsPerUs);
      if (deadline > clock.Now()) clock.Set(deadline);
    };
    auto made = backend::mock::MockBackend::Make(bo, mo);
    REQUIRE_MESSAGE(made.ok(), made.status().ToString());
    mock = std::move(*made);
  }
  ManualClock clock;
  int steps = 0;
  std::unique_ptr<backend::mock::MockBackend> mock;
};

TEST_CASE("the measured prefill rate is the largest step's within --max-step-ms, as the mock's cost model says") {
  TimedMock m(2'000, 10);
  PrefillCalibrationOptions options;
  options.max_tokens = 8192;
  options.max_step_ms = 25;
  auto measured = MeasurePrefillRate(m.mock.get(), options, &m.clock);
  REQUIRE_MESSAGE(measured.ok(), measured.status().ToString());
  // 2 ms + 10 µs × 2,300 tokens = 25 ms: 92,000 tokens/s, which is also what the mock announces.
  CHECK(measured->step_tokens == 2'300);
  CHECK(measured->tokens_per_second == doctest::Approx(92'000).epsilon(1e-6));
  CHECK(measured->tokens_per_second ==
        doctest::Approx(m.mock->ExpectedPrefillTokensPerSecond(8192, 25)).epsilon(1e-6));
  // Doubling from 64 tokens until the first step past the bound (4,096 tokens: 42.96 ms).
  REQUIRE(measured->steps.size() == 7);
  CHECK(measured->steps.front().tokens == 64);
  CHECK(measured->steps.back().tokens == 4'096);
  CHECK(m.steps == 8);  // the warm-up besides
}

TEST_CASE("without a step bound the rate is the largest step's the worker runs, its KV pools' blocks included") {
  PrefillCalibrationOptions options;
  options.max_tokens = 8192;
  options.max_step_ms = 0;
  SUBCASE("the token budget") {
    TimedMock m(2'000, 10);
    auto measured = MeasurePrefillRate(m.mock.get(), options, &m.clock);
    REQUIRE(measured.ok());
    CHECK(measured->steps.back().tokens == 8'192);
    CHECK(measured->tokens_per_second == doctest::Approx(8'192 / 83.92e-3).epsilon(1e-6));
  }
  SUBCASE("a KV cache of 100 blocks of 16 tokens") {
    TimedMock m(2'000, 10, 100);
    auto measured = MeasurePrefillRate(m.mock.get(), options, &m.clock);
    REQUIRE(measured.ok());
    CHECK(measured->steps.back().tokens == 1'600);
  }
}

TEST_CASE("the first step's start-up cost is not in the measured rate") {
  TimedMock cold(2'000, 10, 1024, 500'000);  // the first step takes half a second more
  TimedMock warm(2'000, 10);
  PrefillCalibrationOptions options;
  auto a = MeasurePrefillRate(cold.mock.get(), options, &cold.clock);
  auto b = MeasurePrefillRate(warm.mock.get(), options, &warm.clock);
  REQUIRE((a.ok() && b.ok()));
  CHECK(a->tokens_per_second == doctest::Approx(b->tokens_per_second).epsilon(1e-9));
  CHECK(a->elapsed == b->elapsed + 500 * kNsPerMs);
}

TEST_CASE("a slow backend's calibration stops within its time budget") {
  PrefillCalibrationOptions options;
  options.max_step_ms = 0;
  SUBCASE("the timed steps stop before the next would overrun the budget") {
    TimedMock m(2'000, 1'000);  // 1 ms a token: 64 tokens take 66 ms
    auto measured = MeasurePrefillRate(m.mock.get(), options, &m.clock);
    REQUIRE(measured.ok());
    DurationNs timed = 0;
    for (const CalibrationStep& s : measured->steps) timed += s.duration;
    CHECK(timed <= options.budget);
    // 64 + 128 + 256 + 512 tokens take 0.968 s; 1,024 more would pass the second.
    CHECK(measured->steps.back().tokens == 512);
    CHECK(measured->tokens_per_second == doctest::Approx(512 / 0.514).epsilon(1e-6));
  }
  SUBCASE("a warm-up longer than the budget is the measurement") {
    TimedMock m(2'000, 20'000);  // 64 tokens: 1.282 s
    auto measured = MeasurePrefillRate(m.mock.get(), options, &m.clock);
    REQUIRE(measured.ok());
    CHECK(m.steps == 1);
    REQUIRE(measured->steps.size() == 1);
    CHECK(measured->tokens_per_second == doctest::Approx(64 / 1.282).epsilon(1e-6));
  }
}

TEST_CASE("a mock step pays for the KV copied between the tiers since the step before, and only once") {
  TimedMock m(2'000, 10, 1024, 0, 64ull << 20);
  REQUIRE(m.mock->cost_model().tier_copy_us_per_mib == 20);  // the default
  REQUIRE(m.mock->pools().size() == 1);
  REQUIRE(m.mock->pools()[0].bytes_per_block == 2ull << 20);  // 16 tokens x 128 KiB
  REQUIRE(m.mock->pools()[0].host_blocks == 32);
  const backend::StepBatch none;
  backend::StepOutput out;
  // Three offloads and an onboard (4 x 2 MiB at 20 us/MiB = 160 us); a copy within the device
  // tier (a partial block's) is not charged.
  std::vector<kv::BlockCopy> copies = {{0, kv::Tier::kDevice, 1, kv::Tier::kHost, 0},
                                       {0, kv::Tier::kDevice, 2, kv::Tier::kHost, 1},
                                       {0, kv::Tier::kDevice, 3, kv::Tier::kHost, 2},
                                       {0, kv::Tier::kHost, 0, kv::Tier::kDevice, 4},
                                       {0, kv::Tier::kDevice, 5, kv::Tier::kDevice, 6}};
  m.mock->block_copier().Copy(copies);
  TimeNs start = m.clock.Now();
  REQUIRE(m.mock->Execute(none, &out).ok());
  CHECK(m.clock.Now() - start == 160 * kNsPerUs);
  start = m.clock.Now();
  REQUIRE(m.mock->Execute(none, &out).ok());
  CHECK(m.clock.Now() - start == 0);
  // With work besides, the copies add to the step: 2 ms + 0.16 ms.
  CHECK(m.mock->cost_model().StepDuration({1, 0, 1, 8ull << 20}) == (2'000 + 10 + 160) * kNsPerUs);
}

}  // namespace
}  // namespace kvfleet::engine
