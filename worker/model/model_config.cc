#include "worker/model/model_config.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/tokenizer_files.h"
#include "worker/model/config_fields.h"
#include "worker/model/llama4_config.h"

namespace kvfleet::model {
namespace {

using nlohmann::json;

using config_fields::FieldError;
using config_fields::GetBool;
using config_fields::GetInt;
using config_fields::GetNumber;
using config_fields::LayerSet;

// The number at r[key]: `fallback` when absent or null; errors name `prefix.key`.
Result<double> GetNumberIn(const json& r, const std::string& prefix, const char* key, std::optional<double> fallback) {
  auto it = r.find(key);
  if (it == r.end() || it->is_null()) {
    if (fallback) return *fallback;
    return FieldError(prefix + "." + key, "missing");
  }
  if (!it->is_number()) return FieldError(prefix + "." + key, "not a number: " + it->dump());
  return it->get<double>();
}

// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5, which also holds
// rope_theta), with transformers 5's defaults (kernels/rope.h has the math).
Result<RopeScaling> ParseRopeScaling(const json& j, int64_t max_position_embeddings) {
  RopeScaling rs;
  std::string field = "rope_scaling";
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    field = "rope_parameters";
    it = j.find(field);
  }
  if (it == j.end() || it->is_null()) return rs;
  if (!it->is_object()) return FieldError(field, "not an object");
  const json& r = *it;
  std::string type;
  if (r.contains("rope_type") && r["rope_type"].is_string()) {
    type = r["rope_type"].get<std::string>();
  } else if (r.contains("type") && r["type"].is_string()) {
    type = r["type"].get<std::string>();
  } else {
    return FieldError(field + ".rope_type", "missing");
  }
  using Type = RopeScaling::Type;
  if (type == "default") return rs;
  if (type == "linear") {
    rs.type = Type::kLinear;
  } else if (type == "llama3") {
    rs.type = Type::kLlama3;
  } else if (type == "yarn") {
    rs.type = Type::kYarn;
  } else if (type == "dynamic") {
    rs.type = Type::kDynamic;
  } else {
    return Unimplemented("config.json: " + field + ".rope_type: unsupported " + type +
                         " (supported: default, linear, llama3, yarn, dynamic)");
  }
  // llama3 and yarn: the pre-extension length. A top-level original_max_position_embeddings
  // wins (Phi-3 style, as transformers 5 standardizes it), then the one in the dict.
  std::optional<int64_t> original;
  for (const json* where : {&j, &r}) {
    auto o = where->find("original_max_position_embeddings");
    if (original || (rs.type != Type::kLlama3 && rs.type != Type::kYarn) || o == where->end() || o->is_null()) {
      continue;
    }
    if (!o->is_number_integer() || o->get<int64_t>() <= 0) {
      const std::string name = (where == &j ? "" : field + ".") + "original_max_position_embeddings";
      return FieldError(name, "not a positive integer: " + o->dump());
    }
    original = o->get<int64_t>();
  }
  std::optional<double> no_default;
  if (rs.type == Type::kYarn && original && !(r.contains("factor") && !r["factor"].is_null())) {
    // transformers 5: a yarn without factor extends original to max_position_embeddings.
    rs.factor = static_cast<double>(max_position_embeddings) / static_cast<double>(*original);
  } else {
    KVF_ASSIGN_OR_RETURN(rs.factor, GetNumberIn(r, field, "factor", no_default));
  }
  if (!(rs.factor >= 1.0)) return FieldError(field + ".factor", "must be >= 1");
  if (rs.type == Type::kLlama3) {
    KVF_ASSIGN_OR_RETURN(rs.low_freq_factor, GetNumberIn(r, field, "low_freq_factor", 1.0));
    KVF_ASSIGN_OR_RETURN(rs.high_freq_factor, GetNumberIn(r, field, "high_freq_factor", 4.0));
    if (!original) return FieldError(field + ".original_max_position_embeddings", "missing");
    rs.original_max_position_embeddings = *original;
    if (!(rs.high_freq_factor >= rs.low_freq_factor) || !(rs.low_freq_factor > 0)) {
      return FieldError(field + ".high_freq_factor", "must be at least low_freq_factor, and both be > 0");
    }
  } else if (rs.type == Type::kYarn) {
    rs.original_max_position_embeddings = original.value_or(max_position_embeddings);
    // HF reads `beta_fast or 32`: null and 0 mean the default.
    KVF_ASSIGN_OR_RETURN(rs.beta_fast, GetNumberIn(r, field, "beta_fast", 0.0));
    KVF_ASSIGN_OR_RETURN(rs.beta_slow, GetNumberIn(r, field, "beta_slow", 0.0));
    if (rs.beta_fast == 0) rs.beta_fast = 32.0;
    if (rs.beta_slow == 0) rs.beta_slow = 1.0;
    if (!(rs.beta_fast > 0) || !(rs.beta_slow > 0)) {
      return FieldError(field + ".beta_fast", "beta_fast and beta_slow must be > 0");
    }
    if (r.contains("attention_factor") && !r["attention_factor"].is_null()) {
      KVF_ASSIGN_OR_RETURN(double af, GetNumberIn(r, field, "attention_factor", no_default));
      if (!(af > 0)) return FieldError(field + ".attention_factor", "must be > 0");
      rs.attention_factor = af;
    }
    KVF_ASSIGN_OR_RETURN(rs.mscale, GetNumberIn(r, field, "mscale", 0.0));
    KVF_ASSIGN_OR_RETURN(rs.mscale_all_dim, GetNumberIn(r, field, "mscale_all_dim", 0.0));
    if (!(rs.mscale >= 0) || !(rs.mscale_all_dim >= 0)) return FieldError(field + ".mscale", "must be >= 0");
    auto t = r.find("truncate");
    if (t != r.end() && !t->is_null()) {
      if (!t->is_boolean()) return FieldError(field + ".truncate", "not a boolean: " + t->dump());
      rs.truncate = t->get<bool>();
    }
  }
  return rs;
}

// partial_rotary_factor (top level, or in rope_parameters): only 1, every dim rotated.
Status CheckPartialRotary(const json& j) {
  for (const char* where : {"", "rope_parameters", "rope_scaling"}) {
    const json* o = &j;
    if (*where != 0) {
      auto it = j.find(where);
      if (it == j.end() || !it->is_object()) continue;
      o = &*it;
    }
    auto p = o->find("partial_rotary_factor");
    if (p == o->end() || p->is_null()) continue;
    const std::string name = std::string(where) + (*where != 0 ? "." : "") + "partial_rotary_factor";
    if (!p->is_number()) return FieldError(name, "not a number: " + p->dump());
    if (p->get<double>() != 1.0) {
      return Unimplemented("config.json: " + name + ": unsupported " + p->dump() + " (only 1: every dim rotated)");
    }
  }
  return Status::Ok();
}

// Fills layer_window from the architecture's sliding-window fields.
Status ParseWindows(const json& j, ModelConfig* c) {
  c->layer_window.assign(c->num_layers, 0);
  auto sw = j.find("sliding_window");
  // A per-layer list: sliding_window: [w0, w1, ...] (0 or null = full attention).
  if (sw != j.end() && sw->is_array()) {
    if (static_cast<int64_t>(sw->size()) != c->num_layers) {
      return FieldError("sliding_window", "a list must have num_hidden_layers entries");
    }
    for (int64_t i = 0; i < c->num_layers; ++i) {
      const json& w = (*sw)[i];
      if (w.is_null()) continue;
      if (!w.is_number_integer() || w.get<int64_t>() < 0) {
        return FieldError("sliding_window[" + std::to_string(i) + "]", "not a window size");
      }
      c->layer_window[i] = w.get<int64_t>();
    }
    return Status::Ok();
  }
  int64_t window = 0;
  if (sw != j.end() && !sw->is_null()) {
    if (!sw->is_number_integer() || sw->get<int64_t>() <= 0) {
      return FieldError("sliding_window", "not a positive integer: " + sw->dump());
    }
    window = sw->get<int64_t>();
  }
  // layer_types (newer transformers): "sliding_attention" layers use sliding_window.
  auto lt = j.find("layer_types");
  if (lt != j.end() && lt->is_array()) {
    if (static_cast<int64_t>(lt->size()) != c->num_layers) {
      return FieldError("layer_types", "must have num_hidden_layers entries");
    }
    for (int64_t i = 0; i < c->num_layers; ++i) {
      std::string t = (*lt)[i].is_string() ? (*lt)[i].get<std::string>() : "";
      if (t == "sliding_attention") {
        if (window == 0) return FieldError("sliding_window", "missing for a sliding_attention layer");
        c->layer_window[i] = window;
      } else if (t != "full_attention") {
        return FieldError("layer_types[" + std::to_string(i) + "]", "unsupported: " + (*lt)[i].dump());
      }
    }
    return Status::Ok();
  }
  if (window == 0) return Status::Ok();
  if (c->architecture == Architecture::kMistral || c->architecture == Architecture::kMixtral) {
    c->layer_window.assign(c->num_layers, window);
  } else if (c->architecture == Architecture::kQwen3Moe) {
    // Qwen3-MoE: use_sliding_window puts the window on every layer (max_window_layers unread).
    KVF_ASSIGN_OR_RETURN(bool use, GetBool(j, "use_sliding_window", false));
    if (use) c->layer_window.assign(c->num_layers, window);
  } else if (c->architecture == Architecture::kQwen2 || c->architecture == Architecture::kQwen3) {
    // Qwen2/3: the window applies only with use_sliding_window, to layers >= max_window_layers.
    KVF_ASSIGN_OR_RETURN(bool use, GetBool(j, "use_sliding_window", false));
    if (!use) return Status::Ok();
    KVF_ASSIGN_OR_RETURN(int64_t max_window_layers, GetInt(j, "max_window_layers", c->num_layers));
    for (int64_t i = max_window_layers; i < c->num_layers; ++i) c->layer_window[i] = window;
  }
  // Llama has no sliding window; a stray sliding_window field there is ignored as HF does.
  return Status::Ok();
}

// Fields no supported model can honour, whatever its architecture; `multimodal`: the
// sub-configs are the caller's to read (Llama4ForConditionalGeneration).
Status CheckUnsupportedFields(const json& j, bool multimodal) {
  if (auto q = j.find("quantization_config"); q != j.end() && !q->is_null()) {
    return Unimplemented("config.json: quantization_config: quantized weights are not supported (bf16, fp16 or "
                         "fp32 checkpoints only)");
  }
  if (multimodal) return Status::Ok();
  for (const char* field : {"vision_config", "audio_config", "text_config"}) {
    if (auto v = j.find(field); v != j.end() && !v->is_null()) {
      return Unimplemented("config.json: " + std::string(field) +
                           ": multimodal configs are not supported (a text-only *ForCausalLM config.json only)");
    }
  }
  return Status::Ok();
}

// Router fields of other MoE families (DeepSeek's grouped or sigmoid routing, Qwen2-MoE's
// shared expert): transformers' Mixtral and Qwen3-MoE classes do not read them, so a config
// carrying one was made for another model.
Status CheckRouterFields(const json& j) {
  auto present = [&](const char* f) {
    auto it = j.find(f);
    return it != j.end() && !it->is_null();
  };
  if (present("scoring_func") && (*j.find("scoring_func")) != "softmax") {
    return Unimplemented("config.json: scoring_func: unsupported " + j["scoring_func"].dump() + " (only softmax)");
  }
  if (present("topk_method") && (*j.find("topk_method")) != "greedy") {
    return Unimplemented("config.json: topk_method: unsupported " + j["topk_method"].dump() + " (only greedy top-k)");
  }
  // Shared experts: 0 only. Expert groups: 0 or 1 (one group is plain top-k).
  for (auto [f, max_neutral] : {std::pair{"n_shared_experts", 0}, {"shared_expert_intermediate_size", 0},
                                {"n_group", 1}, {"topk_group", 1}}) {
    if (!present(f)) continue;
    const json& v = j[f];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > max_neutral) {
      return Unimplemented("config.json: " + std::string(f) + ": unsupported " + v.dump() +
                           " (no shared experts, no grouped routing: Mixtral and Qwen3-MoE route over all experts)");
    }
  }
  if (present("routed_scaling_factor")) {
    const json& v = j["routed_scaling_factor"];
    if (!v.is_number() || v.get<double>() != 1.0) {
      return Unimplemented("config.json: routed_scaling_factor: unsupported " + v.dump() + " (only 1)");
    }
  }
  return Status::Ok();
}

