// The cuda backend with a PEFT adapter against HF transformers + PEFT (lora_peft_parity.py):
// the prompt and greedy tokens of the script's output, reproduced free-running on the cuda
// backend, must be identical.
//
//   lora_peft_parity --model-dir-only --shape tiny [--seed 5]   prints (and makes) the fp32
//       test model directory the tests use (tests/worker/model/test_models.h)
//   lora_peft_parity --model DIR --adapter DIR --expect tokens.json
//       exit 0 when every token matches; otherwise prints the first difference and HF's top-2
//       gap there, exit 1
//
// The adapter is read here (adapter_config.json: r, lora_alpha, use_rslora; the safetensors by
// PEFT's names) rather than by model::LoadLoraAdapter, so this runs on its own; it needs a GPU.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/safetensors.h"

using namespace kvfleet;

namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "lora_peft_parity: %s\n", m.c_str());
  return 1;
}

Result<model::LoraAdapter> ReadAdapter(const std::string& dir, const model::ModelConfig& c) {
  std::ifstream f(dir + "/adapter_config.json");
  if (!f) return NotFound(dir + "/adapter_config.json: cannot open");
  const nlohmann::json cfg = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.contains("r") || !cfg.contains("lora_alpha")) {
    return InvalidArgument(dir + "/adapter_config.json: needs r and lora_alpha");
  }
  model::LoraAdapter a;
  a.name = "peft";
  a.path = dir;
  a.rank = cfg["r"].get<int32_t>();
  const double alpha = cfg["lora_alpha"].get<double>();
  const bool rs = cfg.value("use_rslora", false);
  a.scaling = static_cast<float>(rs ? alpha / std::sqrt(double(a.rank)) : alpha / a.rank);
  KVF_ASSIGN_OR_RETURN(auto st, model::SafetensorsFile::Open(dir + "/adapter_model.safetensors"));
  static const char* kModules[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                   "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  a.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int t = 0; t < model::kNumLoraTargets; ++t) {
      const std::string prefix = "base_model.model.model.layers." + std::to_string(l) + "." + kModules[t];
      const model::TensorView* ta = st->Find(prefix + ".lora_A.weight");
      const model::TensorView* tb = st->Find(prefix + ".lora_B.weight");
      if (ta == nullptr || tb == nullptr) continue;
      model::LoraMatrices& m = a.layers[l][t];
      m.a.resize(static_cast<size_t>(ta->numel()));
      m.b.resize(static_cast<size_t>(tb->numel()));
      model::ConvertToF32(ta->dtype, ta->bytes.data(), m.a.size(), m.a.data());
      model::ConvertToF32(tb->dtype, tb->bytes.data(), m.b.size(), m.b.data());
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, adapter_dir, expect, shape = "tiny";
  uint64_t seed = 5;
  bool dir_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model" && i + 1 < argc) {
      model_dir = argv[++i];
    } else if (a == "--adapter" && i + 1 < argc) {
      adapter_dir = argv[++i];
    } else if (a == "--expect" && i + 1 < argc) {
      expect = argv[++i];
    } else if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--model-dir-only") {
      dir_only = true;
    } else {
      std::fprintf(stderr, "usage: lora_peft_parity --model-dir-only [--shape S] [--seed N] | --model DIR --adapter DIR "
                           "--expect tokens.json\n");
      return 2;
    }
  }
  if (dir_only) {
    std::printf("%s\n", testing::RandomModelDir(shape, seed, /*bf16=*/false).c_str());
    return 0;
  }
  if (model_dir.empty() || adapter_dir.empty() || expect.empty()) return Fail("--model, --adapter and --expect are required");
  std::ifstream f(expect);
  const nlohmann::json ref = nlohmann::json::parse(f, nullptr, false);
  if (ref.is_discarded() || !ref.contains("prompt") || !ref.contains("tokens")) return Fail(expect + ": not the script's output");
  const std::vector<TokenId> prompt = ref["prompt"].get<std::vector<TokenId>>();
  const std::vector<TokenId> want = ref["tokens"].get<std::vector<TokenId>>();
  const std::vector<double> gaps = ref.value("gaps", std::vector<double>());

  backend::BackendOptions o;
  o.model_dir = model_dir;
  o.block_size = 16;
  o.max_context = 4096;
  o.max_num_tokens = 1024;
  o.max_batch_size = 8;
  o.num_blocks = 256;
  o.max_loras = 1;
  o.max_lora_rank = model::kMaxLoraRank;
  auto made = backend::CreateBackend("cuda", o);
  if (!made.ok()) return Fail(made.status().ToString());
  backend::ModelBackend& b = **made;
  auto adapter = ReadAdapter(adapter_dir, b.config());
  if (!adapter.ok()) return Fail(adapter.status().ToString());
  if (Status s = b.LoadLora(0, *adapter); !s.ok()) return Fail(s.ToString());

  std::vector<TokenId> toks = prompt;
  std::vector<backend::BlockId> table;
  for (int i = 0; i < 256; ++i) table.push_back(static_cast<backend::BlockId>(i));
  std::vector<TokenId> got;
  int64_t pos = 0;
  while (got.size() < want.size()) {
    backend::StepBatch batch;
    backend::SequenceStep st;
    st.start_position = pos;
    st.tokens = std::span<const TokenId>(toks).subspan(static_cast<size_t>(pos));
    st.block_tables = {table};
    st.sample = true;
    st.lora_slot = 0;
    batch.seqs = {st};
    backend::StepOutput out;
    if (Status s = b.Execute(batch, &out); !s.ok()) return Fail(s.ToString());
    pos = static_cast<int64_t>(toks.size());
    got.push_back(out.tokens[0]);
    toks.push_back(out.tokens[0]);
  }
  for (size_t k = 0; k < want.size(); ++k) {
    if (got[k] != want[k]) {
      std::printf("FAIL: token %zu: kvfleet %u, HF + PEFT %u (HF's top-2 gap there %.4f); %zu of %zu equal before\n", k,
                  got[k], want[k], k < gaps.size() ? gaps[k] : NAN, k, want.size());
      return 1;
    }
  }
  std::printf("PASS: %zu greedy tokens identical to HF + PEFT (%s)\n", want.size(),
              ref.value("dtype", std::string("?")).c_str());
  return 0;
}
