// The cpu backend's mixture-of-experts MLP: routing as transformers' Mixtral, Qwen3-MoE and
// Llama 4 routers compute it, the block against a naive per-token reference at several batch
// sizes, experts split over tensor-parallel ranks, and MoE models whose logits do not
// depend on how a prompt is chunked.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/bf16.h"
#include "kernels/moe_ref.h"
#include "kernels/small_kernels_ref.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/cpu_moe.h"
#include "worker/backend/cpu/thread_pool.h"

namespace kvfleet::backend::cpu {
namespace {

// Deterministic values in [-a, a).
std::vector<float> Random(size_t n, float a, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = a * (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
  return v;
}

struct Block {
  model::MoeConfig moe;
  int64_t H = 0, I = 0;
  CpuLayerWeights w;
};

Block MakeBlock(int64_t E, int64_t k, bool normalize, int64_t H, int64_t I, uint64_t seed) {
  Block b;
  b.moe.num_experts = E;
  b.moe.experts_per_token = k;
  b.moe.expert_intermediate = I;
  b.moe.norm_topk_prob = normalize;
  b.H = H;
  b.I = I;
  b.w.router = Random(static_cast<size_t>(E * H), 2.0f / std::sqrt(static_cast<float>(H)) * 2, seed);
  for (int64_t e = 0; e < E; ++e) {
    b.w.expert_gate_up.push_back(Random(static_cast<size_t>(2 * I * H), std::sqrt(3.0f / H), seed + 100 + e));
    b.w.expert_down.push_back(Random(static_cast<size_t>(H * I), std::sqrt(3.0f / I), seed + 200 + e));
  }
  return b;
}

// The block token by token in double, as modeling_mixtral.py reads: softmax over all
// experts, top k (stable: lower id first on ties), optional renormalisation, Σ w·expert(x).
std::vector<double> Naive(const Block& b, const std::vector<float>& x, int64_t T) {
  const int64_t E = b.moe.num_experts, k = b.moe.experts_per_token, H = b.H, I = b.I;
  std::vector<double> out(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = &x[t * H];
    std::vector<double> p(E);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t h = 0; h < H; ++h) p[e] += static_cast<double>(b.w.router[e * H + h]) * xt[h];
    }
    const double zmax = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += v = std::exp(v - zmax);
    for (double& v : p) v /= sum;
    std::vector<int64_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t c) { return p[a] > p[c]; });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[ids[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[j];
      const double w = b.moe.norm_topk_prob ? p[e] / chosen : p[e];
      const std::vector<float>& gu = b.w.expert_gate_up[e];
      std::vector<double> act(I);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; ++h) {
          g += static_cast<double>(gu[i * H + h]) * xt[h];
          u += static_cast<double>(gu[(I + i) * H + h]) * xt[h];
        }
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < H; ++h) {
        double d = 0;
        for (int64_t i = 0; i < I; ++i) d += static_cast<double>(b.w.expert_down[e][h * I + i]) * act[i];
        out[t * H + h] += w * d;
      }
    }
  }
  return out;
}

double MaxDiff(const std::vector<double>& want, const std::vector<float>& got) {
  double d = 0;
  for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::fabs(want[i] - got[i]));
  return d;
}

