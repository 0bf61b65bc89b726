#include "kernels/small_kernels_ref.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace kvfleet::kernels {

void RmsNormRef(const bf16_bits* x, bf16_bits* residual, const bf16_bits* weight, bf16_bits* out, int32_t rows,
                int32_t hidden, float eps) {
  std::vector<float> v(hidden);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) {
      float a = Bf16ToFloat(x[r * hidden + i]);
      if (residual) {
        a = RoundBf16(a + Bf16ToFloat(residual[r * hidden + i]));
        residual[r * hidden + i] = FloatToBf16(a);
      }
      v[i] = a;
      ss += double(a) * a;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / hidden + eps));
    for (int i = 0; i < hidden; ++i)
      out[r * hidden + i] = FloatToBf16(Bf16ToFloat(weight[i]) * RoundBf16(v[i] * inv));
  }
}

void RopeKvStoreRef(const bf16_bits* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq,
                    bf16_bits* q_out, bf16_bits* kv_pool, const PagedKvLayout& layout, int32_t layer,
                    int32_t tokens, int32_t num_q_heads, bool rotate, const bf16_bits* q_norm,
                    const bf16_bits* k_norm, float norm_eps, const int32_t* inv_freq_row) {
  const int D = layout.head_dim, half = D / 2, hk = layout.num_kv_heads;
  const int row = (num_q_heads + 2 * hk) * D;
  std::vector<float> x(D);
  for (int64_t t = 0; t < tokens; ++t) {
    const bf16_bits* in = qkv + t * row;
    const int32_t slot = slots[t];
    const float* freq = inv_freq + (inv_freq_row ? int64_t{inv_freq_row[t]} * half : 0);
    auto rotated = [&](int head, bf16_bits* dst) {
      for (int d = 0; d < D; ++d) x[d] = Bf16ToFloat(in[head * D + d]);
      if (q_norm != nullptr) {  // HF's RMSNorm in bf16: bf16(w * bf16(x / rms))
        const bf16_bits* w = head < num_q_heads ? q_norm : k_norm;
        double ss = 0;
        for (int d = 0; d < D; ++d) ss += double(x[d]) * x[d];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / D + norm_eps));
        for (int d = 0; d < D; ++d) x[d] = RoundBf16(Bf16ToFloat(w[d]) * RoundBf16(x[d] * inv));
      }
      for (int d = 0; d < half; ++d) {
        const float a = x[d], b = x[d + half];
        if (!rotate) {
          dst[d] = FloatToBf16(a);
          dst[d + half] = FloatToBf16(b);
          continue;
        }
        const float angle = static_cast<float>(positions[t]) * freq[d];
        const float c = RoundBf16(std::cos(angle)), s = RoundBf16(std::sin(angle));
        dst[d] = FloatToBf16(RoundBf16(a * c) + RoundBf16(-b * s));
        dst[d + half] = FloatToBf16(RoundBf16(b * c) + RoundBf16(a * s));
      }
    };
    for (int h = 0; h < num_q_heads; ++h) rotated(h, q_out + (t * num_q_heads + h) * D);
    if (slot < 0) continue;
    const int64_t block = slot / layout.block_size;
    const int32_t in_block = slot % layout.block_size;
    for (int h = 0; h < hk; ++h) {
      rotated(num_q_heads + h, kv_pool + layout.Offset(block, layer, 0, h, in_block));
      std::memcpy(kv_pool + layout.Offset(block, layer, 1, h, in_block), in + (num_q_heads + hk + h) * D,
                  D * sizeof(bf16_bits));
    }
  }
}

