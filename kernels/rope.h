// Rotary position embedding: the inverse frequencies and the attention scaling of every
// rope_type kvfleet runs, as Hugging Face transformers' modeling_rope_utils computes them
// (ROPE_INIT_FUNCTIONS; transformers 5 semantics). The one place both backends take them
// from: the cpu backend rotates with them, the cuda backend uploads them to the kernels.
// Rotation style: HF's rotate_half (NeoX), where dims i and i + head_dim/2 form a pair, or,
// with RopeConfig::interleaved, Llama 4's complex form, where dims 2i and 2i + 1 do (Meta's
// reference: q viewed as complex numbers times e^{i·θ_i·pos}); both use inv_freq[i] for pair i.
//
// Plain host code, computed in float as HF does (torch.float32), so the frequencies match
// transformers' to the last bit or two. Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kvfleet::kernels {

// config.json's rope_scaling (transformers 4) or rope_parameters (transformers 5).
struct RopeScaling {
  enum class Type : uint8_t {
    kNone,     // "default": theta^(-2i/d)
    kLinear,   // positions divided by `factor`
    kLlama3,   // Llama 3.1: long wavelengths divided by `factor`, short kept, blended between
    kYarn,     // YaRN (arXiv 2309.00071): a ramp from extrapolated to interpolated dims, and
               // an attention scaling (mscale) on cos and sin
    kDynamic,  // dynamic NTK: theta grows with the sequence length past max_position_embeddings
  } type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3 and yarn: the pre-extension context length. yarn: max_position_embeddings when
  // config.json leaves it out (as transformers 5 standardizes it).
  int64_t original_max_position_embeddings = 8192;
  // yarn. beta_fast/beta_slow: the rotation counts bounding the ramp (0 = HF's 32 and 1);
  // attention_factor: the cos/sin scaling (none: derived from factor, mscale, mscale_all_dim);
  // truncate: round the ramp bounds outward to whole dims (gpt-oss turns it off).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  std::optional<double> attention_factor;
  double mscale = 0.0;  // 0 = unset, as HF's `if mscale and mscale_all_dim`
  double mscale_all_dim = 0.0;
  bool truncate = true;
};

struct RopeConfig {
  int head_dim = 128;
  double theta = 500000.0;                  // rope_theta
  int64_t max_position_embeddings = 131072;  // dynamic: the length past which theta grows
  RopeScaling scaling;
  bool interleaved = false;  // pairs (2i, 2i + 1) (Llama 4), else (i, i + head_dim/2)
};

// inv_freq[i] for i in [0, head_dim/2) of a sequence whose longest position so far is
// seq_len - 1. Only kDynamic depends on seq_len (HF recomputes it from the batch's largest
// position each forward call once that passes max_position_embeddings); seq_len <= 0 means
// "at load", which is max_position_embeddings: the unscaled frequencies.
std::vector<float> RopeInvFreq(const RopeConfig& cfg, int64_t seq_len = 0);

// The factor HF multiplies cos and sin by (`attention_scaling`): yarn's, 1 for the others.
// Rotating q and k by scaled cos/sin multiplies every attention score by its square.
double RopeAttentionScaling(const RopeConfig& cfg);

// True when the frequencies depend on the sequence length (kDynamic).
inline bool RopeDependsOnLength(const RopeConfig& cfg) { return cfg.scaling.type == RopeScaling::Type::kDynamic; }

}  // namespace kvfleet::kernels
