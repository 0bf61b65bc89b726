// CPU references of small_kernels.h, with the same bf16 rounding points. Plain C++ (no CUDA),
// so CI builds and tests them; the cpu backend may call them. Thread-compatible.
#pragma once

#include <cstdint>

#include "kernels/bf16.h"
#include "kernels/fp8.h"
#include "kernels/paged_kv.h"

namespace kvfleet::kernels {

// Shapes as LaunchRmsNorm; residual may be null.
void RmsNormRef(const bf16_bits* x, bf16_bits* residual, const bf16_bits* weight, bf16_bits* out, int32_t rows,
                int32_t hidden, float eps);

// Shapes as LaunchRopeKvStore; q_norm, k_norm, norm_eps and inv_freq_row as its RopeKvExtras.
void RopeKvStoreRef(const bf16_bits* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq,
                    bf16_bits* q_out, bf16_bits* kv_pool, const PagedKvLayout& layout, int32_t layer,
                    int32_t tokens, int32_t num_q_heads, bool rotate, const bf16_bits* q_norm = nullptr,
                    const bf16_bits* k_norm = nullptr, float norm_eps = 0.f, const int32_t* inv_freq_row = nullptr);

// Shapes as LaunchRopeKvStore with Llama 4's RopeKvExtras: interleaved, l2_norm (norm_eps),
// temperature_scale and temperature_floor (0: off) as there; rotate rotates interleaved pairs.
void Llama4QkKvStoreRef(const bf16_bits* qkv, const int32_t* positions, const int32_t* slots, const float* inv_freq,
                        bf16_bits* q_out, bf16_bits* kv_pool, const PagedKvLayout& layout, int32_t layer,
                        int32_t tokens, int32_t num_q_heads, bool rotate, bool l2_norm, float norm_eps,
                        float temperature_scale, float temperature_floor);

// What LaunchRopeKvStore with RopeKvExtras::kv_fp8 stores: the K/V RopeKvStoreRef wrote into
// kv_pool (bf16) at these slots, as e4m3(x / scale) into kv_fp8 (the same shape, elem_bytes 1).
//   k_scale, v_scale: [num_kv_heads] of this layer.
void QuantizeKvSlotsRef(const bf16_bits* kv_pool, fp8_bits* kv_fp8, const PagedKvLayout& layout, int32_t layer,
                        const int32_t* slots, int32_t tokens, const float* k_scale, const float* v_scale);

// Every element of num_blocks blocks of a bf16 pool as e4m3(x / scale) into an fp8 pool of
// the same shape. k_scales, v_scales: [num_layers][num_kv_heads].
void QuantizeKvPoolRef(const bf16_bits* kv_pool, fp8_bits* kv_fp8, const PagedKvLayout& layout, int64_t num_blocks,
                       const float* k_scales, const float* v_scales);

// Shapes as LaunchSiluMul.
void SiluMulRef(const bf16_bits* gate_up, bf16_bits* out, int32_t rows, int32_t inter);

// Shapes as LaunchEmbedding.
void EmbeddingRef(const int32_t* ids, const bf16_bits* table, bf16_bits* out, int32_t tokens, int32_t vocab,
                  int32_t hidden);

}  // namespace kvfleet::kernels