// The MoE fields of Mixtral and Qwen3-MoE, with transformers' defaults for absent ones.
Status ParseMoe(const json& j, ModelConfig* c) {
  KVF_RETURN_IF_ERROR(CheckRouterFields(j));
  MoeConfig& m = c->moe;
  const bool mixtral = c->architecture == Architecture::kMixtral;
  const char* experts_field = mixtral ? "num_local_experts" : "num_experts";
  KVF_ASSIGN_OR_RETURN(m.num_experts, GetInt(j, experts_field, mixtral ? 8 : 128));
  KVF_ASSIGN_OR_RETURN(m.experts_per_token, GetInt(j, "num_experts_per_tok", mixtral ? 2 : 8));
  if (m.num_experts < 0 || (mixtral && m.num_experts == 0)) return FieldError(experts_field, "must be > 0");
  m.layer_sparse.assign(static_cast<size_t>(c->num_layers), m.num_experts > 0);
  if (mixtral) {
    m.expert_intermediate = c->intermediate_size;
    m.norm_topk_prob = true;  // MixtralTopKRouter always renormalises
  } else {
    KVF_ASSIGN_OR_RETURN(m.expert_intermediate, GetInt(j, "moe_intermediate_size", 768));
    KVF_ASSIGN_OR_RETURN(m.norm_topk_prob, GetBool(j, "norm_topk_prob", false));
    KVF_ASSIGN_OR_RETURN(int64_t step, GetInt(j, "decoder_sparse_step", 1));
    if (step <= 0) return FieldError("decoder_sparse_step", "must be > 0");
    for (int64_t l = 0; l < c->num_layers; ++l) m.layer_sparse[l] = m.layer_sparse[l] && (l + 1) % step == 0;
    if (auto only = j.find("mlp_only_layers"); only != j.end() && !only->is_null()) {
      KVF_ASSIGN_OR_RETURN(const std::vector<bool> dense, LayerSet(*only, "mlp_only_layers", c->num_layers));
      for (int64_t l = 0; l < c->num_layers; ++l) m.layer_sparse[l] = m.layer_sparse[l] && !dense[l];
    }
  }
  if (m.num_experts == 0) {  // Qwen3-MoE with no experts: every layer dense, as HF builds it
    m = MoeConfig{};
    return Status::Ok();
  }
  if (m.experts_per_token <= 0 || m.experts_per_token > m.num_experts) {
    return FieldError("num_experts_per_tok", "must be in 1.." + std::to_string(m.num_experts) + ", got " +
                                                 std::to_string(m.experts_per_token));
  }
  if (m.expert_intermediate <= 0) return FieldError(mixtral ? "intermediate_size" : "moe_intermediate_size", "must be > 0");
  return Status::Ok();
}

