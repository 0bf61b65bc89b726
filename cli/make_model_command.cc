// kvfleet make-model: writes a Hugging Face model directory with random weights
// (worker/model/random_model.h) for tests and benchmarks.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/model_layouts.h"
#include "common/log.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"
#include "worker/model/random_model.h"

namespace kvfleet::cli {

namespace {
struct MakeModelArgs {
  std::string shape;
  std::string tokenizer;
  std::string out;
  uint64_t seed = 0;
  std::string dtype = "bf16";
  bool config_only = false;
  std::string layout;         // --layout: a real repository's files instead of --shape's
  std::string chat_template;  // --layout's template (default: --tokenizer's)
  double end_of_turn_scale = 1.0;
  std::vector<std::string> loras;  // --lora NAME[:RANK]: random PEFT adapters in out/loras/NAME
};

// One --lora NAME[:RANK]: rank 16 unless given. False (with a message) for a bad spec.
bool ParseLoraSpec(const std::string& spec, std::string* name, int32_t* rank) {
  const size_t colon = spec.find(':');
  *name = spec.substr(0, colon);
  *rank = 16;
  if (colon != std::string::npos) {
    try {
      size_t used = 0;
      *rank = std::stoi(spec.substr(colon + 1), &used);
      if (used != spec.size() - colon - 1) throw std::invalid_argument("trailing characters");
    } catch (const std::exception&) {
      std::cerr << "error: --lora " << spec << ": RANK must be an integer\n";
      return false;
    }
  }
  if (*rank < 1 || *rank > model::kMaxLoraRank) {
    std::cerr << "error: --lora " << spec << ": RANK must be in 1.." << model::kMaxLoraRank << "\n";
    return false;
  }
  if (name->empty() || name->find('/') != std::string::npos || *name == "." || *name == "..") {
    std::cerr << "error: --lora " << spec << ": NAME must be a non-empty file name\n";
    return false;
  }
  return true;
}

// Writes each --lora as a random PEFT adapter (alpha twice the rank, all seven targets) in
// out/loras/NAME, for the model just written.
int MakeLoras(const MakeModelArgs& a, model::DType dtype) {
  auto config = model::LoadModelConfig(a.out);
  if (!config.ok()) {
    std::cerr << "error: --lora: " << config.status().message() << "\n";
    return 1;
  }
  std::string base = a.out;
  while (!base.empty() && base.back() == '/') base.pop_back();
  base = base.substr(base.rfind('/') == std::string::npos ? 0 : base.rfind('/') + 1);
  for (const std::string& spec : a.loras) {
    std::string name;
    model::RandomLoraOptions o;
    if (!ParseLoraSpec(spec, &name, &o.rank)) return 2;
    o.alpha = 2.0f * static_cast<float>(o.rank);
    o.seed = model::RandomTensorKey(a.seed, "lora:" + name);
    o.base_model = base;
    o.dtype = dtype;
    Status st = model::WriteRandomLoraAdapter(a.out + "/loras/" + name, *config, o);
    if (!st.ok()) {
      std::cerr << "error: --lora " << spec << ": " << st.message() << "\n";
      return 1;
    }
    Logger("model")->info("make-model: wrote LoRA adapter {}/loras/{} (rank {})", a.out, name, o.rank);
  }
  return 0;
}

// --layout: cli/model_layouts.h.
int MakeLayout(const MakeModelArgs& a, model::DType dtype) {
  if (!a.shape.empty() || a.config_only) {
    std::cerr << "error: --layout writes a whole repository: it takes no --shape or --config-only\n";
    return 2;
  }
  ModelLayoutOptions o;
  o.layout = a.layout;
  o.tokenizer_dir = a.tokenizer;
  o.chat_template_file = a.chat_template;
  o.out_dir = a.out;
  o.seed = a.seed;
  o.dtype = dtype;
  o.end_of_turn_scale = a.end_of_turn_scale;
  Status st = WriteModelLayout(o);
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
  }
  Logger("model")->info("make-model: wrote {} (layout {}, seed {})", a.out, a.layout, a.seed);
  return 0;
}
}  // namespace

