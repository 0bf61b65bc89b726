// The cpu backend's LoRA forward: a sequence with an adapter computes what the base model
// with the adapter merged into its weights (W + scaling·B·A) computes, and sequences of
// different adapters and of the base model share a step without touching one another.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "worker/model/safetensors.h"

namespace kvfleet::backend {
namespace {

namespace fs = std::filesystem;
using kvfleet::testing::RandomModelDir;
using model::LoraAdapter;
using model::LoraTarget;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("kvfleet-cpu-lora-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

LoraAdapter MakeAdapter(const fs::path& dir, const std::string& model_dir, const std::string& name, uint64_t seed,
                        int32_t rank, std::vector<LoraTarget> targets) {
  auto config = model::LoadModelConfig(model_dir);
  REQUIRE(config.ok());
  model::RandomLoraOptions o;
  o.rank = rank;
  o.alpha = 2.0f * static_cast<float>(rank);
  o.seed = seed;
  o.targets = std::move(targets);
  const std::string adir = (dir / name).string();
  Status st = model::WriteRandomLoraAdapter(adir, *config, o);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  auto a = model::LoadLoraAdapter(name, adir, *config, "m", model_dir);
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  return *std::move(a);
}

// The model at `model_dir` with `a` merged into its projections, written in fp32 to `out`.
void WriteMerged(const std::string& model_dir, const LoraAdapter& a, const fs::path& out) {
  auto file = model::SafetensorsFile::Open(model_dir + "/model.safetensors");
  REQUIRE_MESSAGE(file.ok(), file.status().ToString());
  nlohmann::json header = nlohmann::json::object();
  std::vector<std::vector<float>> data;
  uint64_t offset = 0;
  for (const auto& [name, view] : (*file)->tensors()) {
    std::vector<float>& w = data.emplace_back(static_cast<size_t>(view.numel()));
    model::ConvertToF32(view.dtype, view.bytes.data(), w.size(), w.data());
    for (size_t l = 0; l < a.layers.size(); ++l) {
      for (int t = 0; t < model::kNumLoraTargets; ++t) {
        const auto target = static_cast<LoraTarget>(t);
        const std::string part = t < 4 ? ".self_attn." : ".mlp.";
        if (name != "model.layers." + std::to_string(l) + part + model::LoraTargetName(target) + ".weight") continue;
        const model::LoraMatrices& m = a.layers[l][t];
        if (m.empty()) continue;
        const int64_t in = view.shape[1], outs = view.shape[0];
        for (int64_t o = 0; o < outs; ++o) {
          for (int64_t i = 0; i < in; ++i) {
            double d = 0;
            for (int32_t r = 0; r < a.rank; ++r) d += double{m.b[o * a.rank + r]} * m.a[r * in + i];
            w[o * in + i] += static_cast<float>(a.scaling * d);
          }
        }
      }
    }
    header[name] = {{"dtype", "F32"}, {"shape", view.shape}, {"data_offsets", {offset, offset + w.size() * 4}}};
    offset += w.size() * 4;
  }
  std::string head = header.dump();
  while (head.size() % 8) head.push_back(' ');
  fs::create_directories(out);
  fs::copy_file(fs::path(model_dir) / "config.json", out / "config.json");
  std::ofstream f(out / "model.safetensors", std::ios::binary);
  const uint64_t len = head.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << head;
  for (const auto& w : data) f.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * 4));
}

std::unique_ptr<ModelBackend> Make(const std::string& dir, int32_t max_loras) {
  BackendOptions o;
  o.model_dir = dir;
  o.block_size = 8;
  o.num_blocks = 64;
  o.max_context = 256;
  o.threads = 2;
  o.max_loras = max_loras;
  auto b = CreateBackend("cpu", o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

std::vector<TokenId> Tokens(int n, int salt) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 7919 + salt * 104729 + 17) % 500));
  return t;
}