// eos_token_id: a number, a list of numbers, or absent/null (none).
Result<std::vector<int64_t>> ReadEosIds(const json& j, std::string_view file) {
  std::vector<int64_t> ids;
  auto e = j.find("eos_token_id");
  if (e == j.end() || e->is_null()) return ids;
  auto bad = [&](std::string_view what) {
    return InvalidArgument(std::string(file) + ": eos_token_id: " + std::string(what) + ": " + e->dump());
  };
  if (e->is_number_integer()) {
    ids.push_back(e->get<int64_t>());
  } else if (e->is_array()) {
    for (const json& x : *e) {
      if (!x.is_number_integer()) return bad("not a list of integers");
      ids.push_back(x.get<int64_t>());
    }
  } else {
    return bad("not an integer or a list");
  }
  for (int64_t id : ids) {
    if (id < 0) return bad("negative id");
  }
  return ids;
}

}  // namespace

std::string_view ArchitectureName(Architecture a) {
  switch (a) {
    case Architecture::kLlama: return "LlamaForCausalLM";
    case Architecture::kQwen2: return "Qwen2ForCausalLM";
    case Architecture::kMistral: return "MistralForCausalLM";
    case Architecture::kQwen3: return "Qwen3ForCausalLM";
    case Architecture::kMixtral: return "MixtralForCausalLM";
    case Architecture::kQwen3Moe: return "Qwen3MoeForCausalLM";
    case Architecture::kLlama4: return "Llama4ForCausalLM";
  }
  return "?";
}

