// make-model --layout (cli/model_layouts.h) on small hand-made tokenizers, no npm assets:
// the repository's file set and config values, a checkpoint the worker's loader opens
// (LoadModelConfig stops on generation_config.json's eos ids too), the end-of-turn row
// scaled and no other, and the refusals (wrong tokenizer family, no template, a template
// that does not end turns, a non-empty --out). tests/integration/router/model_layouts_test.mjs
// serves the layouts with the real tokenizers.
#include "cli/model_layouts.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
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

}  // namespace kvfleet::cli
