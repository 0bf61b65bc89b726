#include "kernels/paged_attention_ref.h"

#include <cmath>
#include <vector>

namespace kvfleet::kernels {
namespace {

void Rotate(std::vector<double>& x, const float* inv_freq, int32_t pos) {
  const size_t half = x.size() / 2;
  for (size_t d = 0; d < half; ++d) {
    const double angle = static_cast<float>(pos) * inv_freq[d];
    const double c = std::cos(angle), s = std::sin(angle);
    const double lo = x[d], hi = x[d + half];
    x[d] = lo * c - hi * s;
    x[d + half] = hi * c + lo * s;
  }
}

}  // namespace

void PagedAttentionRef(const PagedAttentionRefArgs& a) {
  const int D = a.layout.head_dim, B = a.layout.block_size;
  const int group = a.num_q_heads / a.layout.num_kv_heads;
  auto load = [&](int seq, int32_t pos, int kv, int head) {
    const int32_t block = a.block_tables[static_cast<int64_t>(seq) * a.max_blocks_per_seq + pos / B];
    const int64_t off = a.layout.Offset(block, a.layer, kv, head, pos % B);
    std::vector<double> v(D);
    if (a.kv_fp8 != nullptr) {
      const double scale = (kv == 0 ? a.k_scale : a.v_scale)[head];
      for (int d = 0; d < D; ++d) v[d] = Fp8E4m3ToFloat(a.kv_fp8[off + d]) * scale;
    } else {
      for (int d = 0; d < D; ++d) v[d] = Bf16ToFloat(a.kv_pool[off + d]);
    }
    return v;
  };
  for (int s = 0; s < a.num_seqs; ++s) {
    const int q_len = a.cu_q_lens[s + 1] - a.cu_q_lens[s];
    for (int j = 0; j < q_len; ++j) {
      const int64_t token = a.cu_q_lens[s] + j;
      const int32_t qpos = a.seq_lens[s] - q_len + j;
      std::vector<int32_t> keys;
      for (int32_t k = 0; k <= qpos; ++k)
        if (MaskAttends(a.mask, qpos, k)) keys.push_back(k);
      for (int h = 0; h < a.num_q_heads; ++h) {
        const int kvh = h / group;
        std::vector<double> q(D);
        for (int d = 0; d < D; ++d) q[d] = Bf16ToFloat(a.q[(token * a.num_q_heads + h) * D + d]);
        if (a.rope_inv_freq) Rotate(q, a.rope_inv_freq, static_cast<int32_t>(keys.size()) - 1);
        std::vector<double> scores(keys.size());
        double m = -INFINITY;
        for (size_t i = 0; i < keys.size(); ++i) {
          std::vector<double> k = load(s, keys[i], 0, kvh);
          if (a.rope_inv_freq) Rotate(k, a.rope_inv_freq, static_cast<int32_t>(i));
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[d] * k[d];
          scores[i] = dot * a.scale;
          m = std::max(m, scores[i]);
        }
        std::vector<double> o(D, 0.0);
        double l = 0;
        for (size_t i = 0; i < keys.size(); ++i) {
          const double w = std::exp(scores[i] - m);
          l += w;
          std::vector<double> v = load(s, keys[i], 1, kvh);
          for (int d = 0; d < D; ++d) o[d] += w * v[d];
        }
        for (int d = 0; d < D; ++d) a.out[(token * a.num_q_heads + h) * D + d] = static_cast<float>(o[d] / l);
      }
    }
  }
}

}  // namespace kvfleet::kernels
