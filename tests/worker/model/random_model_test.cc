// make-model: configs that match the real models, tokenizer-sized tiny shapes, and
// weights that are a pure function of the seed.
#include <doctest/doctest.h>

#include <unistd.h>

#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/worker/model/test_models.h"
#include "worker/model/model_config.h"
#include "worker/model/random_model.h"

namespace kvfleet::model {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelConfig ConfigOf(const std::string& shape) {
  auto j = RandomModelConfig(shape, 1000, 1, 2);
  REQUIRE_MESSAGE(j.ok(), j.status().ToString());
  auto c = ParseModelConfig(j->dump());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  return *c;
}

TEST_CASE("the shapes' configs are the real models' architectures") {
  ModelConfig smol = ConfigOf("smollm2-135m");
  CHECK(smol.hidden_size == 576);
  CHECK(smol.num_layers == 30);
  CHECK(smol.num_heads == 9);
  CHECK(smol.num_kv_heads == 3);
  CHECK(smol.vocab_size == 49152);
  CHECK(smol.tie_word_embeddings);

  ModelConfig qwen = ConfigOf("qwen2.5-0.5b");
  CHECK(qwen.architecture == Architecture::kQwen2);
  CHECK(qwen.attention_bias);
  CHECK(qwen.num_kv_heads == 2);
  CHECK(qwen.head_dim == 64);
  CHECK(qwen.vocab_size == 151936);
  CHECK_FALSE(qwen.has_sliding_window());

  ModelConfig l32 = ConfigOf("llama-3.2-1b");
  CHECK(l32.rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(l32.rope_scaling.factor == 32.0);
  CHECK(l32.tie_word_embeddings);

  ModelConfig l8b = ConfigOf("llama-3.1-8b");
  CHECK(l8b.hidden_size == 4096);
  CHECK(l8b.intermediate_size == 14336);
  CHECK(l8b.num_layers == 32);
  CHECK(l8b.num_kv_heads == 8);
  CHECK(l8b.rope_scaling.factor == 8.0);
  CHECK_FALSE(l8b.tie_word_embeddings);

  ModelConfig mistral = ConfigOf("mistral-7b");
  CHECK(mistral.architecture == Architecture::kMistral);
  CHECK(mistral.layer_window == std::vector<int64_t>(32, 4096));
  CHECK(mistral.vocab_size == 32000);

  CHECK_FALSE(RandomModelConfig("gpt-5", 1000, 1, 2).ok());
}

TEST_CASE("the Qwen3 shapes are Qwen/Qwen3-0.6B, -8B and -32B") {
  struct Want {
    const char* shape;
    int64_t hidden, inter, layers, heads;
    bool tied;
  };
  for (Want w : {Want{"qwen3-0.6b", 1024, 3072, 28, 16, true}, Want{"qwen3-8b", 4096, 12288, 36, 32, false},
                 Want{"qwen3-32b", 5120, 25600, 64, 64, false}}) {
    CAPTURE(w.shape);
    ModelConfig c = ConfigOf(w.shape);
    CHECK(c.architecture == Architecture::kQwen3);
    CHECK(c.model_type == "qwen3");
    CHECK(c.qk_norm);
    CHECK(c.hidden_size == w.hidden);
    CHECK(c.intermediate_size == w.inter);
    CHECK(c.num_layers == w.layers);
    CHECK(c.num_heads == w.heads);
    CHECK(c.num_kv_heads == 8);
    CHECK(c.head_dim == 128);
    CHECK(c.tie_word_embeddings == w.tied);
    CHECK(c.vocab_size == 151936);
    CHECK(c.max_position_embeddings == 40960);
    CHECK(c.rope_theta == 1e6);
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.rope_scaling.type == RopeScaling::Type::kNone);
    CHECK_FALSE(c.attention_bias);
    CHECK_FALSE(c.attention_out_bias);
    CHECK_FALSE(c.has_sliding_window());
    CHECK(c.bos_token_id == 151643);
    CHECK(c.eos_token_ids == std::vector<int64_t>{151645});
  }
  // qwen3-0.6b: q is twice as wide as the hidden state (16 heads of 128).
  CHECK(ConfigOf("qwen3-0.6b").q_size() == 2048);

  // tiny-qwen3: head_dim 64 where hidden/heads is 16, and YaRN x4 from 32768.
  ModelConfig t = ConfigOf("tiny-qwen3");
  CHECK(t.head_dim == 64);
  CHECK(t.hidden_size / t.num_heads == 16);
  CHECK(t.rope_scaling.type == RopeScaling::Type::kYarn);
  CHECK(t.rope_scaling.factor == 4.0);
  CHECK(t.rope_scaling.original_max_position_embeddings == 32768);
  CHECK(t.max_position_embeddings == 4 * 32768);
}

TEST_CASE("the MoE shapes are Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1, Scout with 4 experts, and two tiny ones") {
  ModelConfig q = ConfigOf("qwen3-30b-a3b");
  CHECK(q.architecture == Architecture::kQwen3Moe);
  CHECK(q.hidden_size == 2048);
  CHECK(q.num_layers == 48);
  CHECK(q.num_heads == 32);
  CHECK(q.num_kv_heads == 4);
  CHECK(q.head_dim == 128);
  CHECK(q.vocab_size == 151936);
  CHECK(q.moe.num_experts == 128);
  CHECK(q.moe.experts_per_token == 8);
  CHECK(q.moe.expert_intermediate == 768);
  CHECK(q.moe.norm_topk_prob);
  CHECK(q.sparse_layer(0));
  CHECK(q.sparse_layer(47));
  CHECK_FALSE(q.tie_word_embeddings);

  ModelConfig m = ConfigOf("mixtral-8x7b");
  CHECK(m.architecture == Architecture::kMixtral);
  CHECK(m.hidden_size == 4096);
  CHECK(m.num_layers == 32);
  CHECK(m.num_kv_heads == 8);
  CHECK(m.vocab_size == 32000);
  CHECK(m.rope_theta == 1e6);
  CHECK(m.moe.num_experts == 8);
  CHECK(m.moe.experts_per_token == 2);
  CHECK(m.moe.expert_intermediate == 14336);
  CHECK_FALSE(m.has_sliding_window());

  ModelConfig tm = ConfigOf("tiny-mixtral");
  CHECK(tm.moe.num_experts == 4);
  CHECK(tm.moe.experts_per_token == 2);
  CHECK(tm.moe.norm_topk_prob);
  CHECK_FALSE(tm.tie_word_embeddings);

  // tiny-qwen3-moe: a dense layer between two MoE layers; top-2 not renormalised.
  ModelConfig tq = ConfigOf("tiny-qwen3-moe");
  CHECK(tq.num_layers == 3);
  CHECK(tq.sparse_layer(0));
  CHECK_FALSE(tq.sparse_layer(1));
  CHECK(tq.sparse_layer(2));
  CHECK(tq.moe.num_experts == 8);
  CHECK(tq.moe.expert_intermediate == 48);
  CHECK_FALSE(tq.moe.norm_topk_prob);
  CHECK(tq.head_dim == 32);

  // llama-4-scout-4e: Scout's text model with 4 experts: every layer MoE, top-1 sigmoid with a
  // shared expert, every 4th layer NoPE and global, the others chunked.
  ModelConfig s = ConfigOf("llama-4-scout-4e");
  CHECK(s.architecture == Architecture::kLlama4);
  CHECK(s.hidden_size == 5120);
  CHECK(s.num_layers == 48);
  CHECK(s.num_heads == 40);
  CHECK(s.num_kv_heads == 8);
  CHECK(s.vocab_size == 202048);
  CHECK(s.moe.num_experts == 4);
  CHECK(s.moe.experts_per_token == 1);
  CHECK(s.moe.sigmoid_routing);
  CHECK(s.moe.expert_intermediate == 8192);
  CHECK(s.moe.shared_expert_intermediate == 8192);
  CHECK(s.attention_chunk_size == 8192);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    CAPTURE(l);
    CHECK(s.sparse_layer(l));
    CHECK(s.uses_rope(l) == ((l + 1) % 4 != 0));
  }
}

