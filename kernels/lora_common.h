// Limits shared by the LoRA kernels (lora.h), their CPU reference (lora_ref.h) and the
// backends that size device slots: plain C++, no CUDA. Thread-safe (constants).
#pragma once

#include <cstdint>

namespace kvfleet::kernels {

// Most rows of one tile: each row is one fp32 accumulator per rank row a warp computes.
constexpr int32_t kLoraMaxTileRows = 16;
// Most targets one launch covers (q, k, v).
constexpr int32_t kLoraMaxSegments = 3;
// Largest rank a slot holds (model::kMaxLoraRank).
constexpr int32_t kLoraMaxRank = 64;

}  // namespace kvfleet::kernels
