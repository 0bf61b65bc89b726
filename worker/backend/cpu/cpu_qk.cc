#include "worker/backend/cpu/cpu_qk.h"

#include <cmath>

namespace kvfleet::backend::cpu {

float Llama4TemperatureScale(const model::ModelConfig& c, int64_t position) {
  if (!c.attn_temperature_tuning) return 1.0f;
  // In fp32, as HF: log1p(floor((p + 1) / floor_scale)) · attn_scale + 1.
  const float f = std::floor((static_cast<float>(position) + 1.0f) / static_cast<float>(c.floor_scale));
  return std::log1p(f) * static_cast<float>(c.attn_scale) + 1.0f;
}

void TransformQk(const model::ModelConfig& c, int64_t l, const CpuLayerWeights& lw, const Rope& rope,
                 const float* cos_v, const float* sin_v, int64_t position, int64_t heads, int64_t kv_heads,
                 float* row) {
  const int64_t hd = c.head_dim;
  if (c.qk_norm) {  // Qwen3: before RoPE
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      const float* w = h < heads ? lw.q_norm.data() : lw.k_norm.data();
      RmsNorm(row + h * hd, w, hd, c.rms_norm_eps, row + h * hd);
    }
  }
  if (!c.uses_rope(l)) {
    const float scale = Llama4TemperatureScale(c, position);
    if (scale != 1.0f) {
      for (int64_t i = 0; i < heads * hd; ++i) row[i] *= scale;
    }
    return;
  }
  for (int64_t h = 0; h < heads + kv_heads; ++h) rope.Apply(cos_v, sin_v, row + h * hd);
  if (c.qk_l2_norm) {  // Llama 4: after RoPE, no weight
    for (int64_t h = 0; h < heads + kv_heads; ++h) RmsNorm(row + h * hd, nullptr, hd, c.rms_norm_eps, row + h * hd);
  }
}

}  // namespace kvfleet::backend::cpu
