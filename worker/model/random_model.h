// Random-weight models in Hugging Face format, for tests and benchmarks
// (`kvfleet make-model`).
//
// A shape names a real model whose config.json we reproduce (smollm2-135m, qwen2.5-0.5b,
// qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, qwen3-8b, mistral-7b, qwen3-32b, and the mixtures
// of experts qwen3-30b-a3b and mixtral-8x7b), Llama 4 Scout's text model with 4 of its 16
// experts (llama-4-scout-4e: its layer pattern on one GPU), or a tiny one for CI (tiny: Llama 3 style with
// GQA, tied embeddings and llama3 rope scaling; tiny-qwen2: QKV bias; tiny-qwen3:
// q_norm/k_norm, head_dim 64 with hidden 64 and 4 heads, YaRN x4; tiny-mistral: MQA, untied
// lm_head and a 20-token sliding window; tiny-mixtral: 4 experts, top-2 renormalised;
// tiny-qwen3-moe: 8 experts, top-2 not renormalised, a dense layer between two MoE layers;
// tiny-llama4: Llama4ForCausalLM, 4 layers, MoE on 1 and 3 (4 experts, top-1, a shared
// expert), layer 3 NoPE, 16-token attention chunks, temperature tuning from position 7).
// Llama4ForConditionalGeneration configs write the text model's tensors under
// language_model. and no vision tower.
// Tiny shapes take their vocab size and bos/eos ids from the tokenizer, so a real tokenizer
// works with them.
//
// Weights are a pure function of (seed, tensor name, element index): an integer
// counter-based generator (SplitMix64) and one float multiply-add per element, so the same
// seed writes byte-identical files on any x86-64 machine. tests/gpu/make_reference.py
// implements the same rule in numpy. Element i of tensor `name` with half-range `a` and
// centre `c`:
//   key = SplitMix64(seed ^ Fnv1a64(name)); r = SplitMix64(key + i) >> 40   (24 bits)
//   w   = float(float(r - 2^23) + 0.5f) * float(a / 2^23) + c              (fp32)
// then rounded to bf16 (nearest even) when the dtype is bf16. The ranges (in fp32):
// embeddings and lm_head a = 2·sqrt(3/hidden) (logits of a few units, so greedy choices
// are not near-ties); projections a = sqrt(3/fan_in) (unit-variance activations, so
// attention is far from uniform; MoE routers and experts too, fan_in of a fused 3-D expert
// tensor [E][in][out] being `in`); norms (q_norm and k_norm too)
// c = 1, a = 0.25; biases a = 0.5.
//
// Files are written tensor by tensor in chunks, never holding a model in memory, and
// sharded HF style (model-0000i-of-0000n.safetensors + model.safetensors.index.json)
// above 5 GB.
//
// Thread safety: functions without shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/model/safetensors.h"

namespace kvfleet::model {

// Bumped whenever a shape's config or the weight rule changes, so caches of generated
// models (tests) are not reused across versions.
constexpr int kRandomModelVersion = 1;

// The shape names MakeRandomModel accepts.
std::vector<std::string> RandomModelShapes();

struct RandomModelOptions {
  std::string shape;          // one of RandomModelShapes()
  std::string tokenizer_dir;  // copied: tokenizer.json, tokenizer_config.json, and the rest
  std::string out_dir;        // created if missing; existing model files are replaced
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // kBF16 or kF32
  // Shards hold at most this many bytes of tensors; HF's save_pretrained default.
  uint64_t max_shard_bytes = 5'000'000'000ull;
  bool config_only = false;  // write config.json and the tokenizer files, no weights
  // When set, config.json is this object (torch_dtype set from `dtype`) instead of the
  // shape's: a real repository's own field set (cli/model_layouts.h). `shape` is then unused.
  std::optional<nlohmann::json> config;
  int threads = 0;  // generator threads; 0: hardware concurrency (the bytes do not depend on it)
  // Called after each tensor with (tensors done, tensors, bytes done, bytes).
  std::function<void(size_t, size_t, uint64_t, uint64_t)> progress;
};

// The config.json object of `shape`; `vocab_size`, `bos`, `eos` are used by tiny shapes
// (bos/eos < 0: left out).
Result<nlohmann::json> RandomModelConfig(const std::string& shape, int64_t vocab_size, int64_t bos, int64_t eos);

// The weight of element `index` of tensor `name` (fp32, before any bf16 rounding).
float RandomWeight(uint64_t tensor_key, uint64_t index, float step, float centre);
uint64_t RandomTensorKey(uint64_t seed, const std::string& name);

// Writes the model directory. Reports the tensors and bytes written through `progress`.
Status MakeRandomModel(const RandomModelOptions& options);

}  // namespace kvfleet::model
