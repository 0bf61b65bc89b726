#include "worker/model/checkpoint.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/check.h"

namespace kvfleet::model {
namespace {

// Redraw the progress line at most this often: a terminal update costs a syscall.
constexpr int64_t kProgressIntervalNs = 100'000'000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The safetensors files of `dir`: the shards of the index, or model.safetensors.
Result<std::vector<std::string>> ListShards(const std::string& dir) {
  namespace fs = std::filesystem;
  std::string index_path = dir + "/model.safetensors.index.json";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return DataLoss(index_path + ": no weight_map object");
    }
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) return DataLoss(index_path + ": weight_map." + it.key() + " is not a file name");
      std::string f = it->get<std::string>();
      if (f.find('/') != std::string::npos) return DataLoss(index_path + ": shard name " + f + " has a '/'");
      files.insert(f);
    }
    std::vector<std::string> paths;
    for (const auto& f : files) paths.push_back(dir + "/" + f);
    return paths;
  }
  std::string single = dir + "/model.safetensors";
  if (fs::exists(single)) return std::vector<std::string>{single};
  return NotFound(dir + ": neither model.safetensors nor model.safetensors.index.json");
}

}  // namespace

std::string LayerTensorName(int64_t layer, std::string_view suffix) {
  return "model.layers." + std::to_string(layer) + "." + std::string(suffix);
}

std::string MlpTensorName(const ModelConfig& c, int64_t layer, std::string_view suffix) {
  return LayerTensorName(layer, (c.architecture == Architecture::kLlama4 ? "feed_forward." : "mlp.") + std::string(suffix));
}

