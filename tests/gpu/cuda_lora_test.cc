// The cuda backend with LoRA adapters (cuda_backend.h invariant 7), adapters built in memory:
//   - an adapter against the cpu backend running the merged weights W + scaling·B·A (fp32):
//     logits within the bf16 tolerance, greedy tokens equal except at near-ties; and against
//     the cpu backend with the same adapter where that backend serves adapters;
//   - a mixed batch (base + two adapters) gives each sequence what it gets alone;
//   - base sequences on a backend with slots and adapters loaded get exactly the logits of a
//     backend without slots (the unchanged path, graphs included);
//   - LoadLora and steps refuse what the slots cannot hold.
// Needs a GPU (label gpu); part of gpu_cuda_backend_test.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/gpu/graphed_decode.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/model/checkpoint.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/safetensors.h"

namespace kvfleet::testing {
namespace {

namespace fs = std::filesystem;
using model::LoraTarget;

// As cuda_backend_test.cc's kBf16Tolerance: the bf16 backend against fp32 on the tiny models.
constexpr float kTolerance = 0.2f;

backend::BackendOptions LoraOptions(const std::string& dir, int32_t max_loras) {
  backend::BackendOptions o;
  o.model_dir = dir;
  o.block_size = 16;
  o.num_blocks = 512;
  o.max_context = 2048;
  o.max_num_tokens = 512;
  o.max_batch_size = 16;
  o.threads = 2;
  o.max_loras = max_loras;
  o.max_lora_rank = 64;
  return o;
}

std::unique_ptr<backend::ModelBackend> MakeBackend(const char* name, const backend::BackendOptions& o) {
  auto b = backend::CreateBackend(name, o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

model::LoraDims Dims(const model::ModelConfig& c, LoraTarget t) {
  const int32_t H = static_cast<int32_t>(c.hidden_size), I = static_cast<int32_t>(c.intermediate_size);
  const int32_t Q = static_cast<int32_t>(c.q_size()), KV = static_cast<int32_t>(c.kv_size());
  switch (t) {
    case LoraTarget::kQ: return {H, Q};
    case LoraTarget::kK:
    case LoraTarget::kV: return {H, KV};
    case LoraTarget::kO: return {Q, H};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {H, I};
    case LoraTarget::kDown: return {I, H};
  }
  return {};
}

// Random A and B (PEFT starts B at zero, a no-op) of a size that moves the logits by about one.
model::LoraAdapter RandomAdapter(const model::ModelConfig& c, const std::string& name, int32_t rank, uint64_t seed,
                                 const std::vector<LoraTarget>& targets) {
  model::LoraAdapter a;
  a.name = name;
  a.rank = rank;
  a.scaling = 32.0f / static_cast<float>(rank);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  a.layers.resize(static_cast<size_t>(c.num_layers));
  for (auto& layer : a.layers) {
    for (LoraTarget t : targets) {
      const model::LoraDims d = Dims(c, t);
      std::uniform_real_distribution<float> da(-1.0f / std::sqrt(float(d.in)), 1.0f / std::sqrt(float(d.in)));
      std::uniform_real_distribution<float> db(-0.1f, 0.1f);
      model::LoraMatrices& m = layer[static_cast<int>(t)];
      m.a.resize(static_cast<size_t>(rank) * d.in);
      m.b.resize(static_cast<size_t>(d.out) * rank);
      for (float& v : m.a) v = da(rng);
      for (float& v : m.b) v = db(rng);
    }
  }
  return a;
}

// A copy of the fp32 model at `dir` with the adapter merged into its projections, written
// under the test models' root: the reference a fp32 backend runs without knowing of LoRA.
std::string MergedModelDir(const std::string& dir, const model::LoraAdapter& adapter) {
  auto ck = model::Checkpoint::Open(dir);
  REQUIRE_MESSAGE(ck.ok(), ck.status().ToString());
  const model::ModelConfig& c = (*ck)->config();
  static const char* kModules[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                   "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  nlohmann::json header = nlohmann::json::object();
  std::vector<std::vector<float>> data;
  uint64_t offset = 0;
  for (const model::TensorSpec& spec : (*ck)->specs()) {
    const model::TensorView& t = (*ck)->tensor(spec.name);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    model::ConvertToF32(t.dtype, t.bytes.data(), v.size(), v.data());
    for (int64_t l = 0; l < c.num_layers; ++l) {
      for (int target = 0; target < model::kNumLoraTargets; ++target) {
        const model::LoraMatrices& m = adapter.layers[l][target];
        if (m.empty() || spec.name != model::LayerTensorName(l, std::string(kModules[target]) + ".weight")) continue;
        const model::LoraDims d = Dims(c, static_cast<LoraTarget>(target));
        for (int32_t i = 0; i < d.out; ++i) {
          for (int32_t k = 0; k < d.in; ++k) {
            double delta = 0;
            for (int32_t r = 0; r < adapter.rank; ++r) delta += double(m.b[i * adapter.rank + r]) * m.a[r * d.in + k];
            v[static_cast<size_t>(i) * d.in + k] += static_cast<float>(adapter.scaling * delta);
          }
        }
      }
    }
    header[spec.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + v.size() * 4}}};
    offset += v.size() * 4;
    data.push_back(std::move(v));
  }
  const fs::path out = fs::temp_directory_path() / ("kvfleet-lora-merged-" + adapter.name + "-" +
                                                    fs::path(dir).filename().string());
  fs::create_directories(out);
  fs::copy_file(fs::path(dir) / "config.json", out / "config.json", fs::copy_options::overwrite_existing);
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::ofstream f(out / "model.safetensors", std::ios::binary | std::ios::trunc);
  const uint64_t len = text.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& v : data) f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  REQUIRE(f.good());
  return out.string();
}

struct SeqSpec {
  std::vector<TokenId> prompt;
  int32_t slot = -1;
  std::vector<TokenId> forced = {};  // tokens fed after the prompt (teacher forcing); empty: its own greedy
};
struct SeqTrace {
  std::vector<std::vector<float>> logits;  // the sampled row of each sampling step
  std::vector<TokenId> tokens;             // the sampled tokens
};

// Every sequence in every step: the prompt in chunks of `chunk`, then `steps` tokens.
std::vector<SeqTrace> RunBatch(backend::ModelBackend& b, const std::vector<SeqSpec>& seqs, int64_t chunk, int steps) {
  const int64_t V = b.config().vocab_size, blocks_per_seq = 16;
  std::vector<SeqTrace> trace(seqs.size());
  std::vector<std::vector<TokenId>> toks(seqs.size());
  std::vector<std::vector<backend::BlockId>> tables(seqs.size());
  std::vector<int64_t> pos(seqs.size(), 0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    toks[s] = seqs[s].prompt;
    for (int64_t j = 0; j < blocks_per_seq; ++j) tables[s].push_back(static_cast<backend::BlockId>(s * blocks_per_seq + j));
  }
  for (;;) {
    backend::StepBatch batch;
    std::vector<size_t> in_step;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t plen = static_cast<int64_t>(seqs[s].prompt.size());
      if (static_cast<int>(trace[s].tokens.size()) >= steps) continue;
      backend::SequenceStep st;
      st.request_id = s;
      st.start_position = pos[s];
      const int64_t n = pos[s] < plen ? std::min(chunk, plen - pos[s]) : 1;
      st.tokens = std::span<const TokenId>(toks[s]).subspan(static_cast<size_t>(pos[s]), static_cast<size_t>(n));
      st.sample = pos[s] + n >= plen;
      st.logits = st.sample ? backend::LogitsRequest::kLast : backend::LogitsRequest::kNone;
      st.block_tables = {tables[s]};
      st.lora_slot = seqs[s].slot;
      batch.seqs.push_back(st);
      in_step.push_back(s);
    }
    if (in_step.empty()) return trace;
    backend::StepOutput out;
    const Status status = b.Execute(batch, &out);
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    for (size_t i = 0; i < in_step.size(); ++i) {
      const size_t s = in_step[i];
      pos[s] += static_cast<int64_t>(batch.seqs[i].tokens.size());
      if (!batch.seqs[i].sample) continue;
      const float* row = &out.logits[static_cast<size_t>(out.logits_offset[i] * V)];
      trace[s].logits.emplace_back(row, row + V);
      trace[s].tokens.push_back(out.tokens[i]);
      const size_t k = trace[s].tokens.size() - 1;
      toks[s].push_back(k < seqs[s].forced.size() ? seqs[s].forced[k] : out.tokens[i]);
    }
  }
}

float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

float TopGap(const std::vector<float>& row) {
  std::vector<float> v = row;
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return v[0] - v[1];
}

// `got` teacher-forced on `ref`'s tokens: logits within `tol` at every step, tokens equal
// except where the reference's top-2 gap is below `tol`.
void ExpectAgrees(const SeqTrace& got, const SeqTrace& ref, float tol) {
  REQUIRE(got.tokens.size() == ref.tokens.size());
  float worst = 0;
  int near = 0;
  for (size_t k = 0; k < ref.tokens.size(); ++k) {
    worst = std::max(worst, MaxDiff(got.logits[k], ref.logits[k]));
    if (got.tokens[k] != ref.tokens[k]) {
      CHECK_MESSAGE(TopGap(ref.logits[k]) < tol, "step " << k << ": token " << got.tokens[k] << " vs " << ref.tokens[k]);
      ++near;
    }
  }
  MESSAGE("max |Δlogit| " << worst << ", " << near << " near-ties of " << ref.tokens.size());
  CHECK(worst <= tol);
}

std::vector<TokenId> Prompt(int n, int salt) {
  std::vector<TokenId> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<TokenId>((i * 7919 + salt * 104729) % 20000 + 50));
  return p;
}

