#include "worker/model/random_model.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "common/check.h"
#include "common/tokenizer_files.h"
#include "worker/model/checkpoint.h"
#include "worker/model/model_config.h"
#include "worker/model/splitmix64.h"

namespace kvfleet::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Elements generated per write: 4 MiB of fp32, small next to any machine's memory.
constexpr size_t kChunkElements = 1 << 20;

uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct TokenizerInfo {
  int64_t vocab_size = 0;  // the largest id + 1
  int64_t bos = -1, eos = -1;
};

// The id of a special token named in tokenizer_config.json ("<s>" or {"content": "<s>"}).
int64_t SpecialTokenId(const json& cfg, const char* key, const json& tok) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return -1;
  std::string content;
  if (it->is_string()) content = it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    content = (*it)["content"].get<std::string>();
  }
  if (content.empty()) return -1;
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& a : tok["added_tokens"]) {
      if (a.value("content", std::string()) == content && a.contains("id")) return a["id"].get<int64_t>();
    }
  }
  if (tok.contains("model") && tok["model"].contains("vocab") && tok["model"]["vocab"].is_object()) {
    auto v = tok["model"]["vocab"].find(content);
    if (v != tok["model"]["vocab"].end() && v->is_number_integer()) return v->get<int64_t>();
  }
  return -1;
}

Result<TokenizerInfo> ReadTokenizerInfo(const std::string& dir) {
  KVF_ASSIGN_OR_RETURN(std::string text, ReadModelFile(dir + "/tokenizer.json"));
  json tok = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (tok.is_discarded() || !tok.is_object()) return InvalidArgument(dir + "/tokenizer.json: not a JSON object");
  TokenizerInfo info;
  if (tok.contains("model") && tok["model"].contains("vocab")) {
    const json& vocab = tok["model"]["vocab"];
    if (vocab.is_object()) {
      for (const auto& [k, id] : vocab.items()) {
        if (id.is_number_integer()) info.vocab_size = std::max(info.vocab_size, id.get<int64_t>() + 1);
      }
    } else if (vocab.is_array()) {  // Unigram: [[piece, score], ...]
      info.vocab_size = static_cast<int64_t>(vocab.size());
    }
  }
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& a : tok["added_tokens"]) {
      if (a.contains("id") && a["id"].is_number_integer()) {
        info.vocab_size = std::max(info.vocab_size, a["id"].get<int64_t>() + 1);
      }
    }
  }
  if (info.vocab_size <= 0) return InvalidArgument(dir + "/tokenizer.json: no vocabulary");
  auto cfg_text = ReadModelFile(dir + "/tokenizer_config.json");
  if (cfg_text.ok()) {
    json cfg = json::parse(*cfg_text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_object()) {
      info.bos = SpecialTokenId(cfg, "bos_token", tok);
      info.eos = SpecialTokenId(cfg, "eos_token", tok);
    }
  }
  return info;
}

// Tokenizer files are everything a tokenizer directory holds except model files.
bool IsTokenizerFile(const std::string& name) {
  return name.rfind("tokenizer", 0) == 0 || name == "special_tokens_map.json" || name == "vocab.json" ||
         name == "merges.txt" || name == "added_tokens.json" || name == "generation_config.json" ||
         name == "chat_template.jinja";
}

json LlamaBase(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads, int64_t vocab,
               int64_t max_pos, double theta, double eps, bool tie) {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"hidden_act", "silu"},
              {"hidden_size", hidden},
              {"initializer_range", 0.02},
              {"intermediate_size", inter},
              {"max_position_embeddings", max_pos},
              {"mlp_bias", false},
              {"num_attention_heads", heads},
              {"num_hidden_layers", layers},
              {"num_key_value_heads", kv_heads},
              {"pretraining_tp", 1},
              {"rms_norm_eps", eps},
              {"rope_scaling", nullptr},
              {"rope_theta", theta},
              {"tie_word_embeddings", tie},
              {"torch_dtype", "bfloat16"},
              {"use_cache", true},
              {"vocab_size", vocab}};
}

json Llama3Scaling(double factor) {
  return json{{"factor", factor},
              {"high_freq_factor", 4.0},
              {"low_freq_factor", 1.0},
              {"original_max_position_embeddings", 8192},
              {"rope_type", "llama3"}};
}

