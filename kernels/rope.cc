#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kvfleet::kernels {
namespace {

using Type = RopeScaling::Type;

// 1 / base^(2i / dim) in float: HF's `1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))`.
std::vector<float> PlainInvFreq(float base, int dim) {
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[i] = 1.0f / std::pow(base, exponent);
  }
  return inv;
}

// _compute_llama3_parameters: wavelengths longer than original/low_freq_factor are divided by
// factor, shorter than original/high_freq_factor kept, and those between blended smoothly.
void ScaleLlama3(const RopeScaling& s, std::vector<float>& inv) {
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor;
  const double high_wavelen = old_ctx / s.high_freq_factor;
  for (float& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / s.factor);
    } else if (wavelen >= high_wavelen && s.high_freq_factor > s.low_freq_factor) {
      // Equal factors (Llama 4 Scout: 1 and 1) leave no band to blend.
      const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = static_cast<float>((1 - smooth) * f / s.factor + smooth * f);
    }
  }
}

// _compute_yarn_parameters: dims that turn more than beta_fast times over the original
// context keep their frequency (extrapolation), dims that turn less than beta_slow times are
// divided by factor (interpolation), and a linear ramp over dim indices blends between.
std::vector<float> YarnInvFreq(const RopeConfig& c) {
  const RopeScaling& s = c.scaling;
  const int dim = c.head_dim;
  const double base = c.theta;
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  // The dim index at which a frequency turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return dim * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast > 0 ? s.beta_fast : 32.0);
  double high = correction_dim(s.beta_slow > 0 ? s.beta_slow : 1.0);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevents a division by zero
  const float factor = static_cast<float>(s.factor);
  const float span = static_cast<float>(high - low);
  std::vector<float> inv(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {
    const float pos_freq = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolated = 1.0f / pos_freq;
    const float interpolated = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) / span, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // HF's inv_freq_extrapolation_factor
    inv[i] = interpolated * (1.0f - keep) + extrapolated * keep;
  }
  return inv;
}

// _compute_dynamic_ntk_parameters at run time (seq_len a tensor, so float arithmetic):
// base · (factor · seq_len / max_pos − (factor − 1))^(dim / (dim − 2)).
std::vector<float> DynamicInvFreq(const RopeConfig& c, int64_t seq_len) {
  const float factor = static_cast<float>(c.scaling.factor);
  const float ratio = factor * static_cast<float>(seq_len) / static_cast<float>(c.max_position_embeddings);
  const float grown = std::pow(ratio - static_cast<float>(c.scaling.factor - 1.0),
                               static_cast<float>(static_cast<double>(c.head_dim) / (c.head_dim - 2)));
  return PlainInvFreq(static_cast<float>(c.theta) * grown, c.head_dim);
}

// YaRN's mscale: 0.1 · m · ln(scale) + 1 above scale 1.
double YarnMscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

}  // namespace

std::vector<float> RopeInvFreq(const RopeConfig& c, int64_t seq_len) {
  switch (c.scaling.type) {
    case Type::kNone:
      break;
    case Type::kLinear: {
      std::vector<float> inv = PlainInvFreq(static_cast<float>(c.theta), c.head_dim);
      for (float& f : inv) f /= static_cast<float>(c.scaling.factor);
      return inv;
    }
    case Type::kLlama3: {
      std::vector<float> inv = PlainInvFreq(static_cast<float>(c.theta), c.head_dim);
      ScaleLlama3(c.scaling, inv);
      return inv;
    }
    case Type::kYarn:
      return YarnInvFreq(c);
    case Type::kDynamic:
      // Up to max_position_embeddings HF keeps the frequencies it computed at load, which
      // are the plain ones; past it, each forward call recomputes them for its length.
      if (seq_len > c.max_position_embeddings) return DynamicInvFreq(c, seq_len);
      break;
  }
  return PlainInvFreq(static_cast<float>(c.theta), c.head_dim);
}

double RopeAttentionScaling(const RopeConfig& c) {
  const RopeScaling& s = c.scaling;
  if (s.type != Type::kYarn) return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0 && s.mscale_all_dim != 0) {
    return YarnMscale(s.factor, s.mscale) / YarnMscale(s.factor, s.mscale_all_dim);
  }
  return YarnMscale(s.factor, 1.0);
}

}  // namespace kvfleet::kernels
