// PEFT LoRA adapters: what make-model writes loads back, and every adapter the worker cannot
// serve is refused with the file and the field named.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "worker/model/random_model.h"

namespace kvfleet::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ModelConfig ConfigOf(const std::string& shape) {
  auto j = RandomModelConfig(shape, 1000, 1, 2);
  REQUIRE_MESSAGE(j.ok(), j.status().ToString());
  auto c = ParseModelConfig(j->dump());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  return *c;
}

// A fresh directory per test case, removed at its end.
struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("kvfleet-lora-test-" + std::to_string(getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void EditConfig(const std::string& dir, const std::function<void(json&)>& edit) {
  std::ifstream in(dir + "/adapter_config.json");
  json j = json::parse(in);
  edit(j);
  std::ofstream(dir + "/adapter_config.json") << j.dump(2);
}

std::string Written(const TempDir& tmp, const ModelConfig& c, RandomLoraOptions o = {}) {
  const std::string dir = tmp / "adapter";
  o.base_model = o.base_model.empty() ? "org/tiny-model" : o.base_model;
  Status st = WriteRandomLoraAdapter(dir, c, o);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  return dir;
}

Result<LoraAdapter> Load(const std::string& dir, const ModelConfig& c) {
  return LoadLoraAdapter("sql", dir, c, "tiny-model", "/models/tiny-model");
}

TEST_CASE("an adapter make-model writes loads back with its rank, scaling and every target of every layer") {
  TempDir tmp;
  const ModelConfig c = ConfigOf("tiny");
  RandomLoraOptions o;
  o.rank = 8;
  o.alpha = 16;
  auto a = Load(Written(tmp, c, o), c);
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  CHECK(a->name == "sql");
  CHECK(a->lora_id == LoraId("sql"));
  CHECK(a->base_model == "org/tiny-model");
  CHECK(a->rank == 8);
  CHECK(a->scaling == doctest::Approx(2.0));
  REQUIRE(a->layers.size() == static_cast<size_t>(c.num_layers));
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const LoraDims d = LoraTargetDims(c, static_cast<LoraTarget>(t));
    CHECK(a->Targets(static_cast<LoraTarget>(t)));
    CHECK(a->layers[1][t].a.size() == static_cast<size_t>(8 * d.in));
    CHECK(a->layers[1][t].b.size() == static_cast<size_t>(8 * d.out));
  }
  // B is random too (PEFT's zero B would make the adapter a no-op).
  double sum_sq = 0;
  for (float v : a->layers[0][static_cast<int>(LoraTarget::kDown)].b) sum_sq += v * v;
  CHECK(sum_sq > 0);
  CHECK(a->Fp32Bytes() > 0);
}

TEST_CASE("a bf16 adapter loads as the fp32 adapter of the same seed rounded to bf16") {
  TempDir tmp;
  const ModelConfig c = ConfigOf("tiny-qwen2");
  RandomLoraOptions o;
  o.rank = 4;
  o.targets = {LoraTarget::kV, LoraTarget::kUp};
  auto f32 = Load(Written(tmp, c, o), c);
  REQUIRE(f32.ok());
  o.dtype = DType::kBF16;
  auto b16 = Load(Written(tmp, c, o), c);
  REQUIRE_MESSAGE(b16.ok(), b16.status().ToString());
  CHECK_FALSE(b16->Targets(LoraTarget::kQ));
  CHECK(b16->Targets(LoraTarget::kUp));
  const auto& x = f32->layers[0][static_cast<int>(LoraTarget::kV)].a;
  const auto& y = b16->layers[0][static_cast<int>(LoraTarget::kV)].a;
  REQUIRE(x.size() == y.size());
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == BF16ToF32(F32ToBF16(x[i])));
}

TEST_CASE("use_rslora scales by alpha / sqrt(rank); all-linear targets the seven projections") {
  TempDir tmp;
  const ModelConfig c = ConfigOf("tiny");
  RandomLoraOptions o;
  o.rank = 16;
  o.alpha = 8;
  const std::string dir = Written(tmp, c, o);
  EditConfig(dir, [](json& j) {
    j["use_rslora"] = true;
    j["target_modules"] = "all-linear";
  });
  auto a = Load(dir, c);
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  CHECK(a->scaling == doctest::Approx(2.0));
}

