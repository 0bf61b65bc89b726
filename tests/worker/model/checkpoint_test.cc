// Loading a model directory: single and sharded safetensors, dtypes, and the failures
// that must stop a load before any weight is used, each naming what is wrong.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/worker/model/test_models.h"
#include "worker/model/checkpoint.h"
#include "worker/model/random_model.h"

namespace kvfleet::model {
namespace {

namespace fs = std::filesystem;

// A private copy of the tiny model that a test may damage.
struct ScratchModel {
  fs::path dir;
  explicit ScratchModel(const std::string& tag) {
    dir = fs::temp_directory_path() / ("kvfleet-ckpt-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path src = testing::RandomModelDir("tiny", 1);
    for (const char* f : {"config.json", "model.safetensors"}) fs::copy_file(src / f, dir / f);
  }
  ~ScratchModel() { fs::remove_all(dir); }
  std::string path(const char* f) const { return (dir / f).string(); }
  std::string Read(const char* f) const {
    std::ifstream in(path(f), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  void Write(const char* f, const std::string& data) const {
    std::ofstream out(path(f), std::ios::binary | std::ios::trunc);
    out << data;
  }
  void Replace(const char* f, const std::string& from, const std::string& to) const {
    std::string s = Read(f);
    size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    Write(f, s);
  }
};

bool Mentions(const Status& s, const std::string& what) { return s.message().find(what) != std::string::npos; }

TEST_CASE("the tiny model opens: every tensor the architecture needs, with its shape") {
  auto ck = Checkpoint::Open(testing::RandomModelDir("tiny", 1));
  REQUIRE_MESSAGE(ck.ok(), ck.status().ToString());
  const ModelConfig& c = (*ck)->config();
  CHECK((*ck)->specs().size() == 1 + 9 * static_cast<size_t>(c.num_layers) + 1);  // tied: no lm_head
  const TensorView& embed = (*ck)->tensor("model.embed_tokens.weight");
  CHECK(embed.dtype == DType::kBF16);
  CHECK(embed.shape == std::vector<int64_t>{c.vocab_size, c.hidden_size});
  CHECK((*ck)->weight_bytes() > static_cast<uint64_t>(c.vocab_size * c.hidden_size * 2));
}

TEST_CASE("a Qwen3 checkpoint holds q_norm and k_norm of head_dim per layer; without them it is refused") {
  auto ck = Checkpoint::Open(testing::RandomModelDir("tiny-qwen3", 4));
  REQUIRE_MESSAGE(ck.ok(), ck.status().ToString());
  const ModelConfig& c = (*ck)->config();
  CHECK(c.qk_norm);
  CHECK((*ck)->specs().size() == 1 + 11 * static_cast<size_t>(c.num_layers) + 1);
  CHECK((*ck)->tensor("model.layers.1.self_attn.q_norm.weight").shape == std::vector<int64_t>{64});
  CHECK((*ck)->tensor("model.layers.1.self_attn.k_norm.weight").shape == std::vector<int64_t>{64});
  CHECK((*ck)->tensor("model.layers.0.self_attn.q_proj.weight").shape == std::vector<int64_t>{256, 64});
  CHECK((*ck)->tensor("model.layers.0.self_attn.o_proj.weight").shape == std::vector<int64_t>{64, 256});

  ScratchModel m("qwen3");  // a Llama checkpoint relabelled: no q_norm
  m.Replace("config.json", "LlamaForCausalLM", "Qwen3ForCausalLM");
  auto bad = Checkpoint::Open(m.dir.string());
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kNotFound);
  CHECK(Mentions(bad.status(), "missing tensor model.layers.0.self_attn.q_norm.weight (needed by Qwen3ForCausalLM)"));
}

TEST_CASE("MoE checkpoints hold a router and every expert's projections under HF's names") {
  auto mix = Checkpoint::Open(testing::RandomModelDir("tiny-mixtral", 7));
  REQUIRE_MESSAGE(mix.ok(), mix.status().ToString());
  const ModelConfig& c = (*mix)->config();
  // Per layer: 2 norms, q/k/v/o, the router, 4 experts × 3; then the norm and the lm_head.
  CHECK((*mix)->specs().size() == 1 + (6 + 1 + 4 * 3) * static_cast<size_t>(c.num_layers) + 2);
  CHECK((*mix)->tensor("model.layers.1.block_sparse_moe.gate.weight").shape == std::vector<int64_t>{4, 64});
  CHECK((*mix)->tensor("model.layers.1.block_sparse_moe.experts.3.w1.weight").shape == std::vector<int64_t>{96, 64});
  CHECK((*mix)->tensor("model.layers.1.block_sparse_moe.experts.3.w3.weight").shape == std::vector<int64_t>{96, 64});
  CHECK((*mix)->tensor("model.layers.1.block_sparse_moe.experts.3.w2.weight").shape == std::vector<int64_t>{64, 96});
  CHECK((*mix)->Find("model.layers.0.mlp.gate_proj.weight") == nullptr);

  auto qm = Checkpoint::Open(testing::RandomModelDir("tiny-qwen3-moe", 7));
  REQUIRE_MESSAGE(qm.ok(), qm.status().ToString());
  CHECK((*qm)->tensor("model.layers.0.mlp.gate.weight").shape == std::vector<int64_t>{8, 64});
  CHECK((*qm)->tensor("model.layers.2.mlp.experts.7.gate_proj.weight").shape == std::vector<int64_t>{48, 64});
  CHECK((*qm)->tensor("model.layers.2.mlp.experts.7.up_proj.weight").shape == std::vector<int64_t>{48, 64});
  CHECK((*qm)->tensor("model.layers.2.mlp.experts.7.down_proj.weight").shape == std::vector<int64_t>{64, 48});
  // Layer 1 is in mlp_only_layers: a dense MLP of intermediate_size, no router.
  CHECK((*qm)->tensor("model.layers.1.mlp.gate_proj.weight").shape == std::vector<int64_t>{192, 64});
  CHECK((*qm)->Find("model.layers.1.mlp.gate.weight") == nullptr);

  // A config that names more experts than the files hold: the first missing one is named.
  const fs::path dir = fs::temp_directory_path() / ("kvfleet-ckpt-moe-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path src = testing::RandomModelDir("tiny-mixtral", 7);
  fs::copy_file(src / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(src / "config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string cfg = ss.str();
  cfg.replace(cfg.find("\"num_local_experts\": 4"), 22, "\"num_local_experts\": 5");
  std::ofstream(dir / "config.json") << cfg;
  auto bad = Checkpoint::Open(dir.string());
  fs::remove_all(dir);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);  // the router is [4, 64], not [5, 64]
  CHECK(Mentions(bad.status(), "model.layers.0.block_sparse_moe.gate.weight has shape [4, 64]"));
}

TEST_CASE("a missing tensor fails the load and is named") {
  ScratchModel m("missing");
  m.Replace("model.safetensors", "\"model.norm.weight\"", "\"model.norX.weight\"");
  auto ck = Checkpoint::Open(m.dir.string());
  REQUIRE_FALSE(ck.ok());
  CHECK(ck.status().code() == StatusCode::kNotFound);
  CHECK(Mentions(ck.status(), "missing tensor model.norm.weight"));
}

TEST_CASE("a shape that disagrees with config.json fails the load and names tensor and shapes") {
  ScratchModel m("shape");
  m.Replace("config.json", "\"intermediate_size\": 192", "\"intermediate_size\": 128");
  auto ck = Checkpoint::Open(m.dir.string());
  REQUIRE_FALSE(ck.ok());
  CHECK(Mentions(ck.status(), "model.layers.0.mlp.gate_proj.weight has shape [192, 64]"));
  CHECK(Mentions(ck.status(), "[128, 64]"));
}

TEST_CASE("a truncated file fails the load and names the first tensor cut off") {
  ScratchModel m("truncated");
  const uintmax_t size = fs::file_size(m.path("model.safetensors"));
  fs::resize_file(m.path("model.safetensors"), size - 100);  // inside model.norm.weight, the last tensor
  auto ck = Checkpoint::Open(m.dir.string());
  REQUIRE_FALSE(ck.ok());
  CHECK(ck.status().code() == StatusCode::kDataLoss);
  CHECK(Mentions(ck.status(), "truncated"));
  CHECK(Mentions(ck.status(), "model.norm.weight"));

  fs::resize_file(m.path("model.safetensors"), 5);  // not even a header length
  CHECK(Mentions(Checkpoint::Open(m.dir.string()).status(), "truncated"));
  m.Write("model.safetensors", std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10));  // header past the end
  CHECK(Checkpoint::Open(m.dir.string()).status().code() == StatusCode::kDataLoss);
}

TEST_CASE("an unsupported architecture or dtype fails the load by name") {
  ScratchModel m("arch");
  m.Replace("config.json", "LlamaForCausalLM", "GPTNeoXForCausalLM");
  auto ck = Checkpoint::Open(m.dir.string());
  REQUIRE_FALSE(ck.ok());
  CHECK(Mentions(ck.status(), "GPTNeoXForCausalLM"));

  ScratchModel d("dtype");
  d.Replace("model.safetensors", "\"dtype\":\"BF16\"", "\"dtype\":\"I16\"\x20");
  auto dk = Checkpoint::Open(d.dir.string());
  REQUIRE_FALSE(dk.ok());
  CHECK(dk.status().code() == StatusCode::kUnimplemented);
  CHECK(Mentions(dk.status(), "I16"));
}

TEST_CASE("sharded checkpoints: the index names the shards, and a missing shard is named") {
  const fs::path dir = fs::temp_directory_path() / ("kvfleet-ckpt-sharded-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RandomModelOptions o;
  o.shape = "tiny";
  o.tokenizer_dir = testing::TokenizerDir();
  o.out_dir = dir.string();
  o.seed = 1;
  o.max_shard_bytes = 8 << 20;  // the 16 MB embedding alone, then the rest
  REQUIRE(MakeRandomModel(o).ok());
  CHECK_FALSE(fs::exists(dir / "model.safetensors"));
  CHECK(fs::exists(dir / "model.safetensors.index.json"));
  CHECK(fs::exists(dir / "model-00001-of-00002.safetensors"));
  CHECK(fs::exists(dir / "model-00002-of-00002.safetensors"));

  auto sharded = Checkpoint::Open(dir.string());
  REQUIRE_MESSAGE(sharded.ok(), sharded.status().ToString());
  auto single = Checkpoint::Open(testing::RandomModelDir("tiny", 1));
  REQUIRE(single.ok());
  for (const TensorSpec& s : (*single)->specs()) {
    const auto a = (*single)->tensor(s.name).bytes, b = (*sharded)->tensor(s.name).bytes;
    REQUIRE(a.size() == b.size());
    CHECK_MESSAGE(std::memcmp(a.data(), b.data(), a.size()) == 0, s.name);
  }
  fs::remove(dir / "model-00002-of-00002.safetensors");
  auto broken = Checkpoint::Open(dir.string());
  REQUIRE_FALSE(broken.ok());
  CHECK(Mentions(broken.status(), "model-00002-of-00002.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("fp32 and bf16 models of one seed hold the same weights up to bf16 rounding") {
  auto f32 = Checkpoint::Open(testing::RandomModelDir("tiny", 1, /*bf16=*/false));
  auto b16 = Checkpoint::Open(testing::RandomModelDir("tiny", 1));
  REQUIRE(f32.ok());
  REQUIRE(b16.ok());
  const TensorView& a = (*f32)->tensor("model.layers.1.mlp.down_proj.weight");
  const TensorView& b = (*b16)->tensor("model.layers.1.mlp.down_proj.weight");
  CHECK(a.dtype == DType::kF32);
  REQUIRE(a.numel() == b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) {
    float x;
    uint16_t h;
    std::memcpy(&x, a.bytes.data() + 4 * i, 4);
    std::memcpy(&h, b.bytes.data() + 2 * i, 2);
    REQUIRE(F32ToBF16(x) == h);
  }
}

TEST_CASE("half-precision conversions are exact, subnormals and specials included") {
  CHECK(F16ToF32(0x3C00) == 1.0f);
  CHECK(F16ToF32(0xC000) == -2.0f);
  CHECK(F16ToF32(0x7BFF) == 65504.0f);
  CHECK(F16ToF32(0x0400) == std::ldexp(1.0f, -14));
  CHECK(F16ToF32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(F16ToF32(0x03FF) == std::ldexp(1023.0f, -24));
  CHECK(std::isinf(F16ToF32(0x7C00)));
  CHECK(std::isnan(F16ToF32(0x7E00)));
  CHECK(BF16ToF32(0x3F80) == 1.0f);
  CHECK(F32ToBF16(1.0f) == 0x3F80);
  CHECK(F32ToBF16(BF16ToF32(0x4049)) == 0x4049);
  // Round to nearest even: 1 + 2^-8 is halfway between two bf16 values.
  CHECK(F32ToBF16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  CHECK(F32ToBF16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(std::isnan(BF16ToF32(F32ToBF16(std::nanf("")))));
}

}  // namespace
}  // namespace kvfleet::model
