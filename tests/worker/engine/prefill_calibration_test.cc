// MeasurePrefillRate on the mock backend under a ManualClock: the steps' times are the cost
// model's, so the measured rate can be checked against the rate the cost model announces.
#include "worker/engine/prefill_calibration.h"

#include <doctest/doctest.h>

#include <memory>

#include "worker/backend/mock/mock_backend.h"

namespace kvfleet::engine {
namespace {

// A mock of `a` µs per step and `b` µs per prefill token (no KV read cost, so a step's time
// is exactly linear in its tokens), on `clock`; `extra_first_us` more for its first step.
struct TimedMock {
  TimedMock(double a, double b, int64_t blocks = 1024, double extra_first_us = 0) {
    backend::BackendOptions bo;
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

}  // namespace
}  // namespace kvfleet::engine
