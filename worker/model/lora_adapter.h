// LoRA adapters in PEFT format (adapter_config.json + adapter_model.safetensors), held in
// fp32 host memory; a backend copies them into its own device slots.
//
// A targeted projection y = x·Wᵀ becomes y = x·Wᵀ + scaling · (x·Aᵀ)·Bᵀ, with A = lora_A
// [rank][in] and B = lora_B [out][rank]; scaling = lora_alpha / rank, or
// lora_alpha / sqrt(rank) with use_rslora. Targets are the seven projections of a Llama,
// Qwen2/3 or Mistral layer; ranks 1..kMaxLoraRank. Everything else PEFT can express
// (bias training, DoRA, per-module ranks or alphas, embedding or lm_head targets, layer
// subsets by pattern) is refused with an error that names it.
//
// Thread safety: values and functions without shared state.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/model_config.h"
#include "worker/model/safetensors.h"

namespace kvfleet::model {

enum class LoraTarget : int8_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kNumLoraTargets = 7;
inline constexpr int32_t kMaxLoraRank = 64;

// PEFT's module name for a target: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
const char* LoraTargetName(LoraTarget target);

// A target's input and output widths in the model: q [hidden → heads·head_dim],
// k and v [hidden → kv_heads·head_dim], o [heads·head_dim → hidden],
// gate and up [hidden → intermediate], down [intermediate → hidden].
struct LoraDims {
  int32_t in = 0;
  int32_t out = 0;
};
LoraDims LoraTargetDims(const ModelConfig& config, LoraTarget target);

// One targeted projection of one layer.
struct LoraMatrices {
  std::vector<float> a;  // [rank][in]: lora_A.weight
  std::vector<float> b;  // [out][rank]: lora_B.weight
  bool empty() const { return a.empty(); }
};

struct LoraAdapter {
  std::string name;        // the name requests select it by (their model field)
  uint64_t lora_id = 0;    // LoraId(name) (common/block_hash.h): the events' loraId
  std::string base_model;  // adapter_config.json's base_model_name_or_path, as written
  std::string path;        // the directory it was loaded from
  int32_t rank = 0;        // 1..kMaxLoraRank, the same for every target
  float scaling = 0.0f;    // lora_alpha / rank (lora_alpha / sqrt(rank) with use_rslora)
  // [layer][target]: every layer of the model; a target the adapter leaves alone is empty.
  std::vector<std::array<LoraMatrices, kNumLoraTargets>> layers;

  // True when any layer has target t.
  bool Targets(LoraTarget t) const;
  // Bytes of A and B over every layer and target, in fp32.
  uint64_t Fp32Bytes() const;
};

// Reads dir/adapter_config.json and dir/adapter_model.safetensors (fp32, bf16 or fp16
// tensors, PEFT names: base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight, …)
// and checks them against `config`: InvalidArgument names the file and the field for an
// unsupported rank, target, or option, tensor shapes that do not fit the model's layers, or
// a base model that is not `config`'s (the base_model_name_or_path's last path component
// must equal `served_model`'s or the model directory's, when the adapter names one), and for
// a tensor the config does not account for; NotFound names a missing file. "all-linear"
// targets the seven projections; PEFT's `lora_A.default.weight` spelling is read too.
Result<LoraAdapter> LoadLoraAdapter(const std::string& name, const std::string& dir, const ModelConfig& config,
                                    const std::string& served_model, const std::string& model_dir);

// Random-weight PEFT adapters for tests and benchmarks (`kvfleet make-model --lora`): A and
// B both random (PEFT initialises B to zero, which would make the adapter a no-op), with
// the same counter-based generator as random_model.h, so files are reproducible. A's
// half-range is sqrt(3/in); B's is 0.5·sqrt(3/rank)/scaling, so the adapter adds about half
// the base projection's output: greedy tokens change without being swamped.
struct RandomLoraOptions {
  int32_t rank = 16;
  float alpha = 32.0f;
  std::vector<LoraTarget> targets = {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV, LoraTarget::kO,
                                     LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};
  uint64_t seed = 1;
  std::string base_model;  // written as base_model_name_or_path
  DType dtype = DType::kF32;  // kF32 or kBF16
};
Status WriteRandomLoraAdapter(const std::string& dir, const ModelConfig& config, const RandomLoraOptions& options);

}  // namespace kvfleet::model
