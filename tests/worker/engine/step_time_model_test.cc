// The step-time model's online fit, on synthetic measurements from known coefficients.
#include "worker/engine/step_time_model.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvfleet::engine {
namespace {

// A GPU and model unlike the prior: slower weights pass, cheaper prefill, dearer decode rows.
constexpr StepCoefficients kTruth{4000.0, 800.0, 12.0, 20.0, 0.1, 0.003};

DurationNs TrueDuration(const StepCoefficients& c, const StepShape& s, double noise = 0) {
  const double us = c.base_us + (s.prefill_tokens > 0 ? c.prefill_step_us : 0) +
                    c.prefill_token_us * static_cast<double>(s.prefill_tokens) +
                    c.decode_seq_us * static_cast<double>(s.decode_seqs) +
                    c.kv_token_us * static_cast<double>(s.kv_tokens) +
                    c.prefill_pair_us * static_cast<double>(s.prefill_pairs);
  return static_cast<DurationNs>(us * (1.0 + noise) * kNsPerUs);
}

// A step an engine could run: some decodes with their contexts, and maybe a prefill chunk.
StepShape RandomShape(std::mt19937_64& rng) {
  StepShape s;
  const uint32_t decodes = static_cast<uint32_t>(rng() % 3 == 0 ? 0 : 1 + rng() % 128);
  const uint32_t context = static_cast<uint32_t>(64 + rng() % 8000);  // this workload's
  for (uint32_t i = 0; i < decodes; ++i) s.AddDecode(context + static_cast<uint32_t>(rng() % (context / 4 + 1)));
  if (decodes == 0 || rng() % 2 == 0) {
    s.AddPrefill(static_cast<uint32_t>(rng() % 8) * 1024, static_cast<uint32_t>(32 + rng() % 4064));
  }
  return s;
}

double RelativeError(const StepTimeModel& m, const StepCoefficients& truth, const StepShape& s) {
  const double want = static_cast<double>(TrueDuration(truth, s)) / kNsPerUs;
  return std::abs(m.PredictUs(s) - want) / want;
}

// The worst relative error over 200 fresh random shapes.
double WorstError(const StepTimeModel& m, const StepCoefficients& truth, uint64_t seed) {
  std::mt19937_64 rng(seed);
  double worst = 0;
  for (int i = 0; i < 200; ++i) worst = std::max(worst, RelativeError(m, truth, RandomShape(rng)));
  return worst;
}

// The mean relative error over 200 fresh random shapes.
double MeanError(const StepTimeModel& m, const StepCoefficients& truth, uint64_t seed) {
  std::mt19937_64 rng(seed);
  double sum = 0;
  for (int i = 0; i < 200; ++i) sum += RelativeError(m, truth, RandomShape(rng));
  return sum / 200;
}

TEST_CASE("the fit converges on noisy measurements to coefficients far from the prior") {
  StepTimeModel m;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> noise(-0.03, 0.03);
  CHECK(WorstError(m, kTruth, 99) > 0.3);  // the prior is a poor guess of this GPU
  for (int i = 0; i < 2000; ++i) {
    const StepShape s = RandomShape(rng);
    m.Observe(s, TrueDuration(kTruth, s, noise(rng)));
  }
  CHECK(WorstError(m, kTruth, 99) < 0.05);
  const StepCoefficients& c = m.coefficients();
  CHECK(c.base_us == doctest::Approx(kTruth.base_us).epsilon(0.15));
  CHECK(c.prefill_step_us == doctest::Approx(kTruth.prefill_step_us).epsilon(0.3));
  CHECK(c.prefill_token_us == doctest::Approx(kTruth.prefill_token_us).epsilon(0.15));
  CHECK(c.decode_seq_us == doctest::Approx(kTruth.decode_seq_us).epsilon(0.15));
  CHECK(c.kv_token_us == doctest::Approx(kTruth.kv_token_us).epsilon(0.15));
  CHECK(c.prefill_pair_us == doctest::Approx(kTruth.prefill_pair_us).epsilon(0.15));
  CHECK(m.observations() == 2000);
  CHECK(m.relative_error() < 0.06);  // the noise is ±3%
}

TEST_CASE("a first slow step (CUDA warm-up) barely moves the model, and is forgotten") {
  StepTimeModel m(kTruth);
  StepShape decode;
  for (int i = 0; i < 64; ++i) decode.AddDecode(1024);
  const double before = m.PredictUs(decode);
  m.Observe(decode, 100 * TrueDuration(kTruth, decode));  // 100x: graph capture, cuBLAS init
  CHECK(m.outliers() == 1);
  CHECK(m.PredictUs(decode) < 1.1 * before);
  std::mt19937_64 rng(2);
  for (int i = 0; i < 300; ++i) {
    const StepShape s = RandomShape(rng);
    m.Observe(s, TrueDuration(kTruth, s));
  }
  CHECK(m.PredictUs(decode) == doctest::Approx(before).epsilon(0.02));
  CHECK(WorstError(m, kTruth, 7) < 0.03);
}

TEST_CASE("a lone slow step in steady state moves the prediction by less than 5%") {
  StepTimeModel m;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const StepShape s = RandomShape(rng);
    m.Observe(s, TrueDuration(kTruth, s));
  }
  StepShape probe;
  for (int i = 0; i < 32; ++i) probe.AddDecode(2048);
  probe.AddPrefill(0, 512);
  const double before = m.PredictUs(probe);
  m.Observe(probe, 20 * TrueDuration(kTruth, probe));
  CHECK(m.PredictUs(probe) == doctest::Approx(before).epsilon(0.05));
}