bool ModelConfig::has_sliding_window() const {
  for (int64_t w : layer_window) {
    if (w > 0) return true;
  }
  return false;
}

Result<ModelConfig> ParseModelConfig(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("config.json: not valid JSON");
  if (!j.is_object()) return InvalidArgument("config.json: not a JSON object");

  ModelConfig c;
  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return FieldError("architectures", "missing");
  }
  std::string arch = (*archs)[0].get<std::string>();
  if (arch == "Llama4ForConditionalGeneration") {
    // The text model only: its text_config, its tensors under language_model.; the vision
    // tower and projector are not read.
    KVF_RETURN_IF_ERROR(CheckUnsupportedFields(j, /*multimodal=*/true));
    auto text = j.find("text_config");
    if (text == j.end() || !text->is_object()) return FieldError("text_config", "missing (Llama4ForConditionalGeneration)");
    json t = *text;
    KVF_ASSIGN_OR_RETURN(bool tie, GetBool(j, "tie_word_embeddings", false));
    t["architectures"] = json::array({"Llama4ForCausalLM"});
    t["tie_word_embeddings"] = tie;
    for (const char* f : {"eos_token_id", "bos_token_id", "torch_dtype", "dtype"}) {
      if (!t.contains(f) && j.contains(f)) t[f] = j[f];
    }
    Result<ModelConfig> inner = ParseModelConfig(t.dump());
    if (!inner.ok()) {  // "config.json: FIELD: ..." becomes "config.json: text_config.FIELD: ..."
      std::string m = inner.status().message();
      const std::string head = "config.json: ";
      if (m.rfind(head, 0) == 0) m = head + "text_config." + m.substr(head.size());
      return Status(inner.status().code(), m);
    }
    inner->tensor_prefix = "language_model.";
    return inner;
  }
  if (arch == "LlamaForCausalLM") {
    c.architecture = Architecture::kLlama;
  } else if (arch == "Qwen2ForCausalLM") {
    c.architecture = Architecture::kQwen2;
  } else if (arch == "MistralForCausalLM") {
    c.architecture = Architecture::kMistral;
  } else if (arch == "Qwen3ForCausalLM") {
    c.architecture = Architecture::kQwen3;
  } else if (arch == "MixtralForCausalLM") {
    c.architecture = Architecture::kMixtral;
  } else if (arch == "Qwen3MoeForCausalLM") {
    c.architecture = Architecture::kQwen3Moe;
  } else if (arch == "Llama4ForCausalLM") {
    c.architecture = Architecture::kLlama4;
  } else {
    return Unimplemented("config.json: architectures: unsupported architecture " + arch +
                         " (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, "
                         "MixtralForCausalLM, Qwen3MoeForCausalLM, Llama4ForCausalLM, Llama4ForConditionalGeneration)");
  }
  KVF_RETURN_IF_ERROR(CheckUnsupportedFields(j, /*multimodal=*/false));
  if (j.contains("model_type") && j["model_type"].is_string()) c.model_type = j["model_type"].get<std::string>();

  if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string()) return FieldError("hidden_act", "not a string: " + act->dump());
    if (act->get<std::string>() != "silu") {
      return Unimplemented("config.json: hidden_act: unsupported " + act->get<std::string>() + " (only silu)");
    }
  }

  KVF_ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", std::nullopt));
  KVF_ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", std::nullopt));
  KVF_ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", std::nullopt));
  KVF_ASSIGN_OR_RETURN(c.num_layers, GetInt(j, "num_hidden_layers", std::nullopt));
  KVF_ASSIGN_OR_RETURN(c.num_heads, GetInt(j, "num_attention_heads", std::nullopt));
  KVF_ASSIGN_OR_RETURN(c.num_kv_heads, GetInt(j, "num_key_value_heads", c.num_heads));
  KVF_ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", 2048));
  for (auto [name, v] : {std::pair{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                         {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_layers},
                         {"num_attention_heads", c.num_heads}, {"num_key_value_heads", c.num_kv_heads},
                         {"max_position_embeddings", c.max_position_embeddings}}) {
    if (v <= 0) return FieldError(name, "must be > 0");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return FieldError("num_key_value_heads", "must divide num_attention_heads");
  }
  if (c.hidden_size % c.num_heads != 0 && !(j.contains("head_dim") && !j["head_dim"].is_null())) {
    return FieldError("head_dim", "missing, and hidden_size is not a multiple of num_attention_heads");
  }
  KVF_ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", c.hidden_size / c.num_heads));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) return FieldError("head_dim", "must be even and > 0");

  KVF_ASSIGN_OR_RETURN(c.rms_norm_eps, GetNumber(j, "rms_norm_eps", 1e-6));
  KVF_ASSIGN_OR_RETURN(c.rope_theta, GetNumber(j, "rope_theta", 10000.0));
  if (auto rp = j.find("rope_parameters"); !j.contains("rope_theta") && rp != j.end() && rp->is_object()) {
    KVF_ASSIGN_OR_RETURN(c.rope_theta, GetNumber(*rp, "rope_theta", 10000.0));
  }
  if (!(c.rms_norm_eps > 0)) return FieldError("rms_norm_eps", "must be > 0");
  if (!(c.rope_theta > 0)) return FieldError("rope_theta", "must be > 0");
  KVF_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, c.max_position_embeddings));
  KVF_RETURN_IF_ERROR(CheckPartialRotary(j));
  KVF_ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));

  if (c.architecture == Architecture::kQwen2) {
    c.attention_bias = true;  // Qwen2Attention: q/k/v projections always carry a bias
  } else if (c.architecture == Architecture::kLlama) {
    KVF_ASSIGN_OR_RETURN(bool bias, GetBool(j, "attention_bias", false));
    c.attention_bias = c.attention_out_bias = bias;
    KVF_ASSIGN_OR_RETURN(c.mlp_bias, GetBool(j, "mlp_bias", false));
  } else if (c.architecture == Architecture::kQwen3 || c.architecture == Architecture::kQwen3Moe) {
    KVF_ASSIGN_OR_RETURN(bool bias, GetBool(j, "attention_bias", false));  // Qwen3Attention: q, k, v and o
    c.attention_bias = c.attention_out_bias = bias;
    c.qk_norm = true;
  }
  if (c.architecture == Architecture::kMixtral || c.architecture == Architecture::kQwen3Moe) {
    KVF_RETURN_IF_ERROR(ParseMoe(j, &c));
  }
  KVF_ASSIGN_OR_RETURN(c.attention_chunk_size, GetInt(j, "attention_chunk_size", 0));
  if (c.attention_chunk_size < 0) return FieldError("attention_chunk_size", "must be >= 0");
  if (c.architecture == Architecture::kLlama4) {  // no sliding window; layer_types are chunks
    c.layer_window.assign(static_cast<size_t>(c.num_layers), 0);
    KVF_RETURN_IF_ERROR(ParseLlama4Fields(j, &c));
  } else {
    KVF_RETURN_IF_ERROR(ParseWindows(j, &c));
  }

  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) {
    c.bos_token_id = j["bos_token_id"].get<int64_t>();
  }
  KVF_ASSIGN_OR_RETURN(c.eos_token_ids, ReadEosIds(j, "config.json"));
  if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
    c.torch_dtype = j["torch_dtype"].get<std::string>();
  } else if (j.contains("dtype") && j["dtype"].is_string()) {
    c.torch_dtype = j["dtype"].get<std::string>();
  }
  return c;
}

Result<std::vector<int64_t>> ParseGenerationEosIds(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("generation_config.json: not valid JSON");
  if (!j.is_object()) return InvalidArgument("generation_config.json: not a JSON object");
  return ReadEosIds(j, "generation_config.json");
}

Result<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  KVF_ASSIGN_OR_RETURN(std::string text, ReadModelFile(model_dir + "/config.json"));
  Result<ModelConfig> c = ParseModelConfig(text);
  if (!c.ok()) return c.status().WithContext(model_dir);
  // generation_config.json is optional; a present one must parse.
  const std::string generation_path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(generation_path)) return c;
  Result<std::string> generation_text = ReadModelFile(generation_path);
  if (!generation_text.ok()) return generation_text.status();
  Result<std::vector<int64_t>> extra = ParseGenerationEosIds(*generation_text);
  if (!extra.ok()) return extra.status().WithContext(model_dir);
  for (int64_t id : *extra) {
    if (std::find(c->eos_token_ids.begin(), c->eos_token_ids.end(), id) == c->eos_token_ids.end()) {
      c->eos_token_ids.push_back(id);
    }
  }
  return c;
}

}  // namespace kvfleet::model