std::string RouterTensorName(const ModelConfig& c, int64_t layer) {
  if (c.architecture == Architecture::kLlama4) return MlpTensorName(c, layer, "router.weight");
  return LayerTensorName(layer, c.architecture == Architecture::kMixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}

std::string ExpertTensorName(const ModelConfig& c, int64_t layer, int64_t expert, ExpertProj proj) {
  const bool mixtral = c.architecture == Architecture::kMixtral;
  const char* names[2][3] = {{"gate_proj", "up_proj", "down_proj"}, {"w1", "w3", "w2"}};
  return LayerTensorName(layer, std::string(mixtral ? "block_sparse_moe" : "mlp") + ".experts." +
                                    std::to_string(expert) + "." + names[mixtral][static_cast<int>(proj)] + ".weight");
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  std::vector<TensorSpec> s;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), inter = c.intermediate_size;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto add = [&](std::string_view suffix, std::vector<int64_t> shape) {
      s.push_back({LayerTensorName(l, suffix), std::move(shape)});
    };
    add("input_layernorm.weight", {h});
    add("self_attn.q_proj.weight", {q, h});
    add("self_attn.k_proj.weight", {kv, h});
    add("self_attn.v_proj.weight", {kv, h});
    if (c.attention_bias) {
      add("self_attn.q_proj.bias", {q});
      add("self_attn.k_proj.bias", {kv});
      add("self_attn.v_proj.bias", {kv});
    }
    add("self_attn.o_proj.weight", {h, q});
    if (c.attention_out_bias) add("self_attn.o_proj.bias", {h});
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", {c.head_dim});
      add("self_attn.k_norm.weight", {c.head_dim});
    }
    add("post_attention_layernorm.weight", {h});
    const int64_t ei = c.moe.expert_intermediate, experts = c.moe.num_experts;
    auto mlp = [&](std::string_view suffix, std::vector<int64_t> shape) {
      s.push_back({MlpTensorName(c, l, suffix), std::move(shape)});
    };
    if (c.sparse_layer(l) && c.architecture == Architecture::kLlama4) {  // fused experts, shared expert
      const int64_t si = c.moe.shared_expert_intermediate;
      mlp("router.weight", {experts, h});
      mlp("experts.gate_up_proj", {experts, h, 2 * ei});
      mlp("experts.down_proj", {experts, ei, h});
      mlp("shared_expert.gate_proj.weight", {si, h});
      mlp("shared_expert.up_proj.weight", {si, h});
      mlp("shared_expert.down_proj.weight", {h, si});
      continue;
    }
    if (c.sparse_layer(l)) {  // router, then each expert's gate, up and down
      s.push_back({RouterTensorName(c, l), {c.moe.num_experts, h}});
      for (int64_t e = 0; e < c.moe.num_experts; ++e) {
        s.push_back({ExpertTensorName(c, l, e, ExpertProj::kGate), {ei, h}});
        s.push_back({ExpertTensorName(c, l, e, ExpertProj::kUp), {ei, h}});
        s.push_back({ExpertTensorName(c, l, e, ExpertProj::kDown), {h, ei}});
      }
      continue;
    }
    mlp("gate_proj.weight", {inter, h});
    mlp("up_proj.weight", {inter, h});
    mlp("down_proj.weight", {h, inter});
    if (c.mlp_bias) {
      mlp("gate_proj.bias", {inter});
      mlp("up_proj.bias", {inter});
      mlp("down_proj.bias", {h});
    }
  }
  s.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, h}});
  return s;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  const int64_t t0 = NowNs();
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  KVF_ASSIGN_OR_RETURN(ck->config_, LoadModelConfig(dir));
  ck->specs_ = ExpectedTensors(ck->config_);
  KVF_ASSIGN_OR_RETURN(std::vector<std::string> shards, ListShards(dir));
  for (const std::string& path : shards) {
    KVF_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    // Llama4ForConditionalGeneration: the text model's tensors by their Llama4ForCausalLM
    // names; the vision tower's and the projector's are never read.
    const std::string& prefix = ck->config_.tensor_prefix;
    for (const auto& [file_name, view] : file->tensors()) {
      if (!prefix.empty() && file_name.rfind(prefix, 0) != 0) continue;
      const std::string name = file_name.substr(prefix.size());
      if (!ck->by_name_.emplace(name, &view).second) {
        return DataLoss(dir + ": tensor " + name + " appears in two files");
      }
    }
    ck->files_.push_back(std::move(file));
  }
  for (const TensorSpec& spec : ck->specs_) {
    auto it = ck->by_name_.find(spec.name);
    if (it == ck->by_name_.end()) {
      return NotFound(dir + ": missing tensor " + spec.name + " (needed by " +
                      std::string(ArchitectureName(ck->config_.architecture)) + ")");
    }
    if (it->second->shape != spec.shape) {
      return InvalidArgument(dir + ": tensor " + spec.name + " has shape " + ShapeString(it->second->shape) +
                             ", config.json implies " + ShapeString(spec.shape));
    }
    ck->weight_bytes_ += it->second->bytes.size();
  }
  ck->open_seconds_ = static_cast<double>(NowNs() - t0) * 1e-9;
  return ck;
}

const TensorView& Checkpoint::tensor(std::string_view name) const {
  auto it = by_name_.find(name);
  KVF_CHECK(it != by_name_.end()) << "no tensor " << name;
  return *it->second;
}

const TensorView* Checkpoint::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

LoadProgress::LoadProgress(size_t total_tensors, uint64_t total_bytes)
    : total_tensors_(total_tensors), total_bytes_(total_bytes), tty_(::isatty(STDERR_FILENO) == 1) {}

LoadProgress::~LoadProgress() {
  if (tty_ && last_draw_ns_ != 0) std::fprintf(stderr, "\r\033[K");
}

void LoadProgress::Add(size_t tensors, uint64_t bytes) {
  done_tensors_ += tensors;
  done_bytes_ += bytes;
  Draw(done_tensors_ == total_tensors_);
}

void LoadProgress::Draw(bool force) {
  if (!tty_) return;
  int64_t now = NowNs();
  if (!force && now - last_draw_ns_ < kProgressIntervalNs) return;
  last_draw_ns_ = now;
  std::fprintf(stderr, "\rloading weights: %zu/%zu tensors, %.2f/%.2f GB\033[K", done_tensors_, total_tensors_,
               static_cast<double>(done_bytes_) * 1e-9, static_cast<double>(total_bytes_) * 1e-9);
  std::fflush(stderr);
}

}  // namespace kvfleet::model
