#include "worker/model/llama4_config.h"

#include <string>

#include "worker/model/config_fields.h"

namespace kvfleet::model {
namespace {

using config_fields::FieldError;
using config_fields::GetBool;
using config_fields::GetInt;
using config_fields::GetNumber;
using config_fields::LayerSet;
using nlohmann::json;

Status ParseMoe(const json& j, ModelConfig* c) {
  MoeConfig& m = c->moe;
  const int64_t L = c->num_layers;
  m.expert_intermediate = c->intermediate_size;  // the experts' and the shared expert's
  m.shared_expert_intermediate = c->intermediate_size;
  m.sigmoid_routing = true;
  m.norm_topk_prob = false;
  KVF_ASSIGN_OR_RETURN(c->intermediate_size, GetInt(j, "intermediate_size_mlp", 16384));
  if (c->intermediate_size <= 0) return FieldError("intermediate_size_mlp", "must be > 0");
  KVF_ASSIGN_OR_RETURN(m.num_experts, GetInt(j, "num_local_experts", 16));
  KVF_ASSIGN_OR_RETURN(m.experts_per_token, GetInt(j, "num_experts_per_tok", 1));
  if (m.num_experts <= 0) return FieldError("num_local_experts", "must be > 0");
  if (m.experts_per_token <= 0 || m.experts_per_token > m.num_experts) {
    return FieldError("num_experts_per_tok", "must be in 1.." + std::to_string(m.num_experts) + ", got " +
                                                 std::to_string(m.experts_per_token));
  }
  if (auto ml = j.find("moe_layers"); ml != j.end() && !ml->is_null()) {
    KVF_ASSIGN_OR_RETURN(m.layer_sparse, LayerSet(*ml, "moe_layers", L));
  } else {
    KVF_ASSIGN_OR_RETURN(int64_t step, GetInt(j, "interleave_moe_layer_step", 1));
    if (step <= 0) return FieldError("interleave_moe_layer_step", "must be > 0");
    m.layer_sparse.assign(static_cast<size_t>(L), false);
    for (int64_t l = step - 1; l < L; l += step) m.layer_sparse[static_cast<size_t>(l)] = true;
  }
  return Status::Ok();
}

// no_rope_layers (1: RoPE, 0: NoPE), then layer_types over attention_chunk_size.
Status ParseLayers(const json& j, ModelConfig* c) {
  const int64_t L = c->num_layers;
  c->layer_nope.assign(static_cast<size_t>(L), false);
  auto nr = j.find("no_rope_layers");
  if (nr != j.end() && !nr->is_null() && !(nr->is_array() && nr->empty())) {  // HF: an empty list is the default
    if (!nr->is_array() || static_cast<int64_t>(nr->size()) < L) {
      return FieldError("no_rope_layers", "must be a list of at least num_hidden_layers 0/1 entries");
    }
    for (int64_t l = 0; l < L; ++l) {
      const json& v = (*nr)[static_cast<size_t>(l)];
      if (!v.is_number_integer() || (v.get<int64_t>() != 0 && v.get<int64_t>() != 1)) {
        return FieldError("no_rope_layers[" + std::to_string(l) + "]", "not 0 or 1: " + v.dump());
      }
      c->layer_nope[static_cast<size_t>(l)] = v.get<int64_t>() == 0;
    }
  } else {
    KVF_ASSIGN_OR_RETURN(int64_t interval, GetInt(j, "no_rope_layer_interval", 4));
    if (interval <= 0) return FieldError("no_rope_layer_interval", "must be > 0");
    for (int64_t l = 0; l < L; ++l) c->layer_nope[static_cast<size_t>(l)] = (l + 1) % interval == 0;
  }
  c->layer_chunked.assign(static_cast<size_t>(L), false);
  auto lt = j.find("layer_types");
  for (int64_t l = 0; l < L; ++l) {
    bool chunked = !c->layer_nope[static_cast<size_t>(l)];
    if (lt != j.end() && !lt->is_null()) {
      if (!lt->is_array() || static_cast<int64_t>(lt->size()) != L) {
        return FieldError("layer_types", "must have num_hidden_layers entries");
      }
      const json& t = (*lt)[static_cast<size_t>(l)];
      if (t != "chunked_attention" && t != "full_attention") {
        return FieldError("layer_types[" + std::to_string(l) + "]", "unsupported: " + t.dump() +
                                                                        " (chunked_attention or full_attention)");
      }
      chunked = t == "chunked_attention";
    }
    c->layer_chunked[static_cast<size_t>(l)] = chunked;
  }
  // Llama4TextConfig's default is 8192; null turns chunking off.
  auto cs = j.find("attention_chunk_size");
  if (cs == j.end()) {
    c->attention_chunk_size = 8192;
  } else if (cs->is_null()) {
    c->attention_chunk_size = 0;
  }
  return Status::Ok();
}

}  // namespace

Status ParseLlama4Fields(const json& j, ModelConfig* c) {
  KVF_RETURN_IF_ERROR(ParseMoe(j, c));
  KVF_RETURN_IF_ERROR(ParseLayers(j, c));
  KVF_ASSIGN_OR_RETURN(bool bias, GetBool(j, "attention_bias", false));
  c->attention_bias = c->attention_out_bias = bias;
  c->rope_interleaved = true;
  KVF_ASSIGN_OR_RETURN(c->qk_l2_norm, GetBool(j, "use_qk_norm", true));
  // Meta's configs write a number (Scout: 4); transformers tests its truth.
  if (auto t = j.find("attn_temperature_tuning"); t != j.end() && t->is_number_integer()) {
    c->attn_temperature_tuning = t->get<int64_t>() != 0;
  } else {
    KVF_ASSIGN_OR_RETURN(c->attn_temperature_tuning, GetBool(j, "attn_temperature_tuning", true));
  }
  KVF_ASSIGN_OR_RETURN(c->floor_scale, GetNumber(j, "floor_scale", 8192));
  KVF_ASSIGN_OR_RETURN(c->attn_scale, GetNumber(j, "attn_scale", 0.1));
  if (!(c->floor_scale > 0)) return FieldError("floor_scale", "must be > 0");
  const bool theta_given = j.contains("rope_theta") ||
                           (j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
                            j["rope_parameters"].contains("rope_theta"));
  if (!theta_given) c->rope_theta = 500000.0;  // Llama4TextConfig's default_theta
  return Status::Ok();
}

}  // namespace kvfleet::model