TEST_CASE("a backend ten times slower than the prior (a CPU) is learnt within a few hundred steps") {
  StepCoefficients cpu = kTruth;
  for (double* c : {&cpu.base_us, &cpu.prefill_step_us, &cpu.prefill_token_us, &cpu.decode_seq_us, &cpu.kv_token_us,
                    &cpu.prefill_pair_us}) {
    *c *= 10;
  }
  StepTimeModel m;
  std::mt19937_64 rng(4);
  for (int i = 0; i < 400; ++i) {
    const StepShape s = RandomShape(rng);
    m.Observe(s, TrueDuration(cpu, s));
  }
  CHECK(MeanError(m, cpu, 8) < 0.01);
  CHECK(WorstError(m, cpu, 8) < 0.05);
}

TEST_CASE("a term the steps do not exercise stays at its prior instead of winding up") {
  StepTimeModel m;
  StepShape decode;
  for (int i = 0; i < 16; ++i) decode.AddDecode(700);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> noise(-0.05, 0.05);
  for (int i = 0; i < 5000; ++i) m.Observe(decode, TrueDuration(kTruth, decode, noise(rng)));
  CHECK(m.coefficients().prefill_token_us == doctest::Approx(config::kPriorCoefficients.prefill_token_us).epsilon(0.1));
  CHECK(m.coefficients().prefill_pair_us ==
        doctest::Approx(config::kPriorCoefficients.prefill_pair_us).epsilon(0.1));
  CHECK(m.PredictUs(decode) == doctest::Approx(static_cast<double>(TrueDuration(kTruth, decode)) / kNsPerUs)
                                   .epsilon(0.03));
}

TEST_CASE("no coefficient goes negative, so a longer chunk never looks cheaper") {
  // No prefill attention cost at all, and noise: an unconstrained fit would go negative.
  StepCoefficients truth = kTruth;
  truth.prefill_pair_us = 0;
  truth.kv_token_us = 0;
  StepTimeModel m;
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<double> noise(-0.1, 0.1);
  for (int i = 0; i < 3000; ++i) {
    const StepShape s = RandomShape(rng);
    m.Observe(s, TrueDuration(truth, s, noise(rng)));
    const StepCoefficients& c = m.coefficients();
    REQUIRE(c.base_us >= 0);
    REQUIRE(c.prefill_step_us >= 0);
    REQUIRE(c.prefill_token_us >= 0);
    REQUIRE(c.decode_seq_us >= 0);
    REQUIRE(c.kv_token_us >= 0);
    REQUIRE(c.prefill_pair_us >= 0);
  }
  StepShape s;
  s.AddDecode(4000);
  double last = 0;
  for (uint32_t n = 16; n <= 8192; n += 16) {
    const double t = m.PredictUs(s.WithPrefill(1000, n));
    CHECK(t >= last);
    last = t;
  }
}

TEST_CASE("empty steps and non-positive durations are not measurements") {
  StepTimeModel m;
  const StepCoefficients before = m.coefficients();
  m.Observe(StepShape{}, 5 * kNsPerMs);
  StepShape s;
  s.AddDecode(10);
  m.Observe(s, 0);
  m.Observe(s, -1);
  CHECK(m.observations() == 0);
  CHECK(m.coefficients().base_us == before.base_us);
  CHECK(m.PredictUs(StepShape{}) == 0);
}

TEST_CASE("a step's shape counts decodes' context and prefill's causal pairs") {
  StepShape s;
  s.AddDecode(100);   // its token at position 99 reads 100 KV tokens
  s.AddPrefill(32, 4);  // positions 32..35 read 33..36 tokens
  CHECK(s.decode_seqs == 1);
  CHECK(s.prefill_tokens == 4);
  CHECK(s.kv_tokens == 100 + 36);
  CHECK(s.prefill_pairs == 33 + 34 + 35 + 36);
}

}  // namespace
}  // namespace kvfleet::engine