const std::vector<LoraTarget> kAllTargets = {LoraTarget::kQ,    LoraTarget::kK,  LoraTarget::kV,   LoraTarget::kO,
                                             LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};

TEST_CASE("a LoRA adapter on the cuda backend agrees with the cpu backend on the merged weights") {
  for (const char* shape : {"tiny", "tiny-qwen2"}) {  // tiny-qwen2: q/k/v biases under the adapter
    const std::string dir = RandomModelDir(shape, 5, /*bf16=*/false);
    auto gpu = MakeBackend("cuda", LoraOptions(dir, 2));
    REQUIRE(gpu->max_loras() == 2);
    const model::ModelConfig& c = gpu->config();
    // Every target at rank 8; q and v only at rank 16 (the other groups skipped).
    const std::vector<model::LoraAdapter> adapters = {
        RandomAdapter(c, std::string(shape) + "-all-r8", 8, 11, kAllTargets),
        RandomAdapter(c, std::string(shape) + "-qv-r16", 16, 12, {LoraTarget::kQ, LoraTarget::kV})};
    for (size_t i = 0; i < adapters.size(); ++i) {
      INFO(shape << " adapter " << adapters[i].name);
      REQUIRE(gpu->LoadLora(static_cast<int32_t>(i), adapters[i]).ok());
      auto merged = MakeBackend("cpu", LoraOptions(MergedModelDir(dir, adapters[i]), 0));
      const std::vector<TokenId> prompt = Prompt(45, static_cast<int>(i));
      const SeqTrace ref = RunBatch(*merged, {{prompt}}, 16, 16)[0];
      const SeqTrace got = RunBatch(*gpu, {{prompt, static_cast<int32_t>(i), ref.tokens}}, 16, 16)[0];
      ExpectAgrees(got, ref, kTolerance);
      // The adapter matters: the base model's logits are further from the merged ones than
      // the tolerance, so the comparison above can tell an adapter applied from one ignored.
      const SeqTrace base = RunBatch(*gpu, {{prompt, -1, ref.tokens}}, 16, 16)[0];
      float moved = 0;
      for (size_t k = 0; k < ref.logits.size(); ++k) moved = std::max(moved, MaxDiff(base.logits[k], ref.logits[k]));
      CHECK(moved > 2 * kTolerance);
      // Where the cpu backend serves adapters, the same adapter there too.
      auto cpu = MakeBackend("cpu", LoraOptions(dir, 2));
      if (cpu->max_loras() > 0) {
        REQUIRE(cpu->LoadLora(0, adapters[i]).ok());
        const SeqTrace cpu_lora = RunBatch(*cpu, {{prompt, 0, ref.tokens}}, 16, 16)[0];
        ExpectAgrees(got, cpu_lora, kTolerance);
      } else {
        MESSAGE("the cpu backend serves no adapters: compared with the merged weights only");
      }
    }
  }
}

