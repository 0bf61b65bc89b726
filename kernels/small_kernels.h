// The elementwise and row kernels of the Llama forward pass: RMSNorm fused with the residual
// add, RoPE (after Qwen3's per-head q/k RMSNorm) fused with the K/V store into the paged
// cache, SiLU-and-mul, embedding lookup.
// Framework-free: raw pointers, every shape in a comment. Each launcher takes a stream and
// returns cudaError_t; shape checks live in the backend. Rounding follows HF transformers in
// bf16 (each op rounds its output to bf16), so greedy tokens can match HF's bf16 run.
// CPU references: small_kernels_ref.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/paged_kv.h"

namespace kvfleet::kernels {

// With residual: residual = bf16(residual + x); out = bf16(weight * bf16(r / rms(r))).
// Without (residual == null): the same on x. rms(r) = sqrt(mean(r^2) + eps) in fp32.
//   x, out: [rows][hidden]; residual: [rows][hidden] or null; weight: [hidden].
// REQUIRES: hidden % 8 == 0, hidden <= 32768; out may alias x.
cudaError_t LaunchRmsNorm(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                          __nv_bfloat16* out, int32_t rows, int32_t hidden, float eps, cudaStream_t stream);

// Rotates q and k (HF rotate_half, cos/sin rounded to bf16 as HF does in a bf16 model) and
// writes K and V into the paged cache.
//   qkv: [tokens][(num_q_heads + 2 * num_kv_heads) * head_dim]: q heads, k heads, v heads
//        (biases already added by the GEMM epilogue)
//   positions: [tokens]; slots: [tokens] block_id * block_size + slot, < 0 = not stored
//   inv_freq: [head_dim / 2] (rope.h); q_out: [tokens][num_q_heads][head_dim]
//   rotate == false (StreamingLLM shifted RoPE): q and K are stored un-rotated; the
//   attention kernel rotates them.
// REQUIRES: head_dim % 16 == 0.
cudaError_t LaunchRopeKvStore(const __nv_bfloat16* qkv, const int32_t* positions, const int32_t* slots,
                              const float* inv_freq, __nv_bfloat16* q_out, __nv_bfloat16* kv_pool,
                              const PagedKvLayout& layout, int32_t layer, int32_t tokens, int32_t num_q_heads,
                              bool rotate, cudaStream_t stream);

// What LaunchRopeKvStore does besides, when set: Qwen3's per-head RMSNorm before the
// rotation, and frequencies per token (dynamic NTK scaling: one row per sequence).
struct RopeKvExtras {
  // Each q head becomes bf16(q_norm * bf16(x / rms(x))) over its head_dim, rms in fp32 with
  // norm_eps (HF's RMSNorm in a bf16 model); each k head the same with k_norm. Both or none.
  const __nv_bfloat16* q_norm = nullptr;  // [head_dim] or null
  const __nv_bfloat16* k_norm = nullptr;  // [head_dim] or null
  float norm_eps = 0.f;
  // Token t rotates with inv_freq + inv_freq_row[t] * head_dim / 2 (inv_freq then holds
  // [rows][head_dim / 2]); null: every token with inv_freq's one row.
  const int32_t* inv_freq_row = nullptr;  // [tokens] or null
  // An fp8 pool (layout.elem_bytes 1): K and V go here as e4m3(bf16(x) / scale), saturated
  // to +-448, instead of kv_pool (which may be null). scales: this layer's (paged_kv.h).
  uint8_t* kv_fp8 = nullptr;
  KvScales scales;
  // Llama 4 (worker/model/llama4_config.h), in transformers' order (modeling_llama4.py):
  //   interleaved: the rotation acts on pairs (2i, 2i + 1) with inv_freq[i], in fp32 with fp32
  //     cos/sin, rounded to bf16 once (apply_rotary_emb's complex product), not rotate_half;
  //   l2_norm: then each q and k head becomes bf16(x / rms(x)) over its head_dim, x the rotated
  //     bf16 head, rms in fp32 with norm_eps, no weight (Llama4TextL2Norm; RoPE layers only);
  //   temperature_floor > 0: then q (not k) at position p becomes bf16(q · s), s = 1 +
  //     temperature_scale · log1p(floor((p + 1) / temperature_floor)) in fp32
  //     (attn_temperature_tuning; NoPE layers only, where rotate is false).
  // Any of these takes a warp per head (a kernel of its own); not with q_norm / k_norm or an
  // fp8 pool (the cuda backend refuses fp8 KV for Llama 4), and rotating only with interleaved
  // (no model rotates by halves with these).
  bool interleaved = false;
  bool l2_norm = false;
  float temperature_scale = 0.f;
  float temperature_floor = 0.f;  // 0: no temperature tuning
  bool llama4() const { return interleaved || l2_norm || temperature_floor > 0.f; }
};

// LaunchRopeKvStore with the extras. REQUIRES: as above; head_dim <= 256 with norms or any
// of Llama 4's transforms.
cudaError_t LaunchRopeKvStore(const __nv_bfloat16* qkv, const int32_t* positions, const int32_t* slots,
                              const float* inv_freq, __nv_bfloat16* q_out, __nv_bfloat16* kv_pool,
                              const PagedKvLayout& layout, int32_t layer, int32_t tokens, int32_t num_q_heads,
                              bool rotate, const RopeKvExtras& extras, cudaStream_t stream);

// out = bf16(bf16(silu(gate)) * up).
//   gate_up: [rows][2 * inter] (gate, then up); out: [rows][inter].  REQUIRES: inter % 8 == 0.
cudaError_t LaunchSiluMul(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int32_t rows, int32_t inter,
                          cudaStream_t stream);

// out[t] = table[ids[t]]; an id outside [0, vocab) gives a zero row.
//   ids: [tokens]; table: [vocab][hidden]; out: [tokens][hidden].  REQUIRES: hidden % 8 == 0.
cudaError_t LaunchEmbedding(const int32_t* ids, const __nv_bfloat16* table, __nv_bfloat16* out, int32_t tokens,
                            int32_t vocab, int32_t hidden, cudaStream_t stream);

}  // namespace kvfleet::kernels
