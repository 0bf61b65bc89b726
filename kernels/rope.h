// Rotary position embedding frequencies, including Llama 3's frequency scaling.
// Plain host code: the backend computes the table once at load and hands it to the kernels.
// Rotation style is HF's rotate_half (NeoX): dims i and i + head_dim/2 form a pair.
#pragma once

#include <vector>

namespace kvfleet::kernels {

struct RopeConfig {
  int head_dim = 128;
  double theta = 500000.0;  // rope_theta
  // rope_scaling {"rope_type": "llama3"}; factor <= 0 disables it.
  double llama3_factor = 0.0;
  double llama3_low_freq_factor = 1.0;
  double llama3_high_freq_factor = 4.0;
  int llama3_original_max_position = 8192;
};

// inv_freq[i] for i in [0, head_dim/2): theta^(-2i/head_dim), scaled as HF's
// _compute_llama3_parameters does. Computed in float like HF (torch.float32).
std::vector<float> RopeInvFreq(const RopeConfig& cfg);

}  // namespace kvfleet::kernels