TEST_CASE("tiny shapes take the tokenizer's vocabulary and special tokens") {
  const fs::path dir = testing::RandomModelDir("tiny", 1);
  auto c = LoadModelConfig(dir.string());
  REQUIRE(c.ok());
  CHECK(c->vocab_size == 128256);  // Llama 3: 128000 BPE tokens + 256 special
  CHECK(c->bos_token_id == 128000);
  CHECK(c->eos_token_ids == std::vector<int64_t>{128001});
  CHECK(c->tie_word_embeddings);
  CHECK(c->hidden_size == 64);
  CHECK(fs::exists(dir / "tokenizer.json"));
  CHECK(fs::exists(dir / "tokenizer_config.json"));
  CHECK(ReadFile(dir / "tokenizer.json") == ReadFile(fs::path(testing::TokenizerDir()) / "tokenizer.json"));
}

TEST_CASE("the same seed writes the same bytes; another seed other weights") {
  const fs::path root = fs::temp_directory_path() / ("kvfleet-mm-" + std::to_string(::getpid()));
  auto make = [&](const std::string& name, uint64_t seed) {
    RandomModelOptions o;
    o.shape = "tiny-qwen2";
    o.tokenizer_dir = testing::TokenizerDir();
    o.out_dir = (root / name).string();
    o.seed = seed;
    REQUIRE(MakeRandomModel(o).ok());
    return ReadFile(root / name / "model.safetensors");
  };
  const std::string a = make("a", 7), b = make("b", 7), c = make("c", 8);
  CHECK(a == b);
  CHECK(a.size() == c.size());
  CHECK(a != c);
  // Golden: the bytes of tiny-qwen2 seed 7 on any x86-64 machine (the numpy generator of
  // tests/gpu/make_reference.py reproduced make-model's files bit for bit on the GPU machine).
  CHECK(XXH3_64bits(a.data(), a.size()) == 0x9a540bdd207f5306ull);
  fs::remove_all(root);
}

TEST_CASE("bad options fail before anything is written") {
  RandomModelOptions o;
  o.shape = "tiny";
  o.tokenizer_dir = "/nonexistent";
  o.out_dir = (fs::temp_directory_path() / "kvfleet-mm-never").string();
  Status st = MakeRandomModel(o);
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("tokenizer.json") != std::string::npos);
  CHECK_FALSE(fs::exists(o.out_dir));
  o.tokenizer_dir = testing::TokenizerDir();
  o.shape = "tiny-llama-9000";
  CHECK(MakeRandomModel(o).message().find("unknown shape") != std::string::npos);
  CHECK_FALSE(fs::exists(o.out_dir));
}

}  // namespace
}  // namespace kvfleet::model
