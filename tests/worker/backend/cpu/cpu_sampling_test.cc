// The cpu backend's logprobs and logit processing, end to end through Execute: logprobs are
// the log-softmax of its own fp32 logits (|Δ| <= 1e-3 against double), their differences
// match transformers' logits on the fixtures, prompt logprobs cover every prompt token after
// the first, and the sampled token is the one the adjusted logits pick.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "kernels/sampling_common.h"
#include "tests/worker/backend/cpu/reference.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"

namespace kvfleet::backend {
namespace {

std::unique_ptr<ModelBackend> MakeBackend(const std::string& shape, uint64_t seed) {
  BackendOptions o;
  o.model_dir = testing::RandomModelDir(shape, seed);
  o.block_size = 8;
  o.num_blocks = 64;
  o.max_context = 512;
  o.threads = 2;
  auto b = CreateBackend("cpu", o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

// log-softmax in double of one row.
std::vector<double> LogSoftmax(std::span<const float> row) {
  const double max = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(x - max);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = row[i] - max - std::log(sum);
  return out;
}

// One step over `history` from position 0, sampling after its last token (seeded `seed`), every
// row's logits back; prompt logprobs as p asks.
StepOutput RunAll(ModelBackend& b, std::span<const TokenId> history, int64_t prompt_len, const SamplingParams& p,
                  uint64_t seed = 0) {
  std::vector<BlockId> table(history.size() / b.block_size() + 1);
  std::iota(table.begin(), table.end(), 0);
  SequenceStep s;
  s.tokens = history;
  s.history = history;
  s.prompt_len = prompt_len;
  s.block_tables = {table};
  s.sample = true;
  s.sampling = &p;
  s.seed = seed;
  s.prompt_logprobs = p.prompt_logprobs;
  s.logits = LogitsRequest::kAll;
  StepBatch batch;
  batch.seqs.push_back(s);
  StepOutput out;
  Status st = b.Execute(batch, &out);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return out;
}

std::vector<TokenId> Tokens(int n, int salt) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 7919 + salt * 104729 + 17) % 32000));
  return t;
}

TEST_CASE("cpu backend: prompt and sampled logprobs are log-softmax of its fp32 logits, top entries its largest") {
  auto b = MakeBackend("tiny", 1);
  const int64_t V = b->config().vocab_size;
  const std::vector<TokenId> prompt = Tokens(21, 3);
  const StepOutput out = RunAll(*b, prompt, static_cast<int64_t>(prompt.size()),
                                {.temperature = 0.8f, .logprobs = 5, .prompt_logprobs = true}, 5);
  REQUIRE(out.prompt_logprobs[0].size() == prompt.size() - 1);
  double worst = 0;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    const std::span<const float> row(&out.logits[p * V], V);
    const std::vector<double> ref = LogSoftmax(row);
    const TokenLogprobs& lp = out.prompt_logprobs[0][p];
    CHECK(lp.token == prompt[p + 1]);
    worst = std::max(worst, std::fabs(lp.logprob - ref[prompt[p + 1]]));
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int32_t a, int32_t c) { return row[a] > row[c] || (row[a] == row[c] && a < c); });
    REQUIRE(lp.top.size() == 5);
    for (int k = 0; k < 5; ++k) {
      CHECK(lp.top[k].first == static_cast<TokenId>(order[k]));
      worst = std::max(worst, std::fabs(lp.top[k].second - ref[order[k]]));
    }
  }
  const size_t last = prompt.size() - 1;
  const std::vector<double> ref = LogSoftmax(std::span<const float>(&out.logits[last * V], V));
  CHECK(out.logprobs[0].token == out.tokens[0]);
  worst = std::max(worst, std::fabs(out.logprobs[0].logprob - ref[out.tokens[0]]));
  CHECK(worst <= 1e-3);
  MESSAGE("max |logprob - double log-softmax| " << worst);
}

TEST_CASE("cpu backend: logprob differences between top entries match transformers' logits on the fixtures") {
  for (const std::string& name : testing::TinyReferenceModels(testing::TestDataDir() + "/model")) {
    const testing::Reference ref = testing::Reference::Load(testing::TestDataDir() + "/model", name);
    auto b = MakeBackend(ref.shape, ref.seed);
    const std::vector<TokenId>& prompt = ref.prompts[1];
    const StepOutput out = RunAll(*b, prompt, static_cast<int64_t>(prompt.size()),
                                  {.temperature = 0.0f, .logprobs = 8, .prompt_logprobs = true});
    const int64_t cols = ref.top_k + static_cast<int64_t>(ref.stride_columns.size());
    double worst = 0;
    for (size_t p = 0; p + 1 < prompt.size(); ++p) {
      const TokenLogprobs& lp = out.prompt_logprobs[0][p];
      const float* hf = &ref.values[(ref.row0[1] + p) * cols];  // transformers' 8 largest logits
      for (int k = 1; k < 8; ++k) {
        // A log-softmax difference is the logit difference: no normalizer needed.
        worst = std::max(worst, static_cast<double>(std::fabs((lp.top[k].second - lp.top[0].second) - (hf[k] - hf[0]))));
      }
    }
    INFO(name);
    CHECK(worst <= 2e-3);  // two logits, each within the parity tests' 1e-3
  }
}

