// Sampling kernel: greedy is the argmax; sampled tokens always lie in the reference's surviving
// set (top-k, top-p, min_p, after the adjustments), equal the reference's draw for the same
// seed, repeat for the same seed, and follow the reference distribution over many seeds;
// logprobs (sampled and prompt rows) match the double log-softmax of the raw logits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/sampling.h"
#include "kernels/sampling_ref.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

std::vector<int32_t> Sample(const std::vector<float>& logits, int vocab, const std::vector<SamplingRow>& rows) {
  const int n = static_cast<int>(rows.size());
  std::vector<float> temp(n), top_p(n);
  std::vector<int32_t> top_k(n);
  std::vector<uint64_t> seed(n), step(n);
  for (int i = 0; i < n; ++i) {
    temp[i] = rows[i].temperature;
    top_k[i] = rows[i].top_k;
    top_p[i] = rows[i].top_p;
    seed[i] = rows[i].seed;
    step[i] = rows[i].step;
  }
  DeviceBuffer<float> dl(logits), dt(temp), dp(top_p);
  DeviceBuffer<int32_t> dk(top_k), dout(n);
  DeviceBuffer<uint64_t> ds(seed), dstep(step);
  dout.Poison();
  SamplingParams p{dl.get(), dt.get(), dk.get(), dp.get(), ds.get(), dstep.get(), dout.get(), n, vocab};
  KVF_CUDA_OK(LaunchSampling(p, nullptr));
  KVF_CUDA_OK(cudaDeviceSynchronize());
  return dout.Download();
}

std::vector<float> RandomLogits(int rows, int vocab, std::mt19937& rng, float spread) {
  std::normal_distribution<float> dist(0.f, spread);
  std::vector<float> l(size_t(rows) * vocab);
  for (auto& x : l) x = dist(rng);
  return l;
}

TEST_CASE("every configuration draws from the reference's surviving set, and mostly the same token") {
  std::mt19937 rng(21);
  for (int vocab : {1000, 1001, 32000, 128256}) {  // 1001: the scalar argmax pass
    std::vector<SamplingRow> rows;
    for (uint64_t s = 0; s < 48; ++s) {
      SamplingRow r;
      r.seed = 1234 + s;
      r.step = s;
      switch (s % 6) {
        case 0: r.temperature = 0; break;                                 // greedy
        case 1: r.temperature = 1; break;                                 // full vocab
        case 2: r.temperature = 0.7f; r.top_k = 50; break;
        case 3: r.temperature = 1.3f; r.top_p = 0.9f; break;
        case 4: r.temperature = 0.8f; r.top_k = 200; r.top_p = 0.5f; break;
        case 5: r.temperature = 1; r.top_k = 1; break;                    // greedy via top-k
      }
      rows.push_back(r);
    }
    const int n = static_cast<int>(rows.size());
    auto logits = RandomLogits(n, vocab, rng, 3.f);
    auto tokens = Sample(logits, vocab, rows);
    int same = 0;
    for (int i = 0; i < n; ++i) {
      const float* row = logits.data() + size_t(i) * vocab;
      auto probs = SamplingDistributionRef(row, vocab, rows[i]);
      CAPTURE(vocab);
      CAPTURE(i);
      REQUIRE(tokens[i] >= 0);
      REQUIRE(tokens[i] < vocab);
      CHECK(probs[tokens[i]] > 0);
      same += tokens[i] == SampleRef(row, vocab, rows[i]);
    }
    // Host and device logf/expf may differ in the last bit, which can flip a near tie.
    CHECK(same >= n - 2);
    CHECK(Sample(logits, vocab, rows) == tokens);  // seeded: repeatable
  }
}

TEST_CASE("draws over many seeds follow the top-k / top-p distribution") {
  std::mt19937 rng(22);
  const int vocab = 5000, n = 4000;
  auto one = RandomLogits(1, vocab, rng, 2.f);
  std::vector<float> logits;
  std::vector<SamplingRow> rows;
  for (int i = 0; i < n; ++i) {
    logits.insert(logits.end(), one.begin(), one.end());
    SamplingRow r;
    r.temperature = 0.9f;
    r.top_k = 40;
    r.top_p = 0.8f;
    r.seed = 99;
    r.step = i;
    rows.push_back(r);
  }
  auto tokens = Sample(logits, vocab, rows);
  auto probs = SamplingDistributionRef(one.data(), vocab, rows[0]);
  std::vector<int> counts(vocab, 0);
  for (int t : tokens) counts[t]++;
  for (int v = 0; v < vocab; ++v) {
    if (probs[v] == 0) {
      CHECK(counts[v] == 0);
      continue;
    }
    // 5 standard deviations of a binomial count.
    const double expect = probs[v] * n, sd = std::sqrt(n * probs[v] * (1 - probs[v]));
    CHECK(std::abs(counts[v] - expect) <= 5 * sd + 1);
  }
}

