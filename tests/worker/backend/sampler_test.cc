// The CPU sampler (also the reference for the CUDA sampling kernel): greedy, temperature,
// top-k, top-p, min_p, logit adjustments, counter-based seeded draws and logprobs. The
// bounds of its parameters are schema/sampling.h's (tests/schema/sampling_test.cc).
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <vector>

#include "worker/backend/sampler.h"

namespace kvfleet::backend {
namespace {

TEST_CASE("greedy is the argmax, lowest id on ties, NaN never chosen") {
  Sampler s;
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  CHECK(s.Sample(l, {.temperature = 0.0f}, 0, 0) == 1u);
  CHECK(s.Sample(l, {.temperature = 1.0f, .top_k = 1}, 0, 5) == 1u);
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
    x.push_back(a.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50}, 7, c));
    y.push_back(b.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50}, 7, c));
    z.push_back(b.Sample(l, {.temperature = 1.0f, .top_p = 0.9f, .top_k = 50}, 8, c));
  }
  CHECK(x == y);
  CHECK(x != z);
}

// Frequency of `token` over `n` counters of the sequence seeded `seed`.
double Frequency(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed, int n, TokenId token) {
  Sampler s;
  int hits = 0;
  for (int c = 0; c < n; ++c) hits += s.Sample(logits, p, seed, c) == token;
  return static_cast<double>(hits) / n;
}

TEST_CASE("temperature sampling follows softmax(logits / T)") {
  const std::vector<float> l = {0.0f, std::log(3.0f)};  // probabilities 1/4, 3/4 at T = 1
  CHECK(Frequency(l, {.temperature = 1.0f}, 3, 20000, 1) == doctest::Approx(0.75).epsilon(0.02));
  // T = 0.5 squares the odds: 1 : 9.
  CHECK(Frequency(l, {.temperature = 0.5f}, 3, 20000, 1) == doctest::Approx(0.9).epsilon(0.02));
}

TEST_CASE("top-k keeps the k most probable tokens") {
  std::vector<float> l = {1.0f, 5.0f, 4.0f, 3.0f, 2.0f, 0.0f};
  Sampler s;
  for (uint64_t c = 0; c < 2000; ++c) {
    TokenId t = s.Sample(l, {.temperature = 2.0f, .top_k = 3}, 11, c);
    CHECK((t == 1u || t == 2u || t == 3u));
  }
}

TEST_CASE("top-p keeps the shortest prefix reaching p of the mass") {
  // Probabilities 0.5, 0.3, 0.15, 0.05.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampler s;
  bool saw[4] = {};
  for (uint64_t c = 0; c < 4000; ++c) saw[s.Sample(l, {.temperature = 1.0f, .top_p = 0.9f}, 1, c)] = true;
  CHECK(saw[0]);
  CHECK(saw[1]);
  CHECK(saw[2]);
  CHECK_FALSE(saw[3]);
  // p below the top token's share: always the top token.
  CHECK(Frequency(l, {.temperature = 1.0f, .top_p = 0.4f}, 2, 500, 0) == 1.0);
  // Kept tokens keep their relative odds: 0.5 : 0.3 : 0.15 of 0.95.
  CHECK(Frequency(l, {.temperature = 1.0f, .top_p = 0.9f}, 4, 20000, 1) ==
        doctest::Approx(0.3 / 0.95).epsilon(0.03));
}

TEST_CASE("adjustments: bias on named tokens, repetition over prompt + generated, counts over generated only") {
  const std::vector<TokenId> history = {5, 5, 7, /*generated:*/ 7, 9, 9};
  const std::vector<std::pair<TokenId, float>> bias = {{9, -1.0f}, {2, 3.0f}};
  SamplingParams p{.presence_penalty = 0.25f, .frequency_penalty = 0.5f, .repetition_penalty = 1.5f, .logit_bias = bias};
  std::vector<kernels::LogitAdjust> a;
  BuildLogitAdjusts(p, history, 3, &a);
  REQUIRE(a.size() == 4);  // tokens 2, 5, 7, 9
  CHECK(a[0].token == 2);
  CHECK(a[0].bias == 3.0f);
  CHECK(a[0].repetition == 1.0f);  // never seen
  CHECK(a[0].subtract == 0.0f);
  CHECK(a[1].token == 5);
  CHECK(a[1].repetition == 1.5f);
  CHECK(a[1].subtract == 0.0f);  // only in the prompt: OpenAI's penalties count generated tokens
  CHECK(a[2].token == 7);
  CHECK(a[2].subtract == doctest::Approx(0.5 * 1 + 0.25));
  CHECK(a[3].token == 9);
  CHECK(a[3].bias == -1.0f);
  CHECK(a[3].subtract == doctest::Approx(0.5 * 2 + 0.25));
  // Repetition penalty (HF): a positive logit is divided, a negative one multiplied.
  CHECK(kernels::AdjustLogit(3.0f, a[1]) == doctest::Approx(2.0));
  CHECK(kernels::AdjustLogit(-3.0f, a[1]) == doctest::Approx(-4.5));
  // Bias first, then the penalty: 1 - 1 = 0 stays 0 under repetition, then minus 1.25.
  CHECK(kernels::AdjustLogit(1.0f, a[3]) == doctest::Approx(-1.25));
  BuildLogitAdjusts({}, history, 3, &a);
  CHECK(a.empty());
}