TEST_CASE("a mixed batch of base and two adapters gives each sequence what it gets alone") {
  const std::string dir = RandomModelDir("tiny", 5, /*bf16=*/false);
  auto gpu = MakeBackend("cuda", LoraOptions(dir, 3));
  const model::ModelConfig& c = gpu->config();
  REQUIRE(gpu->LoadLora(0, RandomAdapter(c, "a", 8, 21, kAllTargets)).ok());
  REQUIRE(gpu->LoadLora(2, RandomAdapter(c, "b", 64, 22, kAllTargets)).ok());
  const std::vector<SeqSpec> seqs = {{Prompt(30, 1), -1}, {Prompt(37, 2), 0}, {Prompt(23, 3), 2}, {Prompt(41, 4), 0}};
  for (int64_t chunk : {int64_t{7}, int64_t{64}}) {
    INFO("prefill chunk " << chunk);
    const std::vector<SeqTrace> mixed = RunBatch(*gpu, seqs, chunk, 12);
    for (size_t s = 0; s < seqs.size(); ++s) {
      INFO("sequence " << s << " slot " << seqs[s].slot);
      SeqSpec alone = seqs[s];
      alone.forced = mixed[s].tokens;
      const SeqTrace single = RunBatch(*gpu, {alone}, chunk, 12)[0];
      // Other row counts take other GEMM kernels (and batch 1 the fused gemv): bf16 roundings
      // differ a little, the adapter's share does not.
      ExpectAgrees(mixed[s], single, 0.1f);
    }
  }
}

