#include "tests/worker/backend/cpu/streaming_reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "worker/backend/cpu/cpu_kernels.h"
#include "worker/backend/cpu/cpu_weights.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/model/checkpoint.h"

namespace kvfleet::testing {

using backend::cpu::CpuWeights;

struct StreamingReference::State {
  Options o;
  model::ModelConfig c;
  backend::cpu::ThreadPool pool{1};
  CpuWeights w;
  std::unique_ptr<backend::cpu::Rope> rope;
  std::vector<std::vector<float>> k, v;  // [layer][position][kv heads · head_dim]; K not rotated
  int64_t pos = 0;                       // the next token's position

  std::vector<float> Rotated(const float* x, double position) const {
    const int64_t hd = c.head_dim;
    std::vector<float> out(x, x + hd), cs(hd);
    rope->Angles(position, cs.data(), cs.data() + hd / 2);
    rope->Apply(cs.data(), cs.data() + hd / 2, out.data());
    return out;
  }
};

StreamingReference::StreamingReference(const std::string& model_dir, Options options)
    : s_(std::make_unique<State>()) {
  s_->o = options;
  auto checkpoint = model::Checkpoint::Open(model_dir);
  REQUIRE_MESSAGE(checkpoint.ok(), checkpoint.status().ToString());
  s_->c = (*checkpoint)->config();
  auto weights = backend::cpu::LoadCpuWeights(**checkpoint, s_->pool);
  REQUIRE_MESSAGE(weights.ok(), weights.status().ToString());
  s_->w = std::move(weights).value();
  s_->rope = std::make_unique<backend::cpu::Rope>(s_->c.rope());
  s_->k.resize(s_->c.num_layers);
  s_->v.resize(s_->c.num_layers);
}

StreamingReference::~StreamingReference() = default;

const model::ModelConfig& StreamingReference::config() const { return s_->c; }

std::vector<float> StreamingReference::Next(TokenId token) {
  State& s = *s_;
  const model::ModelConfig& c = s.c;
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
  const int64_t nh = c.num_heads, kvh = c.num_kv_heads, kv = c.kv_size(), qs = c.q_size();
  const int64_t q = s.pos++;
  // The keys this token sees and the positions they take: [0, q] at their own positions in
  // the dense phase; else sinks [0, ns) at 0.., then [lo, q] at ns.. (position shift).
  std::vector<int64_t> keys;
  std::vector<double> at;
  double q_at = static_cast<double>(q);
  const bool dense = s.o.window == 0 || q < s.o.prompt_len;
  const int64_t lo = dense ? 0 : std::max<int64_t>(0, q - s.o.window + 1);
  const int64_t ns = dense ? 0 : std::min<int64_t>(s.o.sinks, lo);
  for (int64_t t = 0; t < ns; ++t) keys.push_back(t);
  for (int64_t t = lo; t <= q; ++t) keys.push_back(t);
  for (size_t i = 0; i < keys.size(); ++i) {
    at.push_back(s.o.position_shift ? static_cast<double>(i) : static_cast<double>(keys[i]));
  }
  if (s.o.position_shift) q_at = static_cast<double>(keys.size() - 1);

  auto or_null = [](const std::vector<float>& x) { return x.empty() ? nullptr : x.data(); };
  std::vector<float> x(s.w.embed.begin() + static_cast<int64_t>(token) * H,
                       s.w.embed.begin() + static_cast<int64_t>(token + 1) * H);
  std::vector<float> xn(H), qkv(qs + 2 * kv), attn(qs), o(H), mlp(2 * I), act(I);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const auto& lw = s.w.layers[l];
    backend::cpu::RmsNorm(x.data(), lw.input_norm.data(), H, c.rms_norm_eps, xn.data());
    backend::cpu::MatMul(s.pool, xn.data(), 1, H, lw.qkv.data(), qs + 2 * kv, or_null(lw.qkv_bias), qkv.data());
    s.k[l].insert(s.k[l].end(), qkv.begin() + qs, qkv.begin() + qs + kv);
    s.v[l].insert(s.v[l].end(), qkv.begin() + qs + kv, qkv.end());
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / kvh);
      const std::vector<float> qr = s.Rotated(&qkv[h * hd], q_at);
      std::vector<double> score(keys.size());
      double m = -INFINITY;
      for (size_t i = 0; i < keys.size(); ++i) {
        const std::vector<float> kr = s.Rotated(&s.k[l][keys[i] * kv + g * hd], at[i]);
        double d = 0;
        for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(qr[e]) * kr[e];
        score[i] = d / std::sqrt(static_cast<double>(hd));
        m = std::max(m, score[i]);
      }
      double sum = 0;
      for (double& sc : score) sum += (sc = std::exp(sc - m));
      for (int64_t e = 0; e < hd; ++e) {
        double acc = 0;
        for (size_t i = 0; i < keys.size(); ++i) acc += score[i] * s.v[l][keys[i] * kv + g * hd + e];
        attn[h * hd + e] = static_cast<float>(acc / sum);
      }
    }
    backend::cpu::MatMul(s.pool, attn.data(), 1, qs, lw.o.data(), H, or_null(lw.o_bias), o.data());
    for (int64_t i = 0; i < H; ++i) x[i] += o[i];
    backend::cpu::RmsNorm(x.data(), lw.post_norm.data(), H, c.rms_norm_eps, xn.data());
    backend::cpu::MatMul(s.pool, xn.data(), 1, H, lw.gate_up.data(), 2 * I, or_null(lw.gate_up_bias), mlp.data());
    backend::cpu::SiluMul(mlp.data(), mlp.data() + I, I, act.data());
    backend::cpu::MatMul(s.pool, act.data(), 1, I, lw.down.data(), H, or_null(lw.down_bias), o.data());
    for (int64_t i = 0; i < H; ++i) x[i] += o[i];
  }
  backend::cpu::RmsNorm(x.data(), s.w.final_norm.data(), H, c.rms_norm_eps, xn.data());
  std::vector<float> logits(c.vocab_size);
  backend::cpu::MatMul(s.pool, xn.data(), 1, H, s.w.lm_head_data(), c.vocab_size, nullptr, logits.data());
  return logits;
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

}  // namespace kvfleet::testing
