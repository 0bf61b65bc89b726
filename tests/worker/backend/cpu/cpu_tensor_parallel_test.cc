// The cpu backend's tensor parallelism: N in-process ranks holding Megatron shards compute
// the unsharded forward pass (max |Δlogit| <= 1e-4 in fp32) over chunked prefill, decode
// steps, a sliding window, a LoRA adapter and block copies, for every tiny shape, with KV
// heads split and replicated; and a model or N that cannot shard is refused, naming the flag.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend {
namespace {

namespace fs = std::filesystem;
using kvfleet::testing::RandomModelDir;

constexpr int kBlock = 8;

Result<std::unique_ptr<ModelBackend>> TryMake(const std::string& dir, int32_t tp) {
  BackendOptions o;
  o.model_dir = dir;
  o.block_size = kBlock;
  o.num_blocks = 128;
  o.max_context = 512;
  o.threads = 2;
  o.max_loras = 1;
  o.tensor_parallel = tp;
  return CreateBackend("cpu", o);
}

std::unique_ptr<ModelBackend> Make(const std::string& dir, int32_t tp) {
  auto b = TryMake(dir, tp);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

std::vector<TokenId> Tokens(int n, int salt) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 7919 + salt * 104729 + 17) % 128000));
  return t;
}

std::vector<BlockId> Table(BlockId first, int n) {
  std::vector<BlockId> t;
  for (int i = 0; i < n; ++i) t.push_back(first + static_cast<BlockId>(i));
  return t;
}

// Every logit row the scenario asks for, in order. Sequence A (base model) prefills 24
// tokens in chunks of 16 and 8; B (the adapter in slot 0) and C (base, B's prompt) prefill
// 5 in one step beside A's second chunk; then all three decode 8 tokens, which takes A past
// tiny-mistral's 20-token window; then D, a copy of A's blocks (block_copier), decodes one.
std::vector<float> Scenario(ModelBackend& b, const model::LoraAdapter& adapter) {
  REQUIRE(b.LoadLora(0, adapter).ok());
  std::vector<float> all;
  const std::vector<TokenId> a = Tokens(24, 1), bc = Tokens(5, 2);
  const std::vector<BlockId> ta = Table(0, 8), tb = Table(16, 8), tc = Table(32, 8), td = Table(100, 8);
  auto run = [&](StepBatch& batch) {
    StepOutput out;
    Status st = b.Execute(batch, &out);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    all.insert(all.end(), out.logits.begin(), out.logits.end());
  };
  auto seq = [](std::span<const TokenId> tokens, int64_t start, std::span<const BlockId> table, int32_t slot) {
    SequenceStep s;
    s.tokens = tokens;
    s.start_position = start;
    s.block_tables = {table};
    s.logits = LogitsRequest::kAll;
    s.lora_slot = slot;
    return s;
  };
  {
    StepBatch batch;
    batch.seqs.push_back(seq(std::span(a).subspan(0, 16), 0, ta, -1));
    run(batch);
  }
  {
    StepBatch batch;
    batch.seqs.push_back(seq(std::span(a).subspan(16), 16, ta, -1));
    batch.seqs.push_back(seq(bc, 0, tb, 0));
    batch.seqs.push_back(seq(bc, 0, tc, -1));
    run(batch);
  }
  const std::vector<TokenId> next = Tokens(9, 3);
  for (int i = 0; i < 8; ++i) {
    StepBatch batch;
    const auto tok = std::span(next).subspan(i, 1);
    batch.seqs.push_back(seq(tok, 24 + i, ta, -1));
    batch.seqs.push_back(seq(tok, 5 + i, tb, 0));
    batch.seqs.push_back(seq(tok, 5 + i, tc, -1));
    run(batch);
  }
  std::vector<kv::BlockCopy> copies;
  for (BlockId i = 0; i < 4; ++i) copies.push_back({0, kv::Tier::kDevice, i, kv::Tier::kDevice, 100 + i});
  b.block_copier().Copy(copies);
  StepBatch batch;
  batch.seqs.push_back(seq(std::span(next).subspan(8, 1), 32, td, -1));
  run(batch);
  return all;
}

float MaxDiff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

model::LoraAdapter Adapter(const std::string& model_dir, const std::string& tag) {
  auto config = model::LoadModelConfig(model_dir);
  REQUIRE(config.ok());
  const fs::path dir = fs::temp_directory_path() / ("kvfleet-tp-lora-" + tag + "-" + std::to_string(::getpid()));
  model::RandomLoraOptions o;
  o.rank = 4;
  o.alpha = 8.0f;
  o.seed = 7;
  REQUIRE(model::WriteRandomLoraAdapter(dir.string(), *config, o).ok());
  auto a = model::LoadLoraAdapter("tp", dir.string(), *config, "m", model_dir);
  fs::remove_all(dir);
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  return *std::move(a);
}