TEST_CASE("base sequences beside loaded adapters get exactly the logits of a backend without slots") {
  const std::string dir = RandomModelDir("tiny", 5, /*bf16=*/false);
  auto plain = MakeBackend("cuda", LoraOptions(dir, 0));
  auto with_slots = MakeBackend("cuda", LoraOptions(dir, 2));
  REQUIRE(with_slots->LoadLora(1, RandomAdapter(with_slots->config(), "a", 16, 31, kAllTargets)).ok());
  const std::vector<SeqSpec> seqs = {{Prompt(20, 5)}, {Prompt(33, 6)}};
  const std::vector<SeqTrace> a = RunBatch(*plain, seqs, 64, 10), b = RunBatch(*with_slots, seqs, 64, 10);
  for (size_t s = 0; s < seqs.size(); ++s) {
    CHECK(a[s].tokens == b[s].tokens);
    for (size_t k = 0; k < a[s].logits.size(); ++k) CHECK(a[s].logits[k] == b[s].logits[k]);
  }
}

TEST_CASE("LoadLora and steps refuse what the LoRA slots cannot hold") {
  const std::string dir = RandomModelDir("tiny", 5, /*bf16=*/false);
  backend::BackendOptions o = LoraOptions(dir, 2);
  o.max_lora_rank = 16;
  auto gpu = MakeBackend("cuda", o);
  const model::ModelConfig& c = gpu->config();
  auto message = [](const Status& s) { return s.ToString(); };
  Status s = gpu->LoadLora(0, RandomAdapter(c, "big", 32, 1, kAllTargets));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(message(s).find("rank 32") != std::string::npos);
  s = gpu->LoadLora(2, RandomAdapter(c, "a", 8, 1, kAllTargets));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(message(s).find("slot 2") != std::string::npos);
  model::LoraAdapter short_b = RandomAdapter(c, "short", 8, 1, kAllTargets);
  short_b.layers[1][static_cast<int>(LoraTarget::kDown)].b.pop_back();
  s = gpu->LoadLora(0, short_b);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(message(s).find("down_proj") != std::string::npos);
  model::LoraAdapter few_layers = RandomAdapter(c, "few", 8, 1, kAllTargets);
  few_layers.layers.pop_back();
  CHECK(gpu->LoadLora(0, few_layers).code() == StatusCode::kInvalidArgument);

  // Slot 0 was never filled (every load above failed): a step naming it changes nothing.
  const std::vector<TokenId> prompt = Prompt(10, 9);
  const std::vector<backend::BlockId> table = {0};
  backend::StepBatch batch;
  backend::SequenceStep st;
  st.tokens = prompt;
  st.block_tables = {table};
  st.sample = true;
  st.lora_slot = 0;
  batch.seqs = {st};
  backend::StepOutput out;
  s = gpu->Execute(batch, &out);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(message(s).find("holds no adapter") != std::string::npos);
  REQUIRE(gpu->LoadLora(0, RandomAdapter(c, "a", 8, 1, kAllTargets)).ok());
  CHECK(gpu->Execute(batch, &out).ok());
  batch.seqs[0].lora_slot = 2;  // past the slots: ValidateStepBatch
  CHECK(gpu->Execute(batch, &out).code() == StatusCode::kInvalidArgument);
}