// Each case edits a valid adapter's config; the error must name the file and the field.
TEST_CASE("adapters the worker cannot serve are refused, naming the file and the field") {
  const ModelConfig c = ConfigOf("tiny");
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    const char* field;
  };
  const Case cases[] = {
      {"rank 0", [](json& j) { j["r"] = 0; }, "r: rank 0"},
      {"rank 65", [](json& j) { j["r"] = 65; }, "r: rank 65"},
      {"an unknown target", [](json& j) { j["target_modules"] = {"q_proj", "embed_tokens"}; }, "target_modules"},
      {"DoRA", [](json& j) { j["use_dora"] = true; }, "use_dora"},
      {"a trained bias", [](json& j) { j["bias"] = "lora_only"; }, "bias"},
      {"a rank pattern", [](json& j) { j["rank_pattern"] = {{"q_proj", 4}}; }, "rank_pattern"},
      {"a layer subset", [](json& j) { j["layers_to_transform"] = {0}; }, "layers_to_transform"},
      {"modules to save", [](json& j) { j["modules_to_save"] = {"lm_head"}; }, "modules_to_save"},
      {"fan_in_fan_out", [](json& j) { j["fan_in_fan_out"] = true; }, "fan_in_fan_out"},
      {"another base model", [](json& j) { j["base_model_name_or_path"] = "meta-llama/Llama-3.1-8B"; },
       "base_model_name_or_path"},
      {"no lora_alpha", [](json& j) { j.erase("lora_alpha"); }, "lora_alpha"},
      {"another PEFT type", [](json& j) { j["peft_type"] = "IA3"; }, "peft_type"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    TempDir tmp;
    const std::string dir = Written(tmp, c);
    EditConfig(dir, k.edit);
    auto a = Load(dir, c);
    REQUIRE_FALSE(a.ok());
    CHECK(a.status().code() == StatusCode::kInvalidArgument);
    CHECK_MESSAGE(a.status().message().find("adapter_config.json: " + std::string(k.field)) != std::string::npos,
                  a.status().message());
  }
}

TEST_CASE("tensors that do not fit the model are refused, naming the tensor and its shape") {
  TempDir tmp;
  // An adapter for tiny-qwen3 (head_dim 64) does not fit tiny's projections.
  const std::string dir = Written(tmp, ConfigOf("tiny-qwen3"));
  auto a = Load(dir, ConfigOf("tiny"));
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("adapter_model.safetensors: base_model.model.model.layers.") != std::string::npos);
  CHECK(a.status().message().find("expected [") != std::string::npos);

  // Targets the config leaves out but the file holds would be silently ignored.
  const ModelConfig c = ConfigOf("tiny");
  const std::string dir2 = Written(tmp, c);
  EditConfig(dir2, [](json& j) { j["target_modules"] = {"q_proj"}; });
  auto b = Load(dir2, c);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find(".lora_A.weight: not the lora_A or lora_B matrix") != std::string::npos);
  CHECK(b.status().message().find("q_proj") == std::string::npos);

  // A target the config names but the file lacks.
  RandomLoraOptions only_q;
  only_q.targets = {LoraTarget::kQ};
  const std::string dir3 = Written(tmp, c, only_q);
  EditConfig(dir3, [](json& j) { j["target_modules"] = {"q_proj", "o_proj"}; });
  auto m = Load(dir3, c);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().message().find("o_proj.lora_A.weight: missing") != std::string::npos);
}

TEST_CASE("an MoE model's adapter: gate/up/down only on its dense layers; an expert's adapter is refused") {
  TempDir tmp;
  const ModelConfig c = ConfigOf("tiny-qwen3-moe");  // layer 1 dense, layers 0 and 2 MoE
  const std::string dir = Written(tmp, c);
  auto a = Load(dir, c);
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  for (int64_t l = 0; l < 3; ++l) {
    CAPTURE(l);
    CHECK_FALSE(a->layers[l][static_cast<int>(LoraTarget::kQ)].empty());
    CHECK(a->layers[l][static_cast<int>(LoraTarget::kGate)].empty() == c.sparse_layer(l));
    CHECK(a->layers[l][static_cast<int>(LoraTarget::kDown)].empty() == c.sparse_layer(l));
  }

  // PEFT's "gate_proj" also matches the experts' gate_proj: such tensors are refused by name.
  // (A 4-layer adapter's layer 3 renamed, same length, to an expert's in the file's header.)
  ModelConfig four = c;
  four.num_layers = 4;
  four.moe.layer_sparse.push_back(true);
  four.layer_window.push_back(0);
  RandomLoraOptions q;
  q.targets = {LoraTarget::kQ};
  const std::string dir2 = tmp / "experts";
  q.base_model = "org/tiny-model";
  REQUIRE(WriteRandomLoraAdapter(dir2, four, q).ok());
  std::string bytes;
  {
    std::ifstream in(dir2 + "/adapter_model.safetensors", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  for (size_t at; (at = bytes.find("layers.3.self_attn.q_proj")) != std::string::npos;) {
    bytes.replace(at, 25, "layers.0.mlp.experts.0.qp");
  }
  std::ofstream(dir2 + "/adapter_model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
  auto b = Load(dir2, c);
  REQUIRE_FALSE(b.ok());
  CHECK_MESSAGE(b.status().message().find("layers.0.mlp.experts.0.qp.lora_") != std::string::npos, b.status().message());
  CHECK_MESSAGE(b.status().message().find("adapters of MoE experts are not supported") != std::string::npos,
                b.status().message());
}

TEST_CASE("a directory without the adapter's files is NotFound, naming the file") {
  TempDir tmp;
  auto a = Load(tmp / "nothing", ConfigOf("tiny"));
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().code() == StatusCode::kNotFound);
  CHECK(a.status().message().find("adapter_config.json") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::model