TEST_CASE("N tensor-parallel ranks compute the unsharded logits on every tiny shape") {
  struct Case {
    const char* shape;
    uint64_t seed;
    int kv_heads;
  };
  for (const Case& k : {Case{"tiny", 1, 2}, Case{"tiny-qwen2", 3, 2}, Case{"tiny-mistral", 2, 1},
                        Case{"tiny-qwen3", 189, 2}, Case{"tiny-mixtral", 5, 2}, Case{"tiny-qwen3-moe", 5, 2}}) {
    const std::string dir = RandomModelDir(k.shape, k.seed);
    const model::LoraAdapter adapter = Adapter(dir, k.shape);
    const std::vector<float> want = Scenario(*Make(dir, 1), adapter);
    const int64_t V = 128256;
    REQUIRE(want.size() % V == 0);
    // The adapter changes B's logits (rows 24..28 are B's prompt, 29..33 C's): a rank that
    // dropped its delta would show.
    CHECK(MaxDiff(std::span(want).subspan(24 * V, 5 * V), std::span(want).subspan(29 * V, 5 * V)) > 1e-2f);
    for (int tp : {2, 4}) {
      const std::string what = std::string(k.shape) + " tp " + std::to_string(tp) +
                               (k.kv_heads < tp ? " (KV heads replicated)" : " (KV heads split)");
      CAPTURE(what);
      const std::vector<float> got = Scenario(*Make(dir, tp), adapter);
      CHECK(MaxDiff(want, got) <= 1e-4f);
    }
  }
}

TEST_CASE("tensor-parallel steps are deterministic: the all-reduce sums in rank order") {
  const std::string dir = RandomModelDir("tiny", 1);
  const model::LoraAdapter adapter = Adapter(dir, "det");
  const std::vector<float> a = Scenario(*Make(dir, 4), adapter);
  const std::vector<float> b = Scenario(*Make(dir, 4), adapter);
  CHECK(MaxDiff(a, b) == 0.0f);
}

TEST_CASE("an N the model cannot shard is refused at start-up, naming the flag and the field") {
  const std::string dir = RandomModelDir("tiny", 1);  // 4 heads, 2 KV heads, intermediate 192
  auto eight = TryMake(dir, 8);
  REQUIRE_FALSE(eight.ok());
  CHECK(eight.status().message().find("--tensor-parallel 8") != std::string::npos);
  CHECK(eight.status().message().find("num_attention_heads") != std::string::npos);
  auto three = TryMake(dir, 3);
  REQUIRE_FALSE(three.ok());
  CHECK(three.status().message().find("--tensor-parallel must be 1, 2, 4 or 8, got 3") != std::string::npos);

  model::ModelConfig c;
  c.num_heads = 12;
  c.num_kv_heads = 3;
  c.intermediate_size = 96;
  c.vocab_size = 1000;
  CHECK(CheckTensorParallel(c, 4).message().find("num_key_value_heads") != std::string::npos);
  c.num_kv_heads = 4;
  c.intermediate_size = 90;
  CHECK(CheckTensorParallel(c, 4).message().find("intermediate_size 90") != std::string::npos);
  c.intermediate_size = 96;
  CHECK(CheckTensorParallel(c, 2).ok());
  CHECK(CheckTensorParallel(c, 0).message().find("--tensor-parallel") != std::string::npos);
}

TEST_CASE("shards cover the model: heads and vocab split, few KV heads replicated") {
  model::ModelConfig c;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 64;
  c.vocab_size = 1001;  // not a multiple of 4: the last rank's slice is shorter
  int64_t vocab = 0;
  for (int r = 0; r < 4; ++r) {
    const TensorParallelShard s = ShardOf(c, 4, r);
    CHECK(s.heads == 2);
    CHECK(s.head_begin == 2 * r);
    CHECK(s.kv_heads == 1);
    CHECK(s.kv_head_begin == r / 2);  // ranks 0-1 share KV head 0, ranks 2-3 KV head 1
    // Every query head of the rank belongs to the rank's KV head (group of 4 heads).
    CHECK(s.head_begin / 4 == s.kv_head_begin);
    CHECK((s.head_begin + s.heads - 1) / 4 == s.kv_head_begin);
    CHECK(s.inter_begin == 16 * r);
    CHECK(s.vocab_begin == vocab);
    vocab += s.vocab;
  }
  CHECK(vocab == 1001);
  CHECK(ShardOf(c, 4, 3).vocab == 1001 - 3 * 251);
  const TensorParallelShard s = ShardOf(c, 2, 1);
  CHECK(s.kv_heads == 1);
  CHECK(s.kv_head_begin == 1);
}

}  // namespace
}  // namespace kvfleet::backend