// One launch with every per-sequence setting, logprobs included.
struct FullOut {
  std::vector<int32_t> tokens, top_tokens;
  std::vector<float> token_logprob, top_logprobs;
};
FullOut SampleFull(const std::vector<float>& logits, int vocab, const std::vector<SamplingRow>& rows,
                   const std::vector<int32_t>& logprobs) {
  const int n = static_cast<int>(rows.size());
  std::vector<float> temp(n), top_p(n), min_p(n);
  std::vector<int32_t> top_k(n), begin(n + 1, 0);
  std::vector<uint64_t> seed(n), step(n);
  std::vector<LogitAdjust> adjust;
  const int32_t words = (vocab + 31) / 32;
  std::vector<int32_t> masked(n, 0);
  std::vector<uint32_t> allowed(size_t(n) * words, 0);
  for (int i = 0; i < n; ++i) {
    if (!rows[i].allowed.empty()) {
      masked[i] = 1;
      std::copy(rows[i].allowed.begin(), rows[i].allowed.end(), allowed.begin() + size_t(i) * words);
    }
    temp[i] = rows[i].temperature;
    top_k[i] = rows[i].top_k;
    top_p[i] = rows[i].top_p;
    min_p[i] = rows[i].min_p;
    seed[i] = rows[i].seed;
    step[i] = rows[i].step;
    adjust.insert(adjust.end(), rows[i].adjust.begin(), rows[i].adjust.end());
    begin[i + 1] = static_cast<int32_t>(adjust.size());
  }
  DeviceBuffer<float> dl(logits), dt(temp), dp(top_p), dm(min_p), draw(std::max<size_t>(adjust.size(), 1));
  DeviceBuffer<int32_t> dk(top_k), dout(n), db(begin), dlp(logprobs), dtt(size_t(n) * kMaxTopLogprobs);
  DeviceBuffer<uint64_t> ds(seed), dstep(step);
  DeviceBuffer<LogitAdjust> da(std::max<size_t>(adjust.size(), 1));
  if (!adjust.empty()) da.Upload(adjust);
  DeviceBuffer<float> dtl(n), dtv(size_t(n) * kMaxTopLogprobs);
  DeviceBuffer<int32_t> dmasked(masked);
  DeviceBuffer<uint32_t> dallowed(allowed);
  dout.Poison();
  dtl.Poison();
  SamplingParams p{dl.get(), dt.get(), dk.get(), dp.get(), ds.get(), dstep.get(), dout.get(), n, vocab};
  p.allowed_rows = dmasked.get();
  p.allowed = dallowed.get();
  p.allowed_words = words;
  p.min_p = dm.get();
  p.adjust_begin = db.get();
  p.adjust = da.get();
  p.adjust_raw = draw.get();
  p.logprobs = dlp.get();
  p.token_logprob = dtl.get();
  p.top_tokens = dtt.get();
  p.top_logprobs = dtv.get();
  KVF_CUDA_OK(LaunchSampling(p, nullptr));
  KVF_CUDA_OK(cudaDeviceSynchronize());
  return {dout.Download(), dtt.Download(), dtl.Download(), dtv.Download()};
}

// A constrained-decoding bitmask: one token, a few, or about half the vocabulary.
std::vector<uint32_t> RandomAllowed(int vocab, std::mt19937& rng) {
  std::vector<uint32_t> bits((vocab + 31) / 32, 0);
  std::uniform_int_distribution<int> token(0, vocab - 1), kind(0, 2);
  const int k = kind(rng);
  const int n = k == 0 ? 1 : k == 1 ? 20 : vocab / 2;
  for (int i = 0; i < n; ++i) {
    const int t = token(rng);
    bits[t / 32] |= 1u << (t % 32);
  }
  return bits;
}

bool Allowed(const std::vector<uint32_t>& bits, int32_t t) { return bits.empty() || (bits[t / 32] >> (t % 32) & 1u); }

// Distinct random tokens with random adjustments: logit_bias (some +-100), repetition, counts.
std::vector<LogitAdjust> RandomAdjust(int vocab, int n, std::mt19937& rng) {
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<LogitAdjust> out;
  for (int i = 0; i < n; ++i) {
    LogitAdjust a;
    a.token = ids[i];
    const float r = u(rng);
    a.bias = r < 0.05f ? -100.f : r < 0.08f ? 100.f : r < 0.5f ? (u(rng) - 0.5f) * 10.f : 0.f;
    a.repetition = u(rng) < 0.5f ? 1.f : 0.8f + u(rng) * 0.7f;
    a.subtract = u(rng) < 0.5f ? 0.f : (u(rng) - 0.3f) * 4.f;
    out.push_back(a);
  }
  std::sort(out.begin(), out.end(), [](const LogitAdjust& a, const LogitAdjust& b) { return a.token < b.token; });
  return out;
}

