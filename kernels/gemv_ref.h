// CPU reference of gemv.h (and of the backend's GEMMs at any row count): y = x · wᵀ (+ bias)
// with fp32 accumulation. Plain C++; thread-compatible.
#pragma once

#include <cstdint>

#include "kernels/bf16.h"

namespace kvfleet::kernels {

// Shapes as LaunchGemv (any n >= 1); y is fp32, before the output rounding.
//   w: [m][k]; x: [n][k]; bias: [m] or null; y: [n][m].
void GemvRef(const bf16_bits* w, const bf16_bits* x, const bf16_bits* bias, float* y, int32_t m, int32_t n, int32_t k);

}  // namespace kvfleet::kernels
