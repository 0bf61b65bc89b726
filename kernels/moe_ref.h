// CPU references of moe.h, with the same rounding points. Plain C++ (no CUDA), so CI builds
// them; the GPU tests compare the kernels with them. Thread-compatible.
#pragma once

#include <cstdint>

#include "kernels/bf16.h"

namespace kvfleet::kernels {

// Shapes as LaunchMoeRoute.
void MoeRouteRef(const bf16_bits* logits, int32_t ld, int32_t T, int32_t E, int32_t k, bool normalize,
                 int32_t* experts, float* weights);

// Shapes as LaunchMoeRouteSigmoid (Llama 4).
void MoeRouteSigmoidRef(const float* logits, int32_t ld, int32_t T, int32_t E, int32_t k, int32_t* experts,
                        float* weights);

// Shapes as LaunchMoeGatherScaled.
void MoeGatherScaledRef(const bf16_bits* x, const int32_t* sorted, int32_t k, const float* weights, bf16_bits* xs,
                        int32_t S, int32_t H);

// Shapes as LaunchMoeCombineAdd.
void MoeCombineAddRef(const bf16_bits* y, const int32_t* position, const bf16_bits* addend, bf16_bits* out, int32_t T,
                      int32_t k, int32_t H);

// A grouping LaunchMoeGroup could produce: routes by expert, ascending within a group.
// Shapes as LaunchMoeGroup.
void MoeGroupRef(const int32_t* experts, int32_t S, int32_t E, int32_t* sorted, int32_t* position, int32_t* offsets,
                 int32_t* tile_offsets);

// Shapes as LaunchMoeGroupedGemm (a grouping from MoeGroupRef or the kernel).
void MoeGroupedGemmRef(const bf16_bits* w, const bf16_bits* x, const int32_t* sorted, int32_t gather_div,
                       const int32_t* offsets, bf16_bits* y, int32_t S, int32_t E, int32_t N, int32_t K);

// Shapes as LaunchMoeCombine.
void MoeCombineRef(const bf16_bits* y, const float* weights, const int32_t* position, bf16_bits* out, int32_t T,
                   int32_t k, int32_t H);

}  // namespace kvfleet::kernels
