// ModelConfig: the architecture of a Llama-family model, read from a Hugging Face
// `config.json`.
//
// Supported `architectures`: LlamaForCausalLM (Llama 2/3/3.1/3.2, TinyLlama, SmolLM2),
// Qwen2ForCausalLM (QKV bias), Qwen3ForCausalLM (RMSNorm over each q and k head before
// RoPE, head_dim free of hidden/heads), MistralForCausalLM (sliding window), the mixtures of
// experts MixtralForCausalLM and Qwen3MoeForCausalLM (MoeConfig below), and Llama 4
// (Llama4ForCausalLM, and the text model of Llama4ForConditionalGeneration: its
// `text_config`, tensors under `language_model.`, the vision tower's ignored; llama4_config.h
// has what it adds). rope_type: default, linear, llama3, yarn, dynamic (kernels/rope.h).
// Parsing rejects anything else, and any field it cannot honour (e.g. an unknown rope_type,
// a partial_rotary_factor or a hidden_act other than silu, a quantization_config, a
// vision_config outside Llama 4, a router other than softmax-then-top-k outside Llama 4),
// with a message naming the field.
//
// Thread safety: a value; immutable once parsed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/rope.h"

namespace kvfleet::model {

enum class Architecture : uint8_t {
  kLlama,    // LlamaForCausalLM
  kQwen2,    // Qwen2ForCausalLM: bias on q_proj, k_proj, v_proj
  kMistral,  // MistralForCausalLM: optional sliding window on every layer
  kQwen3,    // Qwen3ForCausalLM: q_norm/k_norm per head; attention_bias on q, k, v and o
  kMixtral,  // MixtralForCausalLM: Mistral's attention, every layer's MLP a sparse MoE block
  kQwen3Moe, // Qwen3MoeForCausalLM: Qwen3's attention, MoE blocks on the layers MoeConfig names
  kLlama4,   // Llama4ForCausalLM / Llama4ForConditionalGeneration's text model: NoPE layers,
             // chunked attention, sigmoid-routed MoE with a shared expert (llama4_config.h)
};
std::string_view ArchitectureName(Architecture a);  // the HF class name

// rope_scaling / rope_parameters: its types and fields are kernels/rope.h's.
using RopeScaling = kernels::RopeScaling;

// A sparse mixture-of-experts MLP (Mixtral: Jiang et al. 2024, arXiv:2401.04088; Qwen3-MoE),
// as transformers computes it: router logits = x·gateᵀ (no bias), p = softmax(logits) in
// fp32 over all experts, the top k of p (ties: the lower expert id first), renormalised to
// sum to 1 when norm_topk_prob; out = Σ_k p_k · down_e(silu(gate_e·x) ⊙ up_e·x). No shared
// expert (Qwen2-MoE has one, Qwen3-MoE does not), no capacity limit: no token is dropped.
// Llama 4 (sigmoid_routing): the top k of the logits (ties: the lower id first), each scored
// sigmoid(logit); an expert's INPUT is scaled by its score, out = shared(x) + Σ_k e(s_k·x).
struct MoeConfig {
  int64_t num_experts = 0;            // Mixtral's num_local_experts, Qwen3-MoE's num_experts; 0: dense
  int64_t experts_per_token = 0;      // num_experts_per_tok: the k of top-k
  int64_t expert_intermediate = 0;    // each expert's gate/up rows: Qwen3-MoE's moe_intermediate_size,
                                      // Mixtral's intermediate_size
  bool norm_topk_prob = false;        // renormalise the top-k probabilities (Mixtral: always)
  std::vector<bool> layer_sparse;     // [num_layers]: the layer's MLP is the MoE block (Qwen3-MoE:
                                      // not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0)
  bool sigmoid_routing = false;       // Llama 4's router (above); false: softmax, then top-k
  int64_t shared_expert_intermediate = 0;  // a dense SwiGLU MLP every token passes; 0: none
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // "llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "llama4_text"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // the dense MLP's (Llama 4: intermediate_size_mlp)
  int64_t num_layers = 0;         // num_hidden_layers
  int64_t num_heads = 0;          // num_attention_heads
  int64_t num_kv_heads = 0;       // num_key_value_heads (defaults to num_heads); 1 = MQA
  int64_t head_dim = 0;           // head_dim, else hidden_size / num_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens.weight
  bool attention_bias = false;       // bias on q/k/v projections (Qwen2; Llama's attention_bias)
  bool attention_out_bias = false;   // bias on o_proj (Llama's attention_bias)
  bool mlp_bias = false;             // bias on gate/up/down (Llama's mlp_bias)
  bool qk_norm = false;              // q_norm/k_norm: RMSNorm over head_dim on each q and k
                                     // head before RoPE (Qwen3), weights [head_dim] per layer
  // Per layer attention window in tokens, 0 = full attention; size num_layers.
  // From Mistral's sliding_window, Qwen2's use_sliding_window + sliding_window +
  // max_window_layers, or a per-layer list `layer_sliding_windows` / `layer_types`.
  std::vector<int64_t> layer_window;
  // Chunked attention (Llama 4's attention_chunk_size): a query sees only keys of its own
  // chunk of this many positions; 0 = off. Read on any architecture; HF honours it only
  // for Llama 4, and there only on the layers layer_chunked names.
  int64_t attention_chunk_size = 0;
  std::vector<bool> layer_chunked;  // [num_layers], or empty: every layer (Llama 4: its RoPE layers)
  // Llama 4 (llama4_config.h). layer_nope: [num_layers] or empty; true where the layer has no
  // RoPE (no_rope_layers[l] == 0).
  std::vector<bool> layer_nope;
  bool rope_interleaved = false;       // RoPE on pairs (2i, 2i + 1) (kernels/rope.h)
  bool qk_l2_norm = false;             // use_qk_norm: q and k heads RMS-normalised, no weight,
                                       // after RoPE, on RoPE layers only
  bool attn_temperature_tuning = false;  // NoPE layers scale q at position p (arXiv 2501.19399):
  double floor_scale = 8192;             //   1 + attn_scale · log(1 + floor((p + 1) / floor_scale))
  double attn_scale = 0.1;
  // What the text model's tensor names carry before `model.` / `lm_head.` in the checkpoint:
  // "language_model." for Llama4ForConditionalGeneration (Checkpoint strips it), else "".
  std::string tensor_prefix;
  MoeConfig moe;                          // num_experts 0 for a dense model
  int64_t bos_token_id = -1;              // -1: none given
  // eos_token_id, a number or a list; LoadModelConfig adds generation_config.json's
  // (Llama 3 Instruct ends its turns with <|eot_id|>, listed only there).
  std::vector<int64_t> eos_token_ids;
  std::string torch_dtype;                // "bfloat16", "float16", "float32" or ""

  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  // The RoPE of this model, for kernels::RopeInvFreq / RopeAttentionScaling.
  kernels::RopeConfig rope() const {
    return {static_cast<int>(head_dim), rope_theta, max_position_embeddings, rope_scaling, rope_interleaved};
  }
  bool uses_rope(int64_t l) const { return layer_nope.empty() || !layer_nope[static_cast<size_t>(l)]; }
  // True when some layer has a sliding window.
  bool has_sliding_window() const;
  // True when the model has experts, and when layer l's MLP is its MoE block (else the dense
  // MLP of intermediate_size).
  bool is_moe() const { return moe.num_experts > 0; }
  bool sparse_layer(int64_t l) const { return is_moe() && moe.layer_sparse[static_cast<size_t>(l)]; }
};

// Parses the text of a config.json. Errors name the field, e.g.
// "config.json: num_attention_heads: missing".
Result<ModelConfig> ParseModelConfig(std::string_view json_text);
// The eos_token_id of a generation_config.json's text (a number or a list; none when absent).
// Errors name the file and field, e.g. "generation_config.json: eos_token_id: ...".
Result<std::vector<int64_t>> ParseGenerationEosIds(std::string_view json_text);
// Reads and parses `<dir>/config.json`, and `<dir>/generation_config.json` when present:
// eos_token_ids is the union of both files' eos ids, config.json's first.
Result<ModelConfig> LoadModelConfig(const std::string& model_dir);

}  // namespace kvfleet::model
