#include "kernels/rope.h"

#include <cmath>

namespace kvfleet::kernels {

std::vector<float> RopeInvFreq(const RopeConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(cfg.head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(cfg.theta), exponent);
  }
  if (cfg.llama3_factor <= 0) return inv;
  // Llama 3.1: wavelengths longer than original/low_freq_factor are divided by factor, shorter
  // than original/high_freq_factor kept, and those between interpolated smoothly.
  const double low_wavelen = cfg.llama3_original_max_position / cfg.llama3_low_freq_factor;
  const double high_wavelen = cfg.llama3_original_max_position / cfg.llama3_high_freq_factor;
  for (int i = 0; i < half; ++i) {
    double wavelen = 2 * M_PI / inv[i];
    if (wavelen > low_wavelen) {
      inv[i] = static_cast<float>(inv[i] / cfg.llama3_factor);
    } else if (wavelen >= high_wavelen) {
      double smooth = (cfg.llama3_original_max_position / wavelen - cfg.llama3_low_freq_factor) /
                      (cfg.llama3_high_freq_factor - cfg.llama3_low_freq_factor);
      inv[i] = static_cast<float>((1 - smooth) * inv[i] / cfg.llama3_factor + smooth * inv[i]);
    }
  }
  return inv;
}

}  // namespace kvfleet::kernels
