// The CPU sampler (also the reference for the CUDA sampling kernel): greedy, temperature,
// top-k, top-p, and counter-based seeded draws.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "worker/backend/sampler.h"

namespace kvfleet::backend {
namespace {

TEST_CASE("greedy is the argmax, lowest id on ties, NaN never chosen") {
  Sampler s;
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  CHECK(s.Sample(l, {.temperature = 0.0f}, 0) == 1u);
  CHECK(s.Sample(l, {.temperature = 1.0f, .top_k = 1}, 5) == 1u);
  CHECK(ArgMax(std::vector<float>{NAN, -3.0f, NAN}) == 1u);
  CHECK(ArgMax(std::vector<float>{-INFINITY, -INFINITY}) == 0u);
}

TEST_CASE("the uniform draw is SplitMix64, in [0, 1), a pure function of seed and counter") {
  static_assert(SplitMix64(0) == 0xE220A8397B1DCDAFull);  // the published first output for state 0
  for (uint64_t c = 0; c < 1000; ++c) {
    const float u = SampleUniform(42, c);
    CHECK(u >= 0.0f);
    CHECK(u < 1.0f);
    CHECK(u == SampleUniform(42, c));
  }
  CHECK(SampleUniform(1, 0) != SampleUniform(2, 0));
}

TEST_CASE("a seed gives the same tokens every time; other seeds give others") {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i)) * 2.0f;
  Sampler a, b;
  std::vector<TokenId> x, y, z;
  for (uint64_t c = 0; c < 64; ++c) {
    x.push_back(a.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50, .seed = 7}, c));
    y.push_back(b.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50, .seed = 7}, c));
    z.push_back(b.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50, .seed = 8}, c));
  }
  CHECK(x == y);
  CHECK(x != z);
}

// Frequency of token 1 over `n` counters.
double Frequency(const std::vector<float>& logits, SamplingParams p, int n, TokenId token) {
  Sampler s;
  int hits = 0;
  for (int c = 0; c < n; ++c) hits += s.Sample(logits, p, c) == token;
  return static_cast<double>(hits) / n;
}

TEST_CASE("temperature sampling follows softmax(logits / T)") {
  const std::vector<float> l = {0.0f, std::log(3.0f)};  // probabilities 1/4, 3/4 at T = 1
  CHECK(Frequency(l, {.temperature = 1.0f, .seed = 3}, 20000, 1) == doctest::Approx(0.75).epsilon(0.02));
  // T = 0.5 squares the odds: 1 : 9.
  CHECK(Frequency(l, {.temperature = 0.5f, .seed = 3}, 20000, 1) == doctest::Approx(0.9).epsilon(0.02));
}

TEST_CASE("top-k keeps the k most probable tokens") {
  std::vector<float> l = {1.0f, 5.0f, 4.0f, 3.0f, 2.0f, 0.0f};
  Sampler s;
  for (uint64_t c = 0; c < 2000; ++c) {
    TokenId t = s.Sample(l, {.temperature = 5.0f, .top_k = 3, .seed = 11}, c);
    CHECK((t == 1u || t == 2u || t == 3u));
  }
}

TEST_CASE("top-p keeps the shortest prefix reaching p of the mass") {
  // Probabilities 0.5, 0.3, 0.15, 0.05.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampler s;
  bool saw[4] = {};
  for (uint64_t c = 0; c < 4000; ++c) saw[s.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .seed = 1}, c)] = true;
  CHECK(saw[0]);
  CHECK(saw[1]);
  CHECK(saw[2]);
  CHECK_FALSE(saw[3]);
  // p below the top token's share: always the top token.
  CHECK(Frequency(l, {.temperature = 1.0f, .top_p = 0.4f, .seed = 2}, 500, 0) == 1.0);
  // Kept tokens keep their relative odds: 0.5 : 0.3 : 0.15 of 0.95.
  CHECK(Frequency(l, {.temperature = 1.0f, .top_p = 0.9f, .seed = 4}, 20000, 1) ==
        doctest::Approx(0.3 / 0.95).epsilon(0.03));
}

TEST_CASE("out-of-range sampling values are refused by name") {
  CHECK(ValidateSamplingParams({}).ok());
  CHECK(ValidateSamplingParams({.temperature = -0.1f}).message().find("temperature") != std::string::npos);
  CHECK_FALSE(ValidateSamplingParams({.temperature = NAN}).ok());
  CHECK_FALSE(ValidateSamplingParams({.temperature = INFINITY}).ok());
  CHECK(ValidateSamplingParams({.top_p = 0.0f}).message().find("top_p") != std::string::npos);
  CHECK_FALSE(ValidateSamplingParams({.top_p = 1.5f}).ok());
  CHECK(ValidateSamplingParams({.top_k = -1}).message().find("top_k") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::backend