// The kept-token rule of each penalty, written out independently of BuildLogitAdjusts.
std::vector<float> Adjusted(std::span<const float> raw, std::span<const TokenId> history, size_t prompt_len,
                            const SamplingParams& p) {
  std::vector<float> l(raw.begin(), raw.end());
  std::map<TokenId, int> generated;
  std::map<TokenId, bool> seen;
  for (size_t i = 0; i < history.size(); ++i) {
    seen[history[i]] = true;
    if (i >= prompt_len) ++generated[history[i]];
  }
  for (auto [t, bias] : p.logit_bias) l[t] += bias;
  for (auto [t, _] : seen) l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
  for (auto [t, n] : generated) l[t] -= p.frequency_penalty * n + p.presence_penalty;
  return l;
}

TEST_CASE("cpu backend: greedy with penalties and logit_bias is the argmax of the adjusted logits; min_p bounds draws") {
  auto b = MakeBackend("tiny", 1);
  const int64_t V = b->config().vocab_size;
  int changed = 0;  // cases where the adjustments moved the argmax: the check is not vacuous
  for (int salt = 0; salt < 6; ++salt) {
    std::vector<TokenId> history = Tokens(12, 9 + salt);
    const size_t prompt_len = history.size();
    // "Generated" tokens with repeats, led by the prompt's own next-token argmax.
    const TokenId top = RunAll(*b, history, static_cast<int64_t>(prompt_len), {.temperature = 0.0f}).tokens[0];
    for (TokenId t : {top, history[3], top, static_cast<TokenId>(77 + salt), history[3], top}) history.push_back(t);
    const std::vector<std::pair<TokenId, float>> bias = {{5, 2.5f}, {history[0], -3.0f}};
    SamplingParams p{.temperature = 0.0f, .presence_penalty = 1.0f, .frequency_penalty = 1.5f,
                     .repetition_penalty = 1.8f, .logit_bias = bias};
    const StepOutput out = RunAll(*b, history, static_cast<int64_t>(prompt_len), p);
    const std::span<const float> raw(&out.logits[(history.size() - 1) * V], V);
    const std::vector<float> adj = Adjusted(raw, history, prompt_len, p);
    const TokenId want = static_cast<TokenId>(std::max_element(adj.begin(), adj.end()) - adj.begin());
    CHECK(out.tokens[0] == want);
    changed += want != static_cast<TokenId>(std::max_element(raw.begin(), raw.end()) - raw.begin());

    // min_p at temperature 1: every draw is at least min_p times as likely as the top token.
    const float max_adj = *std::max_element(adj.begin(), adj.end());
    for (uint64_t seed = 0; seed < 4; ++seed) {
      SamplingParams q = p;
      q.temperature = 1.0f;
      q.min_p = 0.3f;
      const StepOutput o = RunAll(*b, history, static_cast<int64_t>(prompt_len), q, seed);
      CHECK(adj[o.tokens[0]] >= max_adj + std::log(0.3f) - 1e-5f);
    }
  }
  CHECK(changed > 0);
}

// Constrained decoding's late masks (StepBatch::fill_token_bitmask): asked for once per
// constrained row, after the forward pass (the logits row is there to compare against), and
// the draw is the best raw logit among the allowed tokens; a late mask allowing nothing fails
// the step with InvalidArgument.
TEST_CASE("cpu backend: a late token bitmask is filled once per constrained row and bounds the draw") {
  auto b = MakeBackend("tiny", 1);
  const int64_t V = b->config().vocab_size;
  const std::vector<TokenId> history = Tokens(10, 4);
  const SamplingParams greedy{.temperature = 0.0f};
  const StepOutput raw = RunAll(*b, history, static_cast<int64_t>(history.size()), greedy);
  const std::span<const float> row(&raw.logits[(history.size() - 1) * V], V);
  // Allowed: every third token but the raw argmax.
  std::vector<uint32_t> allowed(grammar::BitmaskWords(static_cast<size_t>(V)), 0);
  for (int64_t t = 0; t < V; t += 3) allowed[t / 32] |= 1u << (t % 32);
  allowed[raw.tokens[0] / 32] &= ~(1u << (raw.tokens[0] % 32));
  int64_t best = -1;
  for (int64_t t = 0; t < V; ++t) {
    if (kernels::TokenAllowed(allowed.data(), t) && (best < 0 || row[t] > row[best])) best = t;
  }
  std::vector<BlockId> table(history.size() / b->block_size() + 1);
  std::iota(table.begin(), table.end(), 0);
  SequenceStep s;
  s.tokens = history;
  s.history = history;
  s.prompt_len = static_cast<int64_t>(history.size());
  s.block_tables = {table};
  s.sample = true;
  s.sampling = &greedy;
  s.late_token_bitmask = true;
  StepBatch batch;
  batch.seqs = {s};
  int calls = 0;
  batch.fill_token_bitmask = [&](size_t i, std::span<uint32_t> mask) {
    ++calls;
    CHECK(i == 0);
    CHECK(mask.size() == allowed.size());
    std::copy_n(allowed.begin(), std::min(mask.size(), allowed.size()), mask.begin());
  };
  StepOutput out;
  REQUIRE(b->Execute(batch, &out).ok());
  CHECK(calls == 1);
  CHECK(out.tokens[0] == static_cast<TokenId>(best));

  batch.fill_token_bitmask = [](size_t, std::span<uint32_t> mask) { std::fill(mask.begin(), mask.end(), 0u); };
  const Status st = b->Execute(batch, &out);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("allows no token") != std::string::npos);
  batch.fill_token_bitmask = nullptr;  // a late row needs a filler: refused before anything runs
  CHECK(b->Execute(batch, &out).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfleet::backend