// Logits of every token of each prompt, computed in one step; sequence i uses slots[i] and
// blocks [16·i, 16·i + 16).
std::vector<std::vector<float>> Logits(ModelBackend& b, const std::vector<std::vector<TokenId>>& prompts,
                                       const std::vector<int32_t>& slots) {
  StepBatch batch;
  std::vector<std::vector<BlockId>> tables(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int k = 0; k < 16; ++k) tables[i].push_back(static_cast<BlockId>(16 * i + k));
    SequenceStep& s = batch.seqs.emplace_back();
    s.request_id = i + 1;
    s.tokens = prompts[i];
    s.block_tables = {tables[i]};
    s.logits = LogitsRequest::kAll;
    s.lora_slot = slots[i];
  }
  StepOutput out;
  Status st = b.Execute(batch, &out);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  const size_t V = b.config().vocab_size;
  std::vector<std::vector<float>> result;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto first = out.logits.begin() + out.logits_offset[i] * static_cast<int64_t>(V);
    result.emplace_back(first, first + static_cast<int64_t>(prompts[i].size() * V));
  }
  return result;
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST_CASE("a LoRA sequence's logits equal the merged model's within 1e-3 (fp32)") {
  const std::pair<const char*, uint64_t> shapes[] = {{"tiny", 1}, {"tiny-qwen2", 3}, {"tiny-qwen3", 4}, {"tiny-mistral", 2}};
  for (const auto& [shape, seed] : shapes) {
    CAPTURE(shape);
    const std::string base = RandomModelDir(shape, seed);
    TempDir tmp(shape);
    const LoraAdapter a = MakeAdapter(tmp.path, base, "all", 7, 8,
                                      {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV, LoraTarget::kO,
                                       LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown});
    WriteMerged(base, a, tmp.path / "merged");
    auto with_lora = Make(base, 1);
    REQUIRE(with_lora->max_loras() == 1);
    REQUIRE(with_lora->LoadLora(0, a).ok());
    auto merged = Make((tmp.path / "merged").string(), 0);
    const std::vector<TokenId> prompt = Tokens(24, 1);
    const auto lora_logits = Logits(*with_lora, {prompt}, {0});
    const auto merged_logits = Logits(*merged, {prompt}, {-1});
    const auto base_logits = Logits(*with_lora, {prompt}, {-1});
    CHECK(MaxDiff(lora_logits[0], merged_logits[0]) <= 1e-3f);
    // The adapter matters: the base model's logits are far from both.
    CHECK(MaxDiff(lora_logits[0], base_logits[0]) > 0.1f);
  }
}

TEST_CASE("a mixed step (base, adapter 1, adapter 2) equals each sequence run alone") {
  const std::string base = RandomModelDir("tiny", 1);
  TempDir tmp("mixed");
  const LoraAdapter a1 = MakeAdapter(tmp.path, base, "a1", 1, 4, {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown});
  const LoraAdapter a2 = MakeAdapter(tmp.path, base, "a2", 2, 16, {LoraTarget::kO, LoraTarget::kGate, LoraTarget::kUp});
  auto b = Make(base, 2);
  REQUIRE(b->LoadLora(0, a1).ok());
  REQUIRE(b->LoadLora(1, a2).ok());
  const std::vector<std::vector<TokenId>> prompts = {Tokens(9, 1), Tokens(17, 1), Tokens(5, 3)};
  const std::vector<int32_t> slots = {-1, 0, 1};
  const auto together = Logits(*b, prompts, slots);
  for (size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    const auto alone = Logits(*b, {prompts[i]}, {slots[i]});
    CHECK(MaxDiff(together[i], alone[0]) <= 1e-5f);
  }
  // The same prompt under the two adapters differs.
  const auto pair = Logits(*b, {prompts[1], prompts[1]}, {0, 1});
  CHECK(MaxDiff(pair[0], pair[1]) > 0.1f);

  // Replacing a slot's adapter changes what the slot computes.
  REQUIRE(b->LoadLora(0, a2).ok());
  const auto replaced = Logits(*b, {prompts[1]}, {0});
  CHECK(MaxDiff(replaced[0], pair[1]) <= 1e-5f);
}

TEST_CASE("LoadLora refuses a slot out of range and a rank above max_lora_rank; steps refuse an empty slot") {
  const std::string base = RandomModelDir("tiny", 1);
  TempDir tmp("refuse");
  const LoraAdapter a = MakeAdapter(tmp.path, base, "a", 1, 16, {LoraTarget::kQ});
  BackendOptions o;
  o.model_dir = base;
  o.block_size = 8;
  o.num_blocks = 64;
  o.threads = 1;
  o.max_loras = 2;
  o.max_lora_rank = 8;
  auto b = CreateBackend("cpu", o);
  REQUIRE(b.ok());
  CHECK((*b)->LoadLora(2, a).message().find("slot 2") != std::string::npos);
  CHECK((*b)->LoadLora(0, a).message().find("rank 16 is above --max-lora-rank 8") != std::string::npos);
  StepBatch batch;
  std::vector<BlockId> table = {0, 1};
  const std::vector<TokenId> prompt = Tokens(4, 0);
  SequenceStep& s = batch.seqs.emplace_back();
  s.tokens = prompt;
  s.block_tables = {table};
  s.sample = true;
  s.lora_slot = 1;
  StepOutput out;
  CHECK((*b)->Execute(batch, &out).message().find("slot 1 holds no adapter") != std::string::npos);
  batch.seqs[0].lora_slot = 2;
  CHECK((*b)->Execute(batch, &out).message().find("outside the backend's 2 slots") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::backend
