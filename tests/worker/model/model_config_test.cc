// config.json parsing: the fields of each architecture, and errors that name the field.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "worker/model/model_config.h"

namespace kvfleet::model {
namespace {

std::string Llama(const std::string& extra = "") {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": [2, 3])" +
         extra + "}";
}

TEST_CASE("a Llama 3 config: GQA, derived head_dim, eos list, no window") {
  auto c = ParseModelConfig(Llama());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kLlama);
  CHECK(c->num_kv_heads == 2);
  CHECK(c->head_dim == 8);
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->rms_norm_eps == doctest::Approx(1e-5));
  CHECK(c->eos_token_ids == std::vector<int64_t>{2, 3});
  CHECK(c->bos_token_id == 1);
  CHECK_FALSE(c->tie_word_embeddings);
  CHECK_FALSE(c->attention_bias);
  CHECK(c->layer_window == std::vector<int64_t>(4, 0));
  CHECK(c->rope_scaling.type == RopeScaling::Type::kNone);
}

TEST_CASE("llama3 rope_scaling, and the same under transformers 5's rope_parameters") {
  auto c = ParseModelConfig(Llama(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  REQUIRE(c.ok());
  CHECK(c->rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(c->rope_scaling.factor == 32.0);
  CHECK(c->rope_scaling.original_max_position_embeddings == 8192);

  std::string v5 = Llama(R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 123.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  v5.replace(v5.find("\"rope_theta\": 500000.0,"), std::string("\"rope_theta\": 500000.0,").size(), "");
  auto d = ParseModelConfig(v5);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK(d->rope_scaling.factor == 8.0);
  CHECK(d->rope_theta == 123.0);
}

TEST_CASE("an unknown rope scaling is refused, naming the field") {
  auto c = ParseModelConfig(Llama(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})"));
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("rope_scaling.rope_type") != std::string::npos);
  CHECK(c.status().message().find("yarn") != std::string::npos);
}

TEST_CASE("Qwen2: QKV bias always; the window only with use_sliding_window, above max_window_layers") {
  std::string q = Llama(R"(, "sliding_window": 4096, "max_window_layers": 2, "tie_word_embeddings": true)");
  q.replace(q.find("LlamaForCausalLM"), 16, "Qwen2ForCausalLM");
  auto off = ParseModelConfig(q);
  REQUIRE(off.ok());
  CHECK(off->attention_bias);
  CHECK_FALSE(off->attention_out_bias);
  CHECK(off->tie_word_embeddings);
  CHECK_FALSE(off->has_sliding_window());

  q.insert(q.size() - 1, R"(, "use_sliding_window": true)");
  auto on = ParseModelConfig(q);
  REQUIRE(on.ok());
  CHECK(on->layer_window == std::vector<int64_t>{0, 0, 4096, 4096});
}

TEST_CASE("Mistral: the window on every layer; a per-layer list or layer_types where given") {
  std::string m = Llama(R"(, "sliding_window": 4096, "head_dim": 16)");
  m.replace(m.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
  auto c = ParseModelConfig(m);
  REQUIRE(c.ok());
  CHECK(c->layer_window == std::vector<int64_t>(4, 4096));
  CHECK(c->head_dim == 16);

  auto list = ParseModelConfig(Llama(R"(, "sliding_window": [128, null, 128, 0])"));
  REQUIRE(list.ok());
  CHECK(list->layer_window == std::vector<int64_t>{128, 0, 128, 0});

  auto types = ParseModelConfig(Llama(R"(, "sliding_window": 64, "layer_types":
      ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])"));
  REQUIRE(types.ok());
  CHECK(types->layer_window == std::vector<int64_t>{64, 0, 64, 0});

  auto bad = ParseModelConfig(Llama(R"(, "sliding_window": [1, 2])"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("sliding_window") != std::string::npos);
}

TEST_CASE("an unsupported architecture is refused by name") {
  std::string g = Llama();
  g.replace(g.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel");
  auto c = ParseModelConfig(g);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kUnimplemented);
  CHECK(c.status().message().find("architectures") != std::string::npos);
  CHECK(c.status().message().find("GPT2LMHeadModel") != std::string::npos);
}

TEST_CASE("missing and malformed fields are named") {
  std::string m = Llama();
  m.replace(m.find("\"num_attention_heads\": 8,"), std::string("\"num_attention_heads\": 8,").size(), "");
  auto c = ParseModelConfig(m);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "config.json: num_attention_heads: missing");

  auto d = ParseModelConfig(Llama(R"(, "num_key_value_heads": 3)"));  // a later duplicate key wins
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("num_key_value_heads") != std::string::npos);

  auto e = ParseModelConfig(Llama(R"(, "hidden_act": "gelu")"));
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().message().find("hidden_act") != std::string::npos);

  CHECK_FALSE(ParseModelConfig("{not json").ok());
  CHECK_FALSE(ParseModelConfig("[1, 2]").ok());
}

// A model directory in a temporary folder, removed at the end.
struct ModelDir {
  explicit ModelDir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("kvfleet-cfg-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~ModelDir() { std::filesystem::remove_all(path); }
  void Write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  std::filesystem::path path;
};

// Meta-Llama-3-8B-Instruct's two files, their eos fields as the repository has them.
std::string Llama3InstructConfig() {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"})";
}
constexpr const char* kLlama3InstructGeneration =
    R"({"bos_token_id": 128000, "eos_token_id": [128001, 128009], "do_sample": true,
        "temperature": 0.6, "max_length": 4096, "top_p": 0.9, "transformers_version": "4.40.0.dev0"})";

TEST_CASE("Llama-3-8B-Instruct's layout: the eos set is config.json's 128001 and generation_config's 128009") {
  ModelDir dir("llama3-instruct");
  dir.Write("config.json", Llama3InstructConfig());
  dir.Write("generation_config.json", kLlama3InstructGeneration);
  auto c = LoadModelConfig(dir.path.string());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->eos_token_ids == std::vector<int64_t>{128001, 128009});
}

TEST_CASE("without generation_config.json the eos set is config.json's alone") {
  ModelDir dir("no-generation");
  dir.Write("config.json", Llama3InstructConfig());
  auto c = LoadModelConfig(dir.path.string());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->eos_token_ids == std::vector<int64_t>{128001});
}

TEST_CASE("a malformed generation_config.json is refused, naming the file and the field") {
  ModelDir dir("bad-generation");
  dir.Write("config.json", Llama3InstructConfig());
  for (const char* text : {R"({"eos_token_id": "</s>"})", R"({"eos_token_id": [128001, "x"]})",
                           R"({"eos_token_id": [-5]})"}) {
    dir.Write("generation_config.json", text);
    auto c = LoadModelConfig(dir.path.string());
    REQUIRE_FALSE(c.ok());
    CHECK_MESSAGE(c.status().message().find("generation_config.json: eos_token_id") != std::string::npos,
                  c.status().message());
  }
  dir.Write("generation_config.json", "{\"eos_token_id\": ");
  auto c = LoadModelConfig(dir.path.string());
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("generation_config.json: not valid JSON") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::model