Action AddMakeModelCommand(CLI::App& parent) {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* cmd = parent.add_subcommand("make-model", "write a random-weight HF model directory of a known shape");
  std::string shapes;
  for (const auto& s : model::RandomModelShapes()) shapes += (shapes.empty() ? "" : ", ") + s;
  cmd->add_option("--shape", args->shape, "model shape: " + shapes);
  std::string layouts;
  for (const auto& s : ModelLayoutNames()) layouts += (layouts.empty() ? "" : ", ") + s;
  cmd->add_option("--layout", args->layout,
                  "instead of --shape: a real repository's file set and config values at tiny sizes: " + layouts);
  cmd->add_option("--chat-template", args->chat_template, "--layout: the repository's chat template file "
                                                           "(default: the --tokenizer directory's)");
  cmd->add_option("--end-of-turn-scale", args->end_of_turn_scale,
                  "--layout: multiply the end-of-turn token's lm_head row by this, so greedy answers end at it "
                  "within a few tokens (tests of stop ids)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer, "directory with tokenizer.json (and tokenizer_config.json)")
      ->required();
  cmd->add_option("--out", args->out, "output directory")->required();
  cmd->add_option("--seed", args->seed, "weight seed; the same seed writes the same bytes")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "weight dtype: bf16 or fp32")->capture_default_str();
  cmd->add_option("--lora", args->loras,
                  "NAME[:RANK] (repeatable): also write a random PEFT LoRA adapter of this rank (default 16, at "
                  "most 64; alpha 2·RANK; q, k, v, o, gate, up and down) in OUT/loras/NAME, for --lora NAME=DIR "
                  "of kvfleet worker");
  cmd->add_flag("--config-only", args->config_only,
                "write config.json and the tokenizer files only (weights: tests/gpu/make_reference.py --make-model)");
  return [args]() {
    if (args->shape.empty() == args->layout.empty()) {
      std::cerr << "error: make-model needs one of --shape or --layout\n";
      return 2;
    }
    if (args->layout.empty() && (!args->chat_template.empty() || args->end_of_turn_scale != 1.0)) {
      std::cerr << "error: --chat-template and --end-of-turn-scale go with --layout, not --shape\n";
      return 2;
    }
    if (!args->layout.empty() && !args->loras.empty()) {
      std::cerr << "error: --lora goes with --shape, not --layout\n";
      return 2;
    }
    for (const std::string& spec : args->loras) {
      std::string name;
      int32_t rank = 0;
      if (!ParseLoraSpec(spec, &name, &rank)) return 2;
    }
    if (!args->layout.empty()) {
      if (args->dtype != "bf16" && args->dtype != "fp32") {
        std::cerr << "error: --dtype must be bf16 or fp32, not " << args->dtype << "\n";
        return 2;
      }
      return MakeLayout(*args, args->dtype == "bf16" ? model::DType::kBF16 : model::DType::kF32);
    }
    model::RandomModelOptions o;
    o.shape = args->shape;
    o.tokenizer_dir = args->tokenizer;
    o.out_dir = args->out;
    o.seed = args->seed;
    o.config_only = args->config_only;
    if (args->dtype == "bf16") {
      o.dtype = model::DType::kBF16;
    } else if (args->dtype == "fp32") {
      o.dtype = model::DType::kF32;
    } else {
      std::cerr << "error: --dtype must be bf16 or fp32, not " << args->dtype << "\n";
      return 2;
    }
    const bool tty = ::isatty(STDERR_FILENO) == 1;
    o.progress = [tty](size_t t, size_t tn, uint64_t b, uint64_t bn) {
      if (tty) std::fprintf(stderr, "\rwriting: %zu/%zu tensors, %.2f/%.2f GB\033[K", t, tn, b * 1e-9, bn * 1e-9);
    };
    auto t0 = std::chrono::steady_clock::now();
    Status st = model::MakeRandomModel(o);
    if (tty) std::fprintf(stderr, "\r\033[K");
    if (!st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 1;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Logger("model")->info("make-model: wrote {} ({}, seed {}, {}) in {:.1f} s", o.out_dir, o.shape, o.seed,
                          args->dtype, s);
    return MakeLoras(*args, o.dtype);
  };
}

}  // namespace kvfleet::cli