// Turns a LlamaBase config into another Llama-like architecture's: its names, and without the
// Llama-only keys (attention/MLP bias flags, pretraining_tp, rope_scaling).
void AsArchitecture(json& c, const char* architecture, const char* model_type) {
  c["architectures"] = {architecture};
  c["model_type"] = model_type;
  for (const char* key : {"attention_bias", "mlp_bias", "pretraining_tp", "rope_scaling"}) c.erase(key);
}

// Qwen3 (Qwen/Qwen3-*): Qwen2's config keys without QKV bias, an explicit head_dim (not
// hidden/heads), theta 1e6, 40960 positions, no sliding window.
json Qwen3Base(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
               int64_t vocab, bool tie) {
  json c = LlamaBase(hidden, inter, layers, heads, kv_heads, vocab, 40960, 1000000.0, 1e-6, tie);
  AsArchitecture(c, "Qwen3ForCausalLM", "qwen3");
  c["attention_bias"] = false;
  c["head_dim"] = head_dim;
  c["rope_scaling"] = nullptr;
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = layers;
  return c;
}

// Mixtral (mistralai/Mixtral-8x7B-v0.1): Mistral's keys with theta 1e6, no sliding window,
// and `experts` experts of intermediate_size, top-`top_k`.
json MixtralBase(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads, int64_t vocab,
                 int64_t experts, int64_t top_k) {
  json c = LlamaBase(hidden, inter, layers, heads, kv_heads, vocab, 32768, 1000000.0, 1e-5, false);
  AsArchitecture(c, "MixtralForCausalLM", "mixtral");
  c["sliding_window"] = nullptr;
  c["num_local_experts"] = experts;
  c["num_experts_per_tok"] = top_k;
  c["output_router_logits"] = false;
  c["router_aux_loss_coef"] = 0.02;
  c["router_jitter_noise"] = 0.0;
  return c;
}

// Qwen3-MoE (Qwen/Qwen3-30B-A3B): Qwen3's keys and the MoE block's; `inter` is the dense
// layers' (mlp_only_layers) intermediate size, `expert_inter` each expert's.
json Qwen3MoeBase(int64_t hidden, int64_t inter, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  int64_t vocab, bool tie, int64_t experts, int64_t top_k, int64_t expert_inter) {
  json c = Qwen3Base(hidden, inter, layers, heads, kv_heads, head_dim, vocab, tie);
  c["architectures"] = {"Qwen3MoeForCausalLM"};
  c["model_type"] = "qwen3_moe";
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = json::array();
  c["moe_intermediate_size"] = expert_inter;
  c["norm_topk_prob"] = true;
  c["num_experts"] = experts;
  c["num_experts_per_tok"] = top_k;
  c["output_router_logits"] = false;
  c["router_aux_loss_coef"] = 0.001;
  return c;
}

// Llama 4's text model (Llama4ForCausalLM; meta-llama/Llama-4-Scout-17B-16E's text_config
// keys): `expert_inter` is intermediate_size (experts and the shared expert), `inter` the
// dense layers' intermediate_size_mlp.
json Llama4TextBase(int64_t hidden, int64_t inter, int64_t expert_inter, int64_t layers, int64_t heads,
                    int64_t kv_heads, int64_t head_dim, int64_t vocab, int64_t experts, int64_t moe_step,
                    int64_t chunk) {
  json c = LlamaBase(hidden, expert_inter, layers, heads, kv_heads, vocab, 262144, 500000.0, 1e-5, false);
  AsArchitecture(c, "Llama4ForCausalLM", "llama4_text");
  c["attention_bias"] = false;
  c["attention_chunk_size"] = chunk;
  c["attn_scale"] = 0.1;
  c["attn_temperature_tuning"] = true;
  c["floor_scale"] = 8192;
  c["head_dim"] = head_dim;
  c["interleave_moe_layer_step"] = moe_step;
  c["intermediate_size_mlp"] = inter;
  c["num_experts_per_tok"] = 1;
  c["num_local_experts"] = experts;
  c["rope_scaling"] = json{{"factor", 8.0}, {"high_freq_factor", 4.0}, {"low_freq_factor", 1.0},
                           {"original_max_position_embeddings", 8192}, {"rope_type", "llama3"}};
  c["router_aux_loss_coef"] = 0.001;
  c["use_qk_norm"] = true;
  return c;
}

