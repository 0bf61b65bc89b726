// The per-head transforms of one token's q and k between the QKV projection and attention,
// in transformers' order for each architecture:
//   Qwen3: RMSNorm (weights q_norm/k_norm) over each head, then RoPE.
//   Llama 4 RoPE layers: RoPE on interleaved pairs, then use_qk_norm's weightless RMSNorm.
//   Llama 4 NoPE layers: no rotation; with attn_temperature_tuning q is scaled by
//     1 + attn_scale · log(1 + floor((position + 1) / floor_scale)).
//   The others: RoPE.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>

#include "worker/backend/cpu/cpu_kernels.h"
#include "worker/backend/cpu/cpu_weights.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend::cpu {

// Transforms row's `heads` q heads, then its `kv_heads` k heads, in place, for layer l at
// `position`.
//   row: [(heads + kv_heads) · head_dim]; cos_v, sin_v: [head_dim / 2] (Rope::Angles at position).
void TransformQk(const model::ModelConfig& c, int64_t l, const CpuLayerWeights& lw, const Rope& rope,
                 const float* cos_v, const float* sin_v, int64_t position, int64_t heads, int64_t kv_heads,
                 float* row);

// The factor a NoPE layer of Llama 4 multiplies q at `position` by (1 without tuning).
float Llama4TemperatureScale(const model::ModelConfig& c, int64_t position);

}  // namespace kvfleet::backend::cpu
