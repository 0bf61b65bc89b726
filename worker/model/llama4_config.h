// Llama 4's text model (transformers' Llama4TextConfig / modeling_llama4.py; Meta's
// Llama-4-Scout-17B-16E and Maverick-17B-128E), what it adds to ModelConfig:
//   1. MoE: num_local_experts experts of intermediate_size, top num_experts_per_tok (1), on
//      the layers `moe_layers` lists, else every interleave_moe_layer_step-th one (l =
//      step - 1, 2·step - 1, ...). Router scores are sigmoid(logit) of the top k; each expert
//      sees its token scaled by its score, and a shared expert (a SwiGLU MLP of
//      intermediate_size) adds to every token. Dense layers' MLPs have intermediate_size_mlp.
//      Experts are fused 3-D tensors: experts.gate_up_proj [E][hidden][2·inter] (gate
//      columns, then up) and experts.down_proj [E][inter][hidden], used as x·W (not x·Wᵀ).
//   2. NoPE layers: no_rope_layers[l] == 0 (default: every no_rope_layer_interval-th layer,
//      l = 3, 7, ...) skips RoPE; RoPE layers rotate interleaved pairs (2i, 2i + 1).
//   3. use_qk_norm: RoPE layers RMS-normalise each q and k head (no weight, rms_norm_eps)
//      after the rotation.
//   4. attn_temperature_tuning: NoPE layers multiply q at position p by
//      1 + attn_scale · log(1 + floor((p + 1) / floor_scale)).
//   5. Chunked attention: `layer_types` "chunked_attention" layers (default: the RoPE layers)
//      see only their query's chunk of attention_chunk_size (default 8192) positions; the
//      "full_attention" ones (the NoPE layers) see every earlier position.
//   6. Softmax scale head_dim^-0.5; no biases unless attention_bias.
//
// Thread safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/model/model_config.h"

namespace kvfleet::model {

// Fills c's Llama 4 fields from the text config `j`. REQUIRES: c's generic fields
// (num_layers, intermediate_size as config.json's intermediate_size, ...) are parsed.
// Errors name the field.
Status ParseLlama4Fields(const nlohmann::json& j, ModelConfig* c);

}  // namespace kvfleet::model