void SetSpecialIds(json& c, int64_t bos, int64_t eos) {
  if (bos >= 0) c["bos_token_id"] = bos;
  if (eos >= 0) c["eos_token_id"] = eos;
}

// Half-range and centre of a tensor's uniform distribution (see the header).
void InitRange(const TensorSpec& spec, int64_t hidden, double* half_range, float* centre) {
  const std::string& n = spec.name;
  auto ends_with = [&n](std::string_view s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
  *centre = 0.0f;
  if (n == "model.embed_tokens.weight" || n == "lm_head.weight") {
    *half_range = 2.0 * std::sqrt(3.0 / static_cast<double>(hidden));
  } else if (ends_with("norm.weight")) {
    *half_range = 0.25;
    *centre = 1.0f;
  } else if (ends_with(".bias")) {
    *half_range = 0.5;
  } else if (spec.shape.size() == 3) {  // Llama 4's fused experts [E][in][out], used as x·W
    *half_range = std::sqrt(3.0 / static_cast<double>(spec.shape[1]));
  } else {
    *half_range = std::sqrt(3.0 / static_cast<double>(spec.shape.back()));
  }
}

// Writes one safetensors file from a list of tensors, streaming their contents.
class ShardWriter {
 public:
  static Result<std::unique_ptr<ShardWriter>> Create(const std::string& path, const std::vector<const TensorSpec*>& specs,
                                                     DType dtype) {
    json header = json::object();
    header["__metadata__"] = json{{"format", "pt"}};
    uint64_t offset = 0;
    for (const TensorSpec* s : specs) {
      uint64_t n = 1;
      for (int64_t d : s->shape) n *= static_cast<uint64_t>(d);
      uint64_t bytes = n * DTypeSize(dtype);
      header[s->name] = json{{"dtype", DTypeName(dtype)}, {"shape", s->shape}, {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
    std::string text = header.dump();
    while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // align the data, as safetensors does
    std::unique_ptr<ShardWriter> w(new ShardWriter());
    w->path_ = path;
    w->tmp_path_ = path + ".partial";
    w->f_ = std::fopen(w->tmp_path_.c_str(), "wb");
    if (w->f_ == nullptr) return Unavailable(w->tmp_path_ + ": " + std::strerror(errno));
    uint8_t len[8];
    uint64_t hl = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hl >> (8 * i));
    KVF_RETURN_IF_ERROR(w->Write(len, 8));
    KVF_RETURN_IF_ERROR(w->Write(text.data(), text.size()));
    return w;
  }
  ~ShardWriter() {
    if (f_ != nullptr) {
      std::fclose(f_);
      std::remove(tmp_path_.c_str());
    }
  }
  Status Write(const void* data, size_t n) {
    if (std::fwrite(data, 1, n, f_) != n) return Unavailable(tmp_path_ + ": write failed: " + std::strerror(errno));
    return Status::Ok();
  }
  // Closes the file and moves it into place.
  Status Finish() {
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return Unavailable(tmp_path_ + ": close failed");
    std::error_code ec;
    fs::rename(tmp_path_, path_, ec);
    if (ec) return Unavailable(path_ + ": " + ec.message());
    return Status::Ok();
  }

 private:
  ShardWriter() = default;
  std::string path_, tmp_path_;
  std::FILE* f_ = nullptr;
};

uint64_t TensorBytes(const TensorSpec& s, DType dtype) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

std::vector<std::string> RandomModelShapes() {
  return {"tiny",         "tiny-qwen2",   "tiny-qwen3",   "tiny-mistral", "tiny-mixtral", "tiny-qwen3-moe",
          "smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b",   "llama-3.2-1b", "llama-3.1-8b", "qwen3-8b",
          "mistral-7b",   "qwen3-32b",    "qwen3-30b-a3b", "mixtral-8x7b", "tiny-llama4", "llama-4-scout-4e"};
}

Result<json> RandomModelConfig(const std::string& shape, int64_t vocab, int64_t bos, int64_t eos) {
  json c;
  if (shape == "tiny") {
    c = LlamaBase(64, 192, 2, 4, 2, vocab, 131072, 500000.0, 1e-5, true);
    c["head_dim"] = 16;
    c["rope_scaling"] = Llama3Scaling(32.0);
    SetSpecialIds(c, bos, eos);
  } else if (shape == "tiny-qwen2") {
    c = LlamaBase(64, 192, 2, 4, 2, vocab, 32768, 1000000.0, 1e-6, true);
    AsArchitecture(c, "Qwen2ForCausalLM", "qwen2");
    c["use_sliding_window"] = false;
    c["sliding_window"] = 32768;
    c["max_window_layers"] = 2;
    SetSpecialIds(c, bos, eos);
  } else if (shape == "tiny-qwen3") {
    // head_dim 64 is not hidden/heads (16), so q and o are wider than the hidden state; YaRN
    // x4 from 32768 (as Qwen3's model card extends it) scales the attention scores too.
    c = Qwen3Base(64, 192, 2, 4, 2, 64, vocab, true);
    c["max_position_embeddings"] = 131072;
    c["rope_scaling"] = json{{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
    SetSpecialIds(c, bos, eos);
  } else if (shape == "tiny-mistral") {
    c = LlamaBase(64, 192, 2, 4, 1, vocab, 32768, 10000.0, 1e-5, false);
    AsArchitecture(c, "MistralForCausalLM", "mistral");
    c["head_dim"] = 16;
    c["sliding_window"] = 20;
    SetSpecialIds(c, bos, eos);
  } else if (shape == "tiny-mixtral") {
    // 4 experts of 96, top-2 renormalised, on both layers.
    c = MixtralBase(64, 96, 2, 4, 2, vocab, 4, 2);
    c["head_dim"] = 16;
    SetSpecialIds(c, bos, eos);
  } else if (shape == "tiny-qwen3-moe") {
    // 8 experts of 48, top-2 without renormalisation (Mixtral's fixture covers it); layer 1 is
    // dense (mlp_only_layers), between two MoE layers. head_dim 32 is not hidden/heads (16).
    c = Qwen3MoeBase(64, 192, 3, 4, 2, 32, vocab, true, 8, 2, 48);
    c["norm_topk_prob"] = false;
    c["mlp_only_layers"] = {1};
    SetSpecialIds(c, bos, eos);
  } else if (shape == "tiny-llama4") {
    // 4 layers: MoE on 1 and 3 (4 experts of 32, top-1, a shared expert), dense MLPs of 128 on
    // 0 and 2; layer 3 NoPE; 16-token chunks on the RoPE layers; temperature tuning from
    // position 7 (floor_scale 8) so short prompts see it.
    c = Llama4TextBase(64, 128, 32, 4, 4, 2, 16, vocab, 4, 2, 16);
    c["floor_scale"] = 8;
    SetSpecialIds(c, bos, eos);
  } else if (shape == "smollm2-135m") {  // HuggingFaceTB/SmolLM2-135M
    c = LlamaBase(576, 1536, 30, 9, 3, 49152, 8192, 100000.0, 1e-5, true);
    c["head_dim"] = 64;
    SetSpecialIds(c, 0, 0);
  } else if (shape == "qwen2.5-0.5b") {  // Qwen/Qwen2.5-0.5B
    c = LlamaBase(896, 4864, 24, 14, 2, 151936, 32768, 1000000.0, 1e-6, true);
    AsArchitecture(c, "Qwen2ForCausalLM", "qwen2");
    c["use_sliding_window"] = false;
    c["sliding_window"] = 32768;
    c["max_window_layers"] = 24;
    SetSpecialIds(c, 151643, 151643);
  } else if (shape == "qwen3-0.6b") {  // Qwen/Qwen3-0.6B
    c = Qwen3Base(1024, 3072, 28, 16, 8, 128, 151936, true);
    SetSpecialIds(c, 151643, 151645);
  } else if (shape == "qwen3-8b") {  // Qwen/Qwen3-8B
    c = Qwen3Base(4096, 12288, 36, 32, 8, 128, 151936, false);
    SetSpecialIds(c, 151643, 151645);
  } else if (shape == "qwen3-32b") {  // Qwen/Qwen3-32B
    c = Qwen3Base(5120, 25600, 64, 64, 8, 128, 151936, false);
    SetSpecialIds(c, 151643, 151645);
  } else if (shape == "qwen3-30b-a3b") {  // Qwen/Qwen3-30B-A3B
    c = Qwen3MoeBase(2048, 6144, 48, 32, 4, 128, 151936, false, 128, 8, 768);
    SetSpecialIds(c, 151643, 151645);
  } else if (shape == "llama-3.2-1b") {  // meta-llama/Llama-3.2-1B
    c = LlamaBase(2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, 1e-5, true);
    c["head_dim"] = 64;
    c["rope_scaling"] = Llama3Scaling(32.0);
    SetSpecialIds(c, 128000, 128001);
  } else if (shape == "llama-3.1-8b") {  // meta-llama/Llama-3.1-8B
    c = LlamaBase(4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, 1e-5, false);
    c["rope_scaling"] = Llama3Scaling(8.0);
    SetSpecialIds(c, 128000, 128001);
  } else if (shape == "mistral-7b") {  // mistralai/Mistral-7B-v0.1
    c = LlamaBase(4096, 14336, 32, 32, 8, 32000, 32768, 10000.0, 1e-5, false);
    AsArchitecture(c, "MistralForCausalLM", "mistral");
    c["sliding_window"] = 4096;
    SetSpecialIds(c, 1, 2);
  } else if (shape == "llama-4-scout-4e") {
    // meta-llama/Llama-4-Scout-17B-16E's text model with 4 of its 16 experts, so that it fits
    // one GPU (35 B parameters, 70 GB in bf16): 48 layers, every one MoE (top-1 sigmoid, a
    // shared expert of 8192), every 4th NoPE (the default no_rope_layers), 8192-token attention
    // chunks on the RoPE layers, the L2 q/k norm, temperature tuning.
    c = Llama4TextBase(5120, 16384, 8192, 48, 40, 8, 128, 202048, 4, 1, 8192);
    SetSpecialIds(c, 200000, 200008);
  } else if (shape == "mixtral-8x7b") {  // mistralai/Mixtral-8x7B-v0.1
    c = MixtralBase(4096, 14336, 32, 32, 8, 32000, 8, 2);
    SetSpecialIds(c, 1, 2);
  } else {
    std::string names;
    for (const auto& s : RandomModelShapes()) names += (names.empty() ? "" : ", ") + s;
    return InvalidArgument("unknown shape '" + shape + "' (one of: " + names + ")");
  }
  return c;
}

uint64_t RandomTensorKey(uint64_t seed, const std::string& name) { return SplitMix64(seed ^ Fnv1a64(name)); }

float RandomWeight(uint64_t tensor_key, uint64_t index, float step, float centre) {
  int32_t r = static_cast<int32_t>(SplitMix64(tensor_key + index) >> 40) - (1 << 23);
  float v = (static_cast<float>(r) + 0.5f) * step;
  return v + centre;
}

Status MakeRandomModel(const RandomModelOptions& o) {
  if (o.dtype != DType::kBF16 && o.dtype != DType::kF32) return InvalidArgument("make-model: dtype must be bf16 or fp32");
  KVF_ASSIGN_OR_RETURN(TokenizerInfo tok, ReadTokenizerInfo(o.tokenizer_dir));
  json cfg_json;
  if (o.config) {
    cfg_json = *o.config;
  } else {
    KVF_ASSIGN_OR_RETURN(cfg_json, RandomModelConfig(o.shape, tok.vocab_size, tok.bos, tok.eos));
  }
  cfg_json["torch_dtype"] = o.dtype == DType::kBF16 ? "bfloat16" : "float32";
  const std::string cfg_text = cfg_json.dump(2) + "\n";
  KVF_ASSIGN_OR_RETURN(ModelConfig cfg, ParseModelConfig(cfg_text));
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Unavailable(o.out_dir + ": " + ec.message());

  // Tokenizer files first: the model directory is complete only when the weights land.
  for (const auto& entry : fs::directory_iterator(o.tokenizer_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !IsTokenizerFile(name)) continue;
    fs::copy_file(entry.path(), fs::path(o.out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return Unavailable(name + ": " + ec.message());
  }
  if (ec) return Unavailable(o.tokenizer_dir + ": " + ec.message());
  {
    std::ofstream out(o.out_dir + "/config.json", std::ios::binary);
    out << cfg_text;
    if (!out) return Unavailable(o.out_dir + "/config.json: write failed");
  }

  if (o.config_only) return Status::Ok();

  // Plan the shards: consecutive tensors until the next would pass max_shard_bytes.
  std::vector<TensorSpec> specs = ExpectedTensors(cfg);
  // Llama4ForConditionalGeneration: the text model's tensors under language_model. (no
  // vision tower is written; kvfleet reads none).
  for (TensorSpec& s : specs) s.name = cfg.tensor_prefix + s.name;
  std::vector<std::vector<const TensorSpec*>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorSpec& s : specs) {
    uint64_t b = TensorBytes(s, o.dtype);
    if (!shards.back().empty() && shard_bytes + b > o.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&s);
    shard_bytes += b;
    total_bytes += b;
  }
  // Remove the other layout's files so the directory holds exactly one.
  fs::remove(fs::path(o.out_dir) / (shards.size() == 1 ? "model.safetensors.index.json" : "model.safetensors"), ec);

  const size_t threads = o.threads > 0 ? static_cast<size_t>(o.threads)
                                       : std::max<size_t>(1, std::thread::hardware_concurrency());
  std::vector<std::vector<float>> f32(threads, std::vector<float>(kChunkElements));
  std::vector<std::vector<uint16_t>> b16(threads, std::vector<uint16_t>(kChunkElements));
  json weight_map = json::object();
  size_t tensors_done = 0;
  uint64_t bytes_done = 0;
  for (size_t si = 0; si < shards.size(); ++si) {
    char name[64];
    if (shards.size() == 1) {
      std::snprintf(name, sizeof(name), "model.safetensors");
    } else {
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", si + 1, shards.size());
    }
    KVF_ASSIGN_OR_RETURN(auto writer, ShardWriter::Create(o.out_dir + "/" + name, shards[si], o.dtype));
    for (const TensorSpec* s : shards[si]) {
      double half_range;
      float centre;
      TensorSpec unprefixed = *s;
      unprefixed.name = s->name.substr(cfg.tensor_prefix.size());
      InitRange(unprefixed, cfg.hidden_size, &half_range, &centre);
      const float step = static_cast<float>(half_range / 8388608.0);
      const uint64_t key = RandomTensorKey(o.seed, s->name);
      uint64_t n = 1;
      for (int64_t d : s->shape) n *= static_cast<uint64_t>(d);
      // Chunks are generated `threads` at a time, then written in order.
      for (uint64_t group = 0; group < n; group += threads * kChunkElements) {
        auto fill = [&](size_t t) {
          const uint64_t begin = group + t * kChunkElements;
          const size_t m = begin < n ? static_cast<size_t>(std::min<uint64_t>(kChunkElements, n - begin)) : 0;
          for (size_t i = 0; i < m; ++i) f32[t][i] = RandomWeight(key, begin + i, step, centre);
          if (o.dtype == DType::kBF16) {
            for (size_t i = 0; i < m; ++i) b16[t][i] = F32ToBF16(f32[t][i]);
          }
          return m;
        };
        std::vector<std::thread> helpers;
        std::vector<size_t> sizes(threads);
        for (size_t t = 1; t < threads && group + t * kChunkElements < n; ++t) {
          helpers.emplace_back([&, t] { sizes[t] = fill(t); });
        }
        sizes[0] = fill(0);
        for (std::thread& h : helpers) h.join();
        for (size_t t = 0; t < threads && sizes[t] > 0; ++t) {
          if (o.dtype == DType::kBF16) {
            KVF_RETURN_IF_ERROR(writer->Write(b16[t].data(), sizes[t] * 2));  // x86-64: little-endian as stored
          } else {
            KVF_RETURN_IF_ERROR(writer->Write(f32[t].data(), sizes[t] * 4));
          }
        }
      }
      weight_map[s->name] = name;
      ++tensors_done;
      bytes_done += TensorBytes(*s, o.dtype);
      if (o.progress) o.progress(tensors_done, specs.size(), bytes_done, total_bytes);
    }
    KVF_RETURN_IF_ERROR(writer->Finish());
  }
  if (shards.size() > 1) {
    json index{{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    std::ofstream out(o.out_dir + "/model.safetensors.index.json", std::ios::binary);
    out << index.dump(2) << "\n";
    if (!out) return Unavailable(o.out_dir + "/model.safetensors.index.json: write failed");
  }
  return Status::Ok();
}

}  // namespace kvfleet::model