void Llama4QkKvStoreRef(const bf16_bits* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq,
                        bf16_bits* q_out, bf16_bits* kv_pool, const PagedKvLayout& layout, int32_t layer,
                        int32_t tokens, int32_t num_q_heads, bool rotate, bool l2_norm, float norm_eps,
                        float temperature_scale, float temperature_floor) {
  const int D = layout.head_dim, hk = layout.num_kv_heads;
  const int row = (num_q_heads + 2 * hk) * D;
  std::vector<float> x(D);
  for (int64_t t = 0; t < tokens; ++t) {
    const bf16_bits* in = qkv + t * row;
    const int32_t slot = slots[t];
    const float temp = temperature_floor > 0.f
                           ? std::log1p(std::floor((static_cast<float>(positions[t]) + 1.f) / temperature_floor)) *
                                     temperature_scale + 1.f
                           : 1.f;
    auto transformed = [&](int head, bf16_bits* dst) {
      for (int d = 0; d < D; ++d) x[d] = Bf16ToFloat(in[head * D + d]);
      if (rotate) {  // (a + ib)(cos + i sin) in fp32, one rounding
        for (int i = 0; i < D / 2; ++i) {
          const float angle = static_cast<float>(positions[t]) * inv_freq[i];
          const float c = std::cos(angle), s = std::sin(angle);
          const float a = x[2 * i], b = x[2 * i + 1];
          x[2 * i] = RoundBf16(a * c - b * s);
          x[2 * i + 1] = RoundBf16(a * s + b * c);
        }
      }
      if (l2_norm) {
        double ss = 0;
        for (int d = 0; d < D; ++d) ss += double(x[d]) * x[d];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / D + norm_eps));
        for (int d = 0; d < D; ++d) x[d] = RoundBf16(x[d] * inv);
      }
      if (head < num_q_heads && temperature_floor > 0.f) {
        for (int d = 0; d < D; ++d) x[d] = RoundBf16(x[d] * temp);
      }
      for (int d = 0; d < D; ++d) dst[d] = FloatToBf16(x[d]);
    };
    for (int h = 0; h < num_q_heads; ++h) transformed(h, q_out + (t * num_q_heads + h) * D);
    if (slot < 0) continue;
    const int64_t block = slot / layout.block_size;
    const int32_t in_block = slot % layout.block_size;
    for (int h = 0; h < hk; ++h) {
      transformed(num_q_heads + h, kv_pool + layout.Offset(block, layer, 0, h, in_block));
      std::memcpy(kv_pool + layout.Offset(block, layer, 1, h, in_block), in + (num_q_heads + hk + h) * D,
                  D * sizeof(bf16_bits));
    }
  }
}

void QuantizeKvSlotsRef(const bf16_bits* kv_pool, fp8_bits* kv_fp8, const PagedKvLayout& layout, int32_t layer,
                        const int32_t* slots, int32_t tokens, const float* k_scale, const float* v_scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    const int64_t block = slots[t] / layout.block_size;
    const int32_t in_block = slots[t] % layout.block_size;
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        const int64_t off = layout.Offset(block, layer, kv, h, in_block);
        const float scale = (kv == 0 ? k_scale : v_scale)[h];
        for (int d = 0; d < layout.head_dim; ++d) kv_fp8[off + d] = FloatToFp8E4m3(Bf16ToFloat(kv_pool[off + d]) / scale);
      }
  }
}

void QuantizeKvPoolRef(const bf16_bits* kv_pool, fp8_bits* kv_fp8, const PagedKvLayout& layout, int64_t num_blocks,
                       const float* k_scales, const float* v_scales) {
  for (int64_t b = 0; b < num_blocks; ++b)
    for (int l = 0; l < layout.num_layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < layout.num_kv_heads; ++h) {
          const float scale = (kv == 0 ? k_scales : v_scales)[l * layout.num_kv_heads + h];
          const int64_t off = layout.Offset(b, l, kv, h, 0);
          for (int64_t i = 0; i < layout.TileElems(); ++i)
            kv_fp8[off + i] = FloatToFp8E4m3(Bf16ToFloat(kv_pool[off + i]) / scale);
        }
}

void SiluMulRef(const bf16_bits* gate_up, bf16_bits* out, int32_t rows, int32_t inter) {
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < inter; ++i) {
      const float g = Bf16ToFloat(gate_up[r * 2 * inter + i]), u = Bf16ToFloat(gate_up[r * 2 * inter + inter + i]);
      out[r * inter + i] = FloatToBf16(RoundBf16(g / (1.f + std::exp(-g))) * u);
    }
}

void EmbeddingRef(const int32_t* ids, const bf16_bits* table, bf16_bits* out, int32_t tokens, int32_t vocab,
                  int32_t hidden) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      std::memset(out + t * hidden, 0, hidden * sizeof(bf16_bits));
    } else {
      std::memcpy(out + t * hidden, table + int64_t(ids[t]) * hidden, hidden * sizeof(bf16_bits));
    }
  }
}

}  // namespace kvfleet::kernels
