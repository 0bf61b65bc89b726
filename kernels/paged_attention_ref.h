// CPU reference of paged attention (decode and prefill) in double precision. Used by the GPU
// tests and available to the cpu backend. Thread-compatible (no shared state).
#pragma once

#include <cstdint>

#include "kernels/attention_mask.h"
#include "kernels/bf16.h"
#include "kernels/fp8.h"
#include "kernels/paged_kv.h"

namespace kvfleet::kernels {

struct PagedAttentionRefArgs {
  const bf16_bits* q = nullptr;           // [num_tokens][num_q_heads][head_dim]
  const bf16_bits* kv_pool = nullptr;     // PagedKvLayout
  // An fp8 pool instead (layout.elem_bytes 1): element = e4m3 * this layer's scale.
  const fp8_bits* kv_fp8 = nullptr;
  const float* k_scale = nullptr;         // [num_kv_heads], with kv_fp8
  const float* v_scale = nullptr;         // [num_kv_heads], with kv_fp8
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq]
  const int32_t* cu_q_lens = nullptr;     // [num_seqs + 1] query token offsets
  const int32_t* seq_lens = nullptr;      // [num_seqs] cached tokens incl. the new ones
  const float* rope_inv_freq = nullptr;   // [head_dim/2]: StreamingLLM shifted RoPE (q_len 1 only)
  float* out = nullptr;                   // [num_tokens][num_q_heads][head_dim]
  PagedKvLayout layout;
  int32_t layer = 0;
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  int32_t max_blocks_per_seq = 0;
  float scale = 0;
  AttentionMask mask;
};

// Query token j of sequence s sits at position seq_lens[s] - q_len + j and attends to the
// keys MaskAttends() allows. With rope_inv_freq, q and K are rotated by their index within
// the attended list (StreamingLLM).
void PagedAttentionRef(const PagedAttentionRefArgs& a);

}  // namespace kvfleet::kernels