TEST_CASE("random per-sequence adjustments, allowed-token masks, min_p and logprobs share one launch and match the reference") {
  std::mt19937 rng(23);
  for (int vocab : {1000, 1001, 32000, 128256}) {
    std::vector<SamplingRow> rows;
    std::vector<int32_t> logprobs;
    std::uniform_int_distribution<int> pick(0, 99);
    for (uint64_t s = 0; s < 48; ++s) {
      SamplingRow r;
      r.seed = 77 + s;
      r.step = s * 3;
      r.temperature = pick(rng) < 25 ? 0.f : 0.5f + pick(rng) / 100.f;
      r.top_k = pick(rng) < 30 ? 50 : 0;
      r.top_p = pick(rng) < 30 ? 0.9f : 1.f;
      r.min_p = pick(rng) < 40 ? 0.05f : 0.f;
      r.adjust = RandomAdjust(vocab, pick(rng) < 30 ? 0 : 1 + pick(rng) * 3, rng);
      if (pick(rng) < 40) r.allowed = RandomAllowed(vocab, rng);
      rows.push_back(r);
      logprobs.push_back(pick(rng) % 22 - 1);  // -1 .. 20
    }
    const int n = static_cast<int>(rows.size());
    auto logits = RandomLogits(n, vocab, rng, 3.f);
    const FullOut out = SampleFull(logits, vocab, rows, logprobs);
    int same = 0;
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      const float* raw = logits.data() + size_t(i) * vocab;
      CAPTURE(vocab);
      CAPTURE(i);
      const int32_t t = out.tokens[i];
      REQUIRE(t >= 0);
      REQUIRE(t < vocab);
      CHECK(Allowed(rows[i].allowed, t));
      CHECK(SamplingDistributionRef(raw, vocab, rows[i])[t] > 0);
      same += t == SampleRef(raw, vocab, rows[i]);
      if (logprobs[i] < 0) continue;
      const LogprobsRef ref = RowLogprobsRef(raw, vocab, t, logprobs[i]);
      worst = std::max(worst, std::fabs(out.token_logprob[i] - ref.token_logprob));
      for (int k = 0; k < logprobs[i]; ++k) {
        CHECK(out.top_tokens[size_t(i) * kMaxTopLogprobs + k] == ref.top_tokens[k]);
        worst = std::max(worst, std::fabs(out.top_logprobs[size_t(i) * kMaxTopLogprobs + k] - ref.top_logprobs[k]));
      }
    }
    CHECK(same >= n - 2);  // host and device logf/expf may differ in the last bit near a tie
    CHECK(worst <= 1e-4);  // fp32 logits: float logsumexp against double
    MESSAGE("vocab " << vocab << ": max |logprob - reference| " << worst);
    CHECK(SampleFull(logits, vocab, rows, logprobs).tokens == out.tokens);  // seeded: repeatable
  }
}

TEST_CASE("prompt-row logprobs: each row's target and top entries, as the reference") {
  std::mt19937 rng(24);
  for (int vocab : {1000, 151936}) {
    for (int top : {0, 1, 5, 20}) {
      const int rows = 37;
      auto logits = RandomLogits(rows, vocab, rng, 4.f);
      std::vector<int32_t> target(rows);
      for (auto& t : target) t = static_cast<int32_t>(rng() % vocab);
      DeviceBuffer<float> dl(logits), dtl(rows), dtv(size_t(rows) * kMaxTopLogprobs);
      DeviceBuffer<int32_t> dt(target), dtt(size_t(rows) * kMaxTopLogprobs);
      dtl.Poison();
      LogprobsParams p{dl.get(), dt.get(), top, dtl.get(), dtt.get(), dtv.get(), rows, vocab};
      KVF_CUDA_OK(LaunchLogprobs(p, nullptr));
      KVF_CUDA_OK(cudaDeviceSynchronize());
      const auto lp = dtl.Download();
      const auto tt = dtt.Download();
      const auto tv = dtv.Download();
      double worst = 0;
      for (int r = 0; r < rows; ++r) {
        const LogprobsRef ref = RowLogprobsRef(logits.data() + size_t(r) * vocab, vocab, target[r], top);
        worst = std::max(worst, std::fabs(lp[r] - ref.token_logprob));
        for (int k = 0; k < top; ++k) {
          CHECK(tt[size_t(r) * kMaxTopLogprobs + k] == ref.top_tokens[k]);
          worst = std::max(worst, std::fabs(tv[size_t(r) * kMaxTopLogprobs + k] - ref.top_logprobs[k]));
        }
      }
      CAPTURE(vocab);
      CAPTURE(top);
      CHECK(worst <= 1e-4);
    }
  }
  LogprobsParams bad;
  bad.rows = 1;
  bad.vocab = 10;
  bad.top = kMaxTopLogprobs + 1;
  CHECK(LaunchLogprobs(bad, nullptr) == cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvfleet::kernels