// LoRA decode steps replay CUDA graphs too (cuda_backend.h invariants 4 and 7): the slots'
// row groups are staged at offsets fixed by the padded batch, the tiles padded to a bound.
// Graphed tokens must be the eager ones, or near-ties by the eager logits (padded batches
// take other GEMM kernels); an adapter the graph dropped would fail that by far.
TEST_CASE("graph-captured LoRA decode steps give the eager steps' tokens") {
  const std::string dir = RandomModelDir("tiny", 5, /*bf16=*/false);
  backend::BackendOptions o = LoraOptions(dir, 3);
  auto graphs = MakeBackend("cuda", o);
  o.extra.emplace("cuda_graphs", "0");
  auto eager = MakeBackend("cuda", o);
  const model::ModelConfig& c = eager->config();
  for (backend::ModelBackend* b : {graphs.get(), eager.get()}) {
    REQUIRE(b->LoadLora(0, RandomAdapter(c, "a", 8, 41, kAllTargets)).ok());
    REQUIRE(b->LoadLora(2, RandomAdapter(c, "b", 64, 42, kAllTargets)).ok());
  }
  constexpr int kSeqs = 5, kSteps = 16;
  std::vector<std::vector<TokenId>> toks(kSeqs);
  std::vector<std::vector<backend::BlockId>> tables(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    toks[s] = Prompt(12 + 5 * s, s + 7);
    for (int j = 0; j < 8; ++j) tables[s].push_back(static_cast<backend::BlockId>(s * 8 + j));
  }
  // 5 sequences (padded to 8), then 3 (padded to 4) with one adapter fewer: two graph shapes.
  GraphedDecode d{toks, tables, {0, -1, 2, 0, 2}, kSteps, [](int step) { return step < kSteps / 2 ? kSeqs : 3; }};
  const auto [equal, near] = CompareGraphedDecode(*eager, *graphs, d);
  MESSAGE(equal << " graphed LoRA tokens equal to eager, " << near << " near-ties");
  CHECK(near * 8 <= equal);
  auto* cuda = dynamic_cast<backend::cuda::CudaBackend*>(graphs.get());
  REQUIRE(cuda != nullptr);
  CHECK(cuda->graphs_captured() == 2);  // both shapes captured, every one with LoRA rows
}

}  // namespace
}  // namespace kvfleet::testing
