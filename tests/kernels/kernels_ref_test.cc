// The CPU references the GPU kernels are tested against: masks, bf16 rounding, RoPE
// frequencies, paged attention (against dense attention), the small kernels and sampling.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "kernels/attention_mask.h"
#include "kernels/bf16.h"
#include "kernels/gemv_ref.h"
#include "kernels/paged_attention_ref.h"
#include "kernels/rope.h"
#include "kernels/sampling_ref.h"
#include "kernels/small_kernels_ref.h"

namespace kvfleet::kernels {
namespace {

std::vector<bf16_bits> Random(size_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<bf16_bits> v(n);
  for (auto& x : v) x = FloatToBf16(d(rng));
  return v;
}

TEST_CASE("the sink count and range start describe exactly the keys MaskAttends allows") {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    AttentionMask m;
    m.window = rng() % 3 ? static_cast<int>(rng() % 40) : 0;
    m.sinks = rng() % 2 ? static_cast<int>(rng() % 6) : 0;
    m.chunk = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 30) : 0;
    const int q = static_cast<int>(rng() % 100);
    const int lo = MaskRangeStart(m, q), ns = MaskSinkCount(m, lo);
    for (int k = 0; k <= q + 1; ++k) {
      const bool listed = (k < ns) || (k >= lo && k <= q);
      CAPTURE(m.window);
      CAPTURE(m.sinks);
      CAPTURE(m.chunk);
      CAPTURE(q);
      CAPTURE(k);
      REQUIRE(listed == MaskAttends(m, q, k));
    }
  }
}

