// The fp8 e4m3 KV cache against the bf16 one on the cuda backend, per model directory (the
// test fixtures, or a llama-3.1-8b-shaped random model from `kvfleet make-model`):
//
//   kv_accuracy_bench --model DIR [--model DIR]... [--positions N] [--steps N]
//
//   logits   a long prompt (--positions tokens, default 1024; fixed pseudo-random ids)
//            prefilled in 256-token chunks by both backends with every row's logits: max and
//            mean |Δlogit| over all rows and the vocabulary, and the mean KL(bf16 || fp8) of
//            the next-token distributions (softmax of the rows) over the positions
//   greedy   --steps (default 256) decode steps from a 32-token prompt: the step of the first
//            different token when each runs free, and, with fp8 fed bf16's tokens (teacher
//            forcing), the share of steps whose greedy token is the same
//
// Both backends run side by side on one GPU with 2 GiB of KV each; the fp8 one calibrates its
// scales at start-up (or reads the checkpoint's). Prints one block per model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "worker/backend/backend.h"

using namespace kvfleet;

namespace {

constexpr int64_t kChunk = 256;
constexpr int kGreedyPrompt = 32;

std::unique_ptr<backend::ModelBackend> MakeBackend(const std::string& dir, backend::KvCacheDtype dtype, int64_t ctx) {
  backend::BackendOptions o;
  o.model_dir = dir;
  o.block_size = 16;
  o.max_num_tokens = static_cast<int32_t>(kChunk);
  o.max_batch_size = 8;
  o.max_context = ctx;
  o.kv_cache_bytes = 2ull << 30;
  o.kv_cache_dtype = dtype;
  auto b = backend::CreateBackend("cuda", o);
  if (!b.ok()) {
    std::fprintf(stderr, "%s (%s): %s\n", dir.c_str(), std::string(backend::KvCacheDtypeName(dtype)).c_str(),
                 b.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(b).value();
}

std::vector<backend::BlockId> Table(int64_t tokens, int64_t B) {
  std::vector<backend::BlockId> t(static_cast<size_t>((tokens + B - 1) / B));
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<backend::BlockId>(i);
  return t;
}

// Runs tokens [pos, pos + n) of `toks` as one step; returns the step's output.
backend::StepOutput Step(backend::ModelBackend& b, const std::vector<TokenId>& toks, int64_t pos, int64_t n,
                         const std::vector<backend::BlockId>& table, backend::LogitsRequest logits) {
  backend::SequenceStep st;
  st.tokens = std::span<const TokenId>(toks).subspan(static_cast<size_t>(pos), static_cast<size_t>(n));
  st.start_position = pos;
  st.block_tables.assign(b.pools().size(), std::span<const backend::BlockId>(table));
  st.sample = true;
  st.history = std::span<const TokenId>(toks).subspan(0, static_cast<size_t>(pos + n));
  st.prompt_len = pos + n;
  st.logits = logits;
  backend::StepBatch batch;
  batch.seqs = {st};
  backend::StepOutput out;
  const Status s = b.Execute(batch, &out);
  if (!s.ok()) {
    std::fprintf(stderr, "step at %lld: %s\n", static_cast<long long>(pos), s.ToString().c_str());
    std::exit(1);
  }
  return out;
}

// KL(p || q) of the softmaxes of two logit rows, in double.
double Kl(const float* a, const float* b, int64_t V) {
  const double ma = *std::max_element(a, a + V), mb = *std::max_element(b, b + V);
  double za = 0, zb = 0;
  for (int64_t i = 0; i < V; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
  const double la = std::log(za) + ma, lb = std::log(zb) + mb;
  double kl = 0;
  for (int64_t i = 0; i < V; ++i) {
    const double lp = a[i] - la, lq = b[i] - lb;
    kl += std::exp(lp) * (lp - lq);
  }
  return kl;
}

void RunModel(const std::string& dir, int64_t positions, int steps) {
  const int64_t ctx = std::max<int64_t>(positions + 1, kGreedyPrompt + steps + 1) + 16;
  auto bf = MakeBackend(dir, backend::KvCacheDtype::kBf16, ctx);
  auto f8 = MakeBackend(dir, backend::KvCacheDtype::kFp8E4m3, ctx);
  const int64_t V = bf->config().vocab_size, B = bf->block_size();
  std::printf("%s: %lld layers, %lld KV heads x %lld, vocab %lld; KV blocks bf16 %lld, fp8 %lld\n", dir.c_str(),
              static_cast<long long>(bf->config().num_layers), static_cast<long long>(bf->config().num_kv_heads),
              static_cast<long long>(bf->config().head_dim), static_cast<long long>(V),
              static_cast<long long>(bf->pools()[0].device_blocks), static_cast<long long>(f8->pools()[0].device_blocks));

  // Logits over a long prompt.
  std::vector<TokenId> prompt(static_cast<size_t>(positions));
  for (int64_t i = 0; i < positions; ++i) prompt[i] = static_cast<TokenId>((i * 7919 + 13) % V);
  const auto table = Table(ctx, B);
  double max_d = 0, sum_d = 0, sum_kl = 0, max_kl = 0;
  int64_t rows = 0;
  for (int64_t pos = 0; pos < positions; pos += kChunk) {
    const int64_t n = std::min(kChunk, positions - pos);
    const backend::StepOutput a = Step(*bf, prompt, pos, n, table, backend::LogitsRequest::kAll);
    const backend::StepOutput b = Step(*f8, prompt, pos, n, table, backend::LogitsRequest::kAll);
    for (int64_t r = 0; r < n; ++r) {
      const float* x = a.logits.data() + r * V;
      const float* y = b.logits.data() + r * V;
      for (int64_t i = 0; i < V; ++i) {
        const double d = std::fabs(double(x[i]) - y[i]);
        max_d = std::max(max_d, d);
        sum_d += d;
      }
      const double kl = Kl(x, y, V);
      sum_kl += kl;
      max_kl = std::max(max_kl, kl);
      ++rows;
    }
  }
  std::printf("  logits over %lld positions: max |dlogit| %.4g, mean |dlogit| %.4g; KL(bf16||fp8) mean %.3g, max %.3g\n",
              static_cast<long long>(rows), max_d, sum_d / (double(rows) * V), sum_kl / rows, max_kl);

  // Greedy: free running, then fp8 teacher-forced with bf16's tokens.
  std::vector<TokenId> gp(prompt.begin(), prompt.begin() + kGreedyPrompt);
  auto greedy = [&](backend::ModelBackend& m, const std::vector<TokenId>* forced, std::vector<TokenId>* chosen) {
    std::vector<TokenId> toks = gp;
    chosen->clear();
    for (int s = 0; s <= steps; ++s) {
      const int64_t pos = s == 0 ? 0 : static_cast<int64_t>(toks.size()) - 1;
      const int64_t n = s == 0 ? kGreedyPrompt : 1;
      const backend::StepOutput o = Step(m, toks, pos, n, table, backend::LogitsRequest::kNone);
      chosen->push_back(o.tokens[0]);
      toks.push_back(forced != nullptr ? (*forced)[s] : o.tokens[0]);
    }
  };
  std::vector<TokenId> ref, free8, forced8;
  greedy(*bf, nullptr, &ref);
  greedy(*f8, nullptr, &free8);
  greedy(*f8, &ref, &forced8);
  int first_diff = -1, same = 0;
  for (int s = 0; s <= steps; ++s) {
    if (first_diff < 0 && free8[s] != ref[s]) first_diff = s;
    same += forced8[s] == ref[s];
  }
  std::printf("  greedy over %d steps: free-running identical %s; teacher-forced agreement %d/%d (%.1f%%)\n", steps,
              first_diff < 0 ? "throughout" : ("until step " + std::to_string(first_diff)).c_str(), same, steps + 1,
              100.0 * same / (steps + 1));
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: kv_accuracy_bench --model DIR [--model DIR]... [--positions N] [--steps N]\n";
  std::vector<std::string> models;
  int64_t positions = 1024;
  int steps = 256;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      models.push_back(argv[++i]);
    } else if (!std::strcmp(argv[i], "--positions") && i + 1 < argc) {
      positions = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  if (models.empty() || positions < 1 || steps < 1) {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  for (const std::string& m : models) RunModel(m, positions, steps);
  return 0;
}