TEST_CASE("penalties change the greedy choice; a -100 bias bans a token and +100 forces one") {
  Sampler s;
  const std::vector<float> l = {1.0f, 3.0f, 2.5f, 0.0f};
  const std::vector<TokenId> history = {1, /*generated:*/ 1};
  std::vector<kernels::LogitAdjust> a;
  SamplingParams freq{.temperature = 0.0f, .frequency_penalty = 1.0f};
  BuildLogitAdjusts(freq, history, 1, &a);
  CHECK(s.Sample(l, freq, 0, 0, a) == 2u);  // 3 - 1 < 2.5
  CHECK(s.Sample(l, freq, 0, 0) == 1u);     // without the adjustments: the raw argmax
  SamplingParams rep{.temperature = 0.0f, .repetition_penalty = 1.25f};
  BuildLogitAdjusts(rep, history, 2, &a);  // all prompt: repetition still counts it
  CHECK(s.Sample(l, rep, 0, 0, a) == 2u);  // 3 / 1.25 = 2.4 < 2.5
  const std::vector<std::pair<TokenId, float>> ban = {{1, -100.0f}, {2, -100.0f}};
  SamplingParams banned{.temperature = 1.0f, .logit_bias = ban};
  BuildLogitAdjusts(banned, {}, 0, &a);
  for (uint64_t c = 0; c < 500; ++c) {
    const TokenId t = s.Sample(l, banned, 0, c, a);
    CHECK((t == 0u || t == 3u));
  }
  const std::vector<std::pair<TokenId, float>> force = {{3, 100.0f}};
  SamplingParams forced{.temperature = 1.0f, .logit_bias = force};
  BuildLogitAdjusts(forced, {}, 0, &a);
  for (uint64_t c = 0; c < 200; ++c) CHECK(s.Sample(l, forced, 0, c, a) == 3u);
}

TEST_CASE("min_p keeps tokens at least min_p times as likely as the top one") {
  // Probabilities 0.5, 0.3, 0.15, 0.05; min_p 0.2 keeps p >= 0.1.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  Sampler s;
  bool saw[4] = {};
  for (uint64_t c = 0; c < 4000; ++c) saw[s.Sample(l, {.temperature = 1.0f, .min_p = 0.2f}, 1, c)] = true;
  CHECK(saw[0]);
  CHECK(saw[1]);
  CHECK(saw[2]);
  CHECK_FALSE(saw[3]);
  // Kept tokens keep their odds: 0.3 of 0.95.
  CHECK(Frequency(l, {.temperature = 1.0f, .min_p = 0.2f}, 4, 20000, 1) ==
        doctest::Approx(0.3 / 0.95).epsilon(0.03));
}

TEST_CASE("logprobs are log-softmax of the raw logits in double, top entries descending, lower id on ties") {
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double sum = 0;
  for (float x : l) sum += std::exp(static_cast<double>(x));
  const TokenLogprobs lp = ComputeLogprobs(l, 4, 3);
  CHECK(lp.token == 4u);
  CHECK(lp.logprob == doctest::Approx(0.5 - std::log(sum)).epsilon(1e-7));
  REQUIRE(lp.top.size() == 3);
  CHECK(lp.top[0].first == 1u);
  CHECK(lp.top[1].first == 2u);
  CHECK(lp.top[2].first == 0u);
  CHECK(lp.top[0].second == lp.top[1].second);
  CHECK(lp.top[2].second == doctest::Approx(1.0 - std::log(sum)).epsilon(1e-7));
  CHECK(ComputeLogprobs(l, 0, 0).top.empty());
  // A large vocabulary with a large offset: the probabilities still sum to 1.
  std::vector<float> big(5000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 80.0f + std::sin(static_cast<float>(i)) * 6.0f;
  double total = 0;
  for (size_t i = 0; i < big.size(); ++i) total += std::exp(ComputeLogprobs(big, static_cast<TokenId>(i), 0).logprob);
  CHECK(total == doctest::Approx(1.0).epsilon(1e-4));
}

TEST_CASE("a token bitmask confines greedy and every sampling mode to the allowed tokens, after the adjustments") {
  Sampler s;
  std::vector<float> l(70);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i % 7);
  // Allowed: 3, 40 and 69 (two words; 69 is in the third).
  std::vector<uint32_t> allowed(3, 0);
  for (uint32_t id : {3u, 40u, 69u}) allowed[id / 32] |= 1u << (id % 32);
  // Greedy: 69 (logit 6) beats 40 (5) and 3 (3); the unmasked argmax (6, 13, ...) is not allowed.
  CHECK(s.Sample(l, {.temperature = 0.0f}, 0, 0, {}, allowed) == 69u);
  // A bias applies before the mask: +10 on token 3 makes it the greedy pick; one on a masked
  // token changes nothing.
  std::vector<kernels::LogitAdjust> adjust(2);
  adjust[0].token = 3;
  adjust[0].bias = 10.0f;
  adjust[1].token = 6;
  adjust[1].bias = 50.0f;
  CHECK(s.Sample(l, {.temperature = 0.0f}, 0, 0, adjust, allowed) == 3u);
  for (SamplingParams p : {SamplingParams{.temperature = 1.5f}, SamplingParams{.temperature = 1.0f, .top_k = 2},
                           SamplingParams{.temperature = 1.0f, .top_p = 0.5f},
                           SamplingParams{.temperature = 1.0f, .min_p = 0.01f}}) {
    std::set<TokenId> seen;
    for (uint64_t c = 0; c < 300; ++c) seen.insert(s.Sample(l, p, 7, c, {}, allowed));
    for (TokenId t : seen) CHECK((t == 3u || t == 40u || t == 69u));
  }
  // The logits themselves are untouched (logprobs are the raw ones).
  CHECK(l[6] == 6.0f);
}

}  // namespace
}  // namespace kvfleet::backend