TEST_CASE("bf16 conversion rounds to nearest even and keeps NaN") {
  CHECK(FloatToBf16(1.0f) == 0x3f80);
  CHECK(FloatToBf16(-2.0f) == 0xc000);
  CHECK(Bf16ToFloat(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  CHECK(FloatToBf16(1.0f + 1.0f / 256) == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: rounds up to even.
  CHECK(FloatToBf16(1.0f + 3.0f / 256) == 0x3f82);
  CHECK(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

TEST_CASE("llama3 RoPE scaling keeps high frequencies, divides low ones, blends between") {
  RopeConfig plain;
  plain.head_dim = 128;
  plain.theta = 500000;
  RopeConfig scaled = plain;
  scaled.scaling.type = RopeScaling::Type::kLlama3;
  scaled.scaling.factor = 8;
  const auto a = RopeInvFreq(plain), b = RopeInvFreq(scaled);
  REQUIRE(a.size() == 64);
  for (int i = 0; i < 64; ++i) {
    CHECK(a[i] == doctest::Approx(std::pow(500000.0, -2.0 * i / 128)).epsilon(1e-5));
    const double wavelen = 2 * M_PI / a[i];
    if (wavelen < 8192 / 4.0) CHECK(b[i] == a[i]);
    if (wavelen > 8192 / 1.0) CHECK(b[i] == doctest::Approx(a[i] / 8).epsilon(1e-6));
    CHECK(b[i] <= a[i]);
    CHECK(b[i] >= a[i] / 8 * (1 - 1e-6));
    if (i > 0) CHECK(b[i] < b[i - 1]);  // still strictly decreasing
  }
}

// Qwen3's q_norm/k_norm (RopeKvStoreRef's extras): RMSNorm makes each head's output blind to
// the head's scale, uses its own weights for q and for k, and leaves V alone; a token's
// frequency row picks its rotation.
TEST_CASE("RoPE + KV store reference: per-head q/k RMSNorm before rotating, frequency rows per token") {
  std::mt19937 rng(4);
  const int hq = 4, hkv = 2, d = 16, tokens = 3;
  PagedKvLayout layout{1, hkv, 4, d};
  auto qkv = Random(size_t(tokens) * (hq + 2 * hkv) * d, rng, -3, 3);
  auto q_norm = Random(d, rng, 0.5, 1.5), k_norm = Random(d, rng, 0.5, 1.5);
  std::vector<int32_t> pos = {0, 5, 9}, slots = {0, 1, 2}, rows = {1, 0, 1};
  RopeConfig rc;
  rc.head_dim = d;
  std::vector<float> inv = RopeInvFreq(rc), slow = inv;
  for (float& f : slow) f /= 3;
  std::vector<float> table = inv;  // row 0: plain, row 1: a third of it
  table.insert(table.end(), slow.begin(), slow.end());
  auto run = [&](const std::vector<bf16_bits>& in, const std::vector<float>& freq, const int32_t* row,
                 float eps = 1e-6f) {
    std::vector<bf16_bits> q(size_t(tokens) * hq * d), pool(layout.BlockElems(), 0);
    RopeKvStoreRef(in.data(), pos.data(), slots.data(), freq.data(), q.data(), pool.data(), layout, 0, tokens, hq,
                   true, q_norm.data(), k_norm.data(), eps, row);
    q.insert(q.end(), pool.begin(), pool.end());
    return q;
  };
  const auto base = run(qkv, table, rows.data());
  // Every element times 4 (exact in bf16; eps 0 keeps the norm exactly scale-free): q and K
  // unchanged, V four times larger.
  std::vector<bf16_bits> scaled(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) scaled[i] = FloatToBf16(4 * Bf16ToFloat(qkv[i]));
  const auto by4 = run(scaled, table, rows.data(), 0.f);
  const auto unscaled = run(qkv, table, rows.data(), 0.f);
  const size_t q_elems = size_t(tokens) * hq * d;
  for (size_t i = 0; i < q_elems; ++i) CHECK(by4[i] == unscaled[i]);
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < hkv; ++h)
      for (int i = 0; i < d; ++i) {
        const size_t k = q_elems + layout.Offset(0, 0, 0, h, t) + i, v = q_elems + layout.Offset(0, 0, 1, h, t) + i;
        CHECK(by4[k] == unscaled[k]);
        CHECK(Bf16ToFloat(by4[v]) == 4 * Bf16ToFloat(unscaled[v]));
      }
  // Position 0 does not rotate: token 0's q heads are exactly the normed input.
  for (int h = 0; h < hq; ++h) {
    double ss = 0;
    for (int i = 0; i < d; ++i) ss += std::pow(Bf16ToFloat(qkv[h * d + i]), 2);
    const float inv_rms = static_cast<float>(1 / std::sqrt(ss / d + 1e-6));
    for (int i = 0; i < d; ++i) {
      CHECK(base[h * d + i] == FloatToBf16(Bf16ToFloat(q_norm[i]) * RoundBf16(Bf16ToFloat(qkv[h * d + i]) * inv_rms)));
    }
  }
  // Rows: token t rotates exactly as with its row as the only frequencies.
  const auto plain = run(qkv, inv, nullptr), thirds = run(qkv, slow, nullptr);
  for (int t = 0; t < tokens; ++t) {
    const auto& want = rows[t] == 0 ? plain : thirds;
    for (int i = 0; i < hq * d; ++i) CHECK(base[t * hq * d + i] == want[t * hq * d + i]);
  }
  CHECK(plain != thirds);
}

// Dense causal attention over contiguous K/V, in double.
std::vector<double> DenseAttention(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, int n, int d, double scale) {
  std::vector<double> s(n), o(d, 0);
  double m = -INFINITY, l = 0;
  for (int t = 0; t < n; ++t) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += double(q[i]) * k[t * d + i];
    s[t] = dot * scale;
    m = std::max(m, s[t]);
  }
  for (int t = 0; t < n; ++t) {
    const double w = std::exp(s[t] - m);
    l += w;
    for (int i = 0; i < d; ++i) o[i] += w * v[t * d + i];
  }
  for (auto& x : o) x /= l;
  return o;
}

TEST_CASE("paged attention reference equals dense attention whatever the block size and order") {
  std::mt19937 rng(2);
  const int d = 16, hkv = 2, hq = 4, n = 45;
  auto kv_dense = Random(size_t(2) * hkv * n * d, rng);  // [K,V][head][token][d]
  auto q = Random(size_t(hq) * d, rng, -2, 2);
  for (int block : {2, 5, 16, 64}) {
    PagedKvLayout layout{1, hkv, block, d};
    const int blocks = (n + block - 1) / block;
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    std::vector<bf16_bits> pool(blocks * layout.BlockElems());
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < hkv; ++h)
        for (int t = 0; t < n; ++t)
          for (int i = 0; i < d; ++i)
            pool[layout.Offset(table[t / block], 0, kv, h, t % block) + i] = kv_dense[((kv * hkv + h) * n + t) * d + i];
    std::vector<float> out(hq * d);
    std::vector<int32_t> cu = {0, 1}, lens = {n};
    PagedAttentionRefArgs a;
    a.q = q.data();
    a.kv_pool = pool.data();
    a.block_tables = table.data();
    a.cu_q_lens = cu.data();
    a.seq_lens = lens.data();
    a.out = out.data();
    a.layout = layout;
    a.num_seqs = 1;
    a.num_q_heads = hq;
    a.max_blocks_per_seq = blocks;
    a.scale = 0.25f;
    PagedAttentionRef(a);
    for (int h = 0; h < hq; ++h) {
      const int kvh = h / (hq / hkv);
      std::vector<float> qf(d), kf(n * d), vf(n * d);
      for (int i = 0; i < d; ++i) qf[i] = Bf16ToFloat(q[h * d + i]);
      for (int j = 0; j < n * d; ++j) {
        kf[j] = Bf16ToFloat(kv_dense[(0 * hkv + kvh) * n * d + j]);
        vf[j] = Bf16ToFloat(kv_dense[(1 * hkv + kvh) * n * d + j]);
      }
      auto ref = DenseAttention(qf, kf, vf, n, d, 0.25);
      for (int i = 0; i < d; ++i) CHECK(out[h * d + i] == doctest::Approx(ref[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("RMSNorm reference normalises to unit RMS before the weight, and adds the residual first") {
  std::vector<bf16_bits> x = {FloatToBf16(3), FloatToBf16(4)}, res = {FloatToBf16(1), FloatToBf16(-8)};
  std::vector<bf16_bits> w = {FloatToBf16(1), FloatToBf16(2)}, out(2);
  RmsNormRef(x.data(), res.data(), w.data(), out.data(), 1, 2, 0.f);
  // residual = (4, -4); rms = 4; out = (1, -1) * (1, 2).
  CHECK(Bf16ToFloat(res[0]) == 4.f);
  CHECK(Bf16ToFloat(res[1]) == -4.f);
  CHECK(Bf16ToFloat(out[0]) == 1.f);
  CHECK(Bf16ToFloat(out[1]) == -2.f);
}

TEST_CASE("SiLU-and-mul reference computes silu(gate) * up") {
  std::vector<bf16_bits> gu = {FloatToBf16(0), FloatToBf16(2), FloatToBf16(5), FloatToBf16(3)}, out(2);
  SiluMulRef(gu.data(), out.data(), 1, 2);
  CHECK(Bf16ToFloat(out[0]) == 0.f);
  CHECK(Bf16ToFloat(out[1]) == doctest::Approx(RoundBf16(2 / (1 + std::exp(-2.f))) * 3).epsilon(1e-2));
}

TEST_CASE("RoPE + KV store reference: position 0 is the identity, V lands unrotated in its slot") {
  std::mt19937 rng(3);
  const int hq = 2, hkv = 1, d = 8;
  PagedKvLayout layout{2, hkv, 4, d};
  auto qkv = Random(size_t(2) * (hq + 2 * hkv) * d, rng);
  std::vector<int32_t> pos = {0, 7}, slots = {6, -1};  // token 0 -> block 1 slot 2; token 1 unstored
  RopeConfig rc;
  rc.head_dim = d;
  auto inv = RopeInvFreq(rc);
  std::vector<bf16_bits> q(2 * hq * d), pool(2 * layout.BlockElems(), 0);
  RopeKvStoreRef(qkv.data(), pos.data(), slots.data(), inv.data(), q.data(), pool.data(), layout, 1, 2, hq, true);
  for (int i = 0; i < hq * d; ++i) CHECK(q[i] == qkv[i]);
  for (int i = 0; i < d; ++i) {
    CHECK(pool[layout.Offset(1, 1, 0, 0, 2) + i] == qkv[hq * d + i]);
    CHECK(pool[layout.Offset(1, 1, 1, 0, 2) + i] == qkv[(hq + hkv) * d + i]);
  }
  // Token 1 (position 7) was rotated: the norm of each (i, i + d/2) pair is kept.
  const bf16_bits* in = qkv.data() + (hq + 2 * hkv) * d;
  for (int i = 0; i < d / 2; ++i) {
    const double a = std::hypot(Bf16ToFloat(in[i]), Bf16ToFloat(in[i + d / 2]));
    const double b = std::hypot(Bf16ToFloat(q[hq * d + i]), Bf16ToFloat(q[hq * d + i + d / 2]));
    CHECK(b == doctest::Approx(a).epsilon(2e-2));
  }
  int stored = 0;
  for (auto v : pool) stored += v != 0;
  CHECK(stored <= 2 * d);  // only token 0's K and V
}

TEST_CASE("sampling reference: greedy, top-k, top-p and seeded draws") {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0, 2);
  const int vocab = 300;
  std::vector<float> logits(vocab);
  for (auto& l : logits) l = nd(rng);
  const int argmax = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  SamplingRow greedy;
  CHECK(SampleRef(logits.data(), vocab, greedy) == argmax);

  SamplingRow topk{1.0f, 10, 1.0f, 7, 0};
  auto pk = SamplingDistributionRef(logits.data(), vocab, topk);
  CHECK(std::count_if(pk.begin(), pk.end(), [](double p) { return p > 0; }) == 10);
  CHECK(std::accumulate(pk.begin(), pk.end(), 0.0) == doctest::Approx(1.0));

  SamplingRow topp{0.8f, 0, 0.5f, 7, 0};
  auto pp = SamplingDistributionRef(logits.data(), vocab, topp);
  SamplingRow full{0.8f, 0, 1.0f, 7, 0};
  auto pf = SamplingDistributionRef(logits.data(), vocab, full);
  // The kept set is the smallest top set with at least half the mass.
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double mass = 0;
  int needed = 0;
  while (mass < 0.5) mass += pf[order[needed++]];
  for (int i = 0; i < vocab; ++i) CHECK((pp[order[i]] > 0) == (i < needed));

  // Seeded: same (seed, step) gives the same token; draws follow the distribution.
  CHECK(SampleRef(logits.data(), vocab, topk) == SampleRef(logits.data(), vocab, topk));
  std::vector<int> counts(vocab, 0);
  const int draws = 20000;
  for (int s = 0; s < draws; ++s) {
    SamplingRow r = topk;
    r.step = s;
    const int t = SampleRef(logits.data(), vocab, r);
    REQUIRE(pk[t] > 0);
    counts[t]++;
  }
  for (int v = 0; v < vocab; ++v) {
    const double sd = std::sqrt(draws * pk[v] * (1 - pk[v]));
    CHECK(std::abs(counts[v] - draws * pk[v]) <= 5 * sd + 1);
  }
}

TEST_CASE("sampling reference: adjustments replace their tokens' logits first; min_p keeps p >= min_p * p_max") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 2);
  const int vocab = 400;
  std::vector<float> logits(vocab);
  for (auto& l : logits) l = nd(rng);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });

  SamplingRow banned;  // greedy, the argmax biased away, the runner-up penalised below the third
  banned.adjust = {{order[0], -100.0f, 1.0f, 0.0f}, {order[1], 0.0f, 1.0f, logits[order[1]] - logits[order[2]] + 0.5f}};
  std::sort(banned.adjust.begin(), banned.adjust.end(), [](auto& a, auto& b) { return a.token < b.token; });
  CHECK(SampleRef(logits.data(), vocab, banned) == order[2]);
  const std::vector<float> adjusted = AdjustedRowRef(logits.data(), vocab, banned);
  CHECK(adjusted[order[0]] == logits[order[0]] - 100.0f);
  CHECK(adjusted[order[3]] == logits[order[3]]);

  SamplingRow minp;
  minp.temperature = 0.7f;
  minp.min_p = 0.05f;
  const auto pm = SamplingDistributionRef(logits.data(), vocab, minp);
  const double top = logits[order[0]];
  int kept = 0;
  for (int i = 0; i < vocab; ++i) {
    const double rel = std::exp((logits[i] - top) / 0.7);  // p_i / p_max
    if (std::fabs(rel - 0.05) < 1e-6) continue;  // too close to the threshold to call
    CHECK((pm[i] > 0) == (rel >= 0.05));
    kept += pm[i] > 0;
  }
  CHECK(kept > 1);
  CHECK(kept < vocab);
}

TEST_CASE("logprobs reference: log-softmax in double, top entries descending with the lowest id on ties") {
  std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.0f};
  const LogprobsRef lp = RowLogprobsRef(logits.data(), 5, 3, 3);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l));
  CHECK(lp.token_logprob == doctest::Approx(-1.0 - std::log(sum)));
  CHECK(lp.top_tokens == std::vector<int32_t>{1, 2, 4});
  CHECK(lp.top_logprobs[2] == doctest::Approx(1.0 - std::log(sum)));
}

TEST_CASE("gemv reference: each output is the dot product of its weight row and x row, plus bias") {
  // w = [[1, 2], [3, -4], [0.5, 0]], x = [[1, 1], [2, -1]], bias = [10, 0, -1].
  const std::vector<bf16_bits> w = {FloatToBf16(1), FloatToBf16(2), FloatToBf16(3), FloatToBf16(-4),
                                    FloatToBf16(0.5f), FloatToBf16(0)};
  const std::vector<bf16_bits> x = {FloatToBf16(1), FloatToBf16(1), FloatToBf16(2), FloatToBf16(-1)};
  const std::vector<bf16_bits> bias = {FloatToBf16(10), FloatToBf16(0), FloatToBf16(-1)};
  std::vector<float> y(6, NAN);
  GemvRef(w.data(), x.data(), nullptr, y.data(), 3, 2, 2);
  CHECK(y == std::vector<float>{3, -1, 0.5f, 0, 10, 1});
  GemvRef(w.data(), x.data(), bias.data(), y.data(), 3, 2, 2);
  CHECK(y == std::vector<float>{13, -1, -0.5f, 10, 10, 0});
}

}  // namespace
}  // namespace kvfleet::kernels