TEST_CASE("routing: softmax over every expert, the top k by probability, renormalised only when asked") {
  // p = softmax(1, 3, 2, 3): experts 1 and 3 tie; the lower id comes first, as torch.topk's.
  const float logits[4] = {1.0f, 3.0f, 2.0f, 3.0f};
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  int32_t experts[3];
  float weights[3];
  RouteTopK(logits, 1, 4, 3, false, experts, weights);
  CHECK(experts[0] == 1);
  CHECK(experts[1] == 3);
  CHECK(experts[2] == 2);
  CHECK(weights[0] == doctest::Approx(std::exp(3.0) / z).epsilon(1e-6));
  CHECK(weights[2] == doctest::Approx(std::exp(2.0) / z).epsilon(1e-6));
  RouteTopK(logits, 1, 4, 2, true, experts, weights);
  CHECK(weights[0] == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(weights[1] == doctest::Approx(0.5).epsilon(1e-6));
  // Large logits: the softmax subtracts the maximum and stays finite.
  const float big[2] = {1000.0f, 999.0f};
  RouteTopK(big, 1, 2, 1, false, experts, weights);
  CHECK(experts[0] == 0);
  CHECK(weights[0] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
}

TEST_CASE("Llama 4 routing: the top k by logit, each weighted sigmoid(logit), never renormalised") {
  const float logits[8] = {-1.0f, 2.0f, 0.5f, 2.0f,  // token 0: experts 1 and 3 tie
                           4.0f, -3.0f, 1.0f, 0.0f};
  int32_t experts[4];
  float weights[4];
  RouteTopKSigmoid(logits, 2, 4, 2, experts, weights);
  CHECK(experts[0] == 1);
  CHECK(experts[1] == 3);
  CHECK(experts[2] == 0);
  CHECK(experts[3] == 2);
  CHECK(weights[0] == doctest::Approx(1.0 / (1.0 + std::exp(-2.0))).epsilon(1e-6));
  CHECK(weights[2] == doctest::Approx(1.0 / (1.0 + std::exp(-4.0))).epsilon(1e-6));
  CHECK(weights[3] == doctest::Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));
}

TEST_CASE("the MoE block equals a naive per-token reference at every batch size and top-k") {
  ThreadPool pool(2);
  for (int64_t k : {1, 2, 3}) {
    for (bool normalize : {false, true}) {
      // H and I not multiples of 8: the products' tails are exercised too.
      const Block b = MakeBlock(8, k, normalize, 44, 28, static_cast<uint64_t>(k * 2 + normalize));
      for (int64_t T : {1, 2, 7, 40}) {
        CAPTURE(k);
        CAPTURE(normalize);
        CAPTURE(T);
        const std::vector<float> x = Random(static_cast<size_t>(T * b.H), 1.5f, static_cast<uint64_t>(T));
        std::vector<float> out(static_cast<size_t>(T * b.H), 123.0f);  // overwritten, not added to
        MoeScratch scratch;
        MoeMlp(pool, b.moe, b.w, x.data(), T, b.H, b.I, &scratch, out.data());
        const std::vector<double> want = Naive(b, x, T);
        CHECK(MaxDiff(want, out) <= 1e-5);
        // Not a vacuous comparison: the block's output is of unit scale.
        CHECK(*std::max_element(want.begin(), want.end()) > 0.1);
        // top-1 without renormalisation scales an expert by p < 1; with it, by exactly 1.
        if (k == 1 && T == 1) CHECK((scratch.weights[0] == 1.0f) == normalize);
      }
    }
  }
}

TEST_CASE("experts split over ranks by intermediate columns sum to the whole block") {
  ThreadPool pool(1);
  const Block whole = MakeBlock(6, 2, true, 32, 24, 9);
  const int64_t T = 9, H = whole.H, I = whole.I;
  const std::vector<float> x = Random(static_cast<size_t>(T * H), 1.0f, 3);
  std::vector<float> want(static_cast<size_t>(T * H));
  MoeScratch scratch;
  MoeMlp(pool, whole.moe, whole.w, x.data(), T, H, I, &scratch, want.data());
  std::vector<float> sum(static_cast<size_t>(T * H), 0.0f);
  for (int r = 0; r < 2; ++r) {  // rank r: gate and up rows [r·I/2, (r+1)·I/2), down's columns alike
    Block part = whole;
    const int64_t half = I / 2;
    for (int64_t e = 0; e < whole.moe.num_experts; ++e) {
      std::vector<float> gu, down;
      for (int64_t row : {r * half, I + r * half}) {
        gu.insert(gu.end(), whole.w.expert_gate_up[e].begin() + row * H,
                  whole.w.expert_gate_up[e].begin() + (row + half) * H);
      }
      for (int64_t h = 0; h < H; ++h) {
        const auto* src = &whole.w.expert_down[e][h * I + r * half];
        down.insert(down.end(), src, src + half);
      }
      part.w.expert_gate_up[e] = gu;
      part.w.expert_down[e] = down;
    }
    std::vector<float> out(static_cast<size_t>(T * H));
    MoeMlp(pool, part.moe, part.w, x.data(), T, H, half, &scratch, out.data());
    for (size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
  }
  float d = 0;
  for (size_t i = 0; i < sum.size(); ++i) d = std::max(d, std::fabs(sum[i] - want[i]));
  CHECK(d <= 1e-5f);
}

// The cuda backend's MoE pipeline as its kernels' CPU references compute it (bf16 storage,
// kernels/moe_ref.h) against this block in fp32: on every token both route alike, the
// outputs agree within bf16 rounding. So the two backends' MoE math is one.
TEST_CASE("the GPU kernels' bf16 pipeline computes this fp32 block, up to bf16 rounding") {
  using kernels::bf16_bits;
  ThreadPool pool(1);
  const int64_t E = 8, k = 2, H = 64, I = 32, T = 24;
  Block b = MakeBlock(E, k, true, H, I, 77);
  auto to_bf16 = [](std::vector<float>& v) {
    std::vector<bf16_bits> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      out[i] = kernels::FloatToBf16(v[i]);
      v[i] = kernels::Bf16ToFloat(out[i]);  // the fp32 block sees the same weights
    }
    return out;
  };
  std::vector<float> x = Random(static_cast<size_t>(T * H), 1.0f, 78);
  const std::vector<bf16_bits> xb = to_bf16(x);
  const std::vector<bf16_bits> router = to_bf16(b.w.router);
  std::vector<bf16_bits> gate_up, down;
  for (int64_t e = 0; e < E; ++e) {
    const auto gu = to_bf16(b.w.expert_gate_up[e]);
    const auto d = to_bf16(b.w.expert_down[e]);
    gate_up.insert(gate_up.end(), gu.begin(), gu.end());
    down.insert(down.end(), d.begin(), d.end());
  }
  std::vector<float> want(static_cast<size_t>(T * H));
  MoeScratch scratch;
  MoeMlp(pool, b.moe, b.w, x.data(), T, H, I, &scratch, want.data());

  const int32_t S = static_cast<int32_t>(T * k);
  std::vector<bf16_bits> logits(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0;
      for (int64_t h = 0; h < H; ++h) acc += b.w.router[e * H + h] * x[t * H + h];
      logits[t * E + e] = kernels::FloatToBf16(acc);
    }
  }
  std::vector<int32_t> experts(S), sorted(S), position(S), offsets(E + 1), tiles(E + 1);
  std::vector<float> weights(S);
  kernels::MoeRouteRef(logits.data(), E, T, E, k, true, experts.data(), weights.data());
  kernels::MoeGroupRef(experts.data(), S, E, sorted.data(), position.data(), offsets.data(), tiles.data());
  std::vector<bf16_bits> gu_out(static_cast<size_t>(S) * 2 * I), act(static_cast<size_t>(S) * I),
      y(static_cast<size_t>(S) * H), out(static_cast<size_t>(T * H));
  kernels::MoeGroupedGemmRef(gate_up.data(), xb.data(), sorted.data(), k, offsets.data(), gu_out.data(), S, E, 2 * I, H);
  kernels::SiluMulRef(gu_out.data(), act.data(), S, I);
  kernels::MoeGroupedGemmRef(down.data(), act.data(), sorted.data(), 0, offsets.data(), y.data(), S, E, H, I);
  kernels::MoeCombineRef(y.data(), weights.data(), position.data(), out.data(), T, k, H);

  CHECK(experts == scratch.experts);
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = kernels::Bf16ToFloat(out[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  CHECK(std::sqrt(num / den) <= 1e-2);  // bf16 keeps 8 bits: a few 2^-9 roundings on the way
  CHECK(den > 0);
}

// All rows' logits of `tokens` prefilled in chunks of `chunk` (0: whole).
std::vector<float> PrefillLogits(ModelBackend& b, const std::vector<TokenId>& tokens, int64_t chunk,
                                 BlockId first_block) {
  std::vector<BlockId> table;
  for (int64_t i = 0; i < (static_cast<int64_t>(tokens.size()) + 7) / 8; ++i) table.push_back(first_block + i);
  std::vector<float> all;
  for (size_t pos = 0; pos < tokens.size();) {
    const size_t n = chunk > 0 ? std::min<size_t>(chunk, tokens.size() - pos) : tokens.size();
    StepBatch batch;
    SequenceStep s;
    s.start_position = static_cast<int64_t>(pos);
    s.tokens = std::span<const TokenId>(tokens).subspan(pos, n);
    s.block_tables = {table};
    s.logits = LogitsRequest::kAll;
    batch.seqs.push_back(s);
    StepOutput out;
    Status st = b.Execute(batch, &out);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    all.insert(all.end(), out.logits.begin(), out.logits.end());
    pos += n;
  }
  return all;
}

TEST_CASE("an MoE model's logits do not depend on how its prompt is chunked") {
  for (const char* shape : {"tiny-mixtral", "tiny-qwen3-moe"}) {
    CAPTURE(shape);
    BackendOptions o;
    o.model_dir = testing::RandomModelDir(shape, 11);
    o.block_size = 8;
    o.num_blocks = 64;
    o.max_context = 256;
    o.threads = 2;
    auto b = CreateBackend("cpu", o);
    REQUIRE_MESSAGE(b.ok(), b.status().ToString());
    std::vector<TokenId> tokens;
    for (int i = 0; i < 28; ++i) tokens.push_back(static_cast<TokenId>((i * 7919 + 17) % 32000));
    const std::vector<float> whole = PrefillLogits(**b, tokens, 0, 0);
    const std::vector<float> chunked = PrefillLogits(**b, tokens, 9, 8);  // 9, 9, 9, then 1 token: a decode step
    REQUIRE(whole.size() == chunked.size());
    float d = 0, scale = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      d = std::max(d, std::fabs(whole[i] - chunked[i]));
      scale = std::max(scale, std::fabs(whole[i]));
    }
    CHECK(d <= 1e-4f);
    CHECK(scale > 1.0f);
  }
}

}  // namespace
}  // namespace kvfleet::backend::cpu
