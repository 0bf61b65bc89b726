// Paged attention for any head_dim (even, <= 256): one warp per (query token, query head),
// keys visited one at a time with an online softmax. The fallback for shapes the
// tensor-core kernels do not take (head_dim other than 64/128 in prefill, other than
// 64/128/256 in decode: e.g. the tiny test models, head_dim 16). Correctness over speed:
// every key costs a warp reduction.
//
// Same semantics as the decode / prefill kernels: masks per attention_mask.h; with
// rope_inv_freq set (StreamingLLM shifted RoPE), q and the cached K are un-rotated and are
// rotated here by their positions inside the kept cache (sinks first, then the window),
// as the decode kernel does. Reads only blocks the mask lets a query see.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_mask.h"
#include "kernels/paged_kv.h"

namespace kvfleet::kernels {

struct GenericAttentionParams {
  const __nv_bfloat16* q = nullptr;        // [num_tokens][num_q_heads][head_dim]
  const __nv_bfloat16* kv_pool = nullptr;  // PagedKvLayout
  const uint8_t* kv_fp8 = nullptr;         // instead of kv_pool: an fp8 e4m3 pool (layout.elem_bytes 1)
  KvScales scales;                         // this layer's, with kv_fp8
  const int32_t* block_tables = nullptr;   // [num_seqs][max_blocks_per_seq]
  const int32_t* token_seq = nullptr;      // [num_tokens] sequence of each query token
  const int32_t* positions = nullptr;      // [num_tokens] absolute position of each query token
  __nv_bfloat16* out = nullptr;            // [num_tokens][num_q_heads][head_dim]
  const float* rope_inv_freq = nullptr;    // [head_dim / 2] or null
  PagedKvLayout layout;
  int32_t layer = 0;
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t max_blocks_per_seq = 0;
  float scale = 0;
  AttentionMask mask;
};

// REQUIRES: head_dim even and <= 256; num_q_heads % num_kv_heads == 0.
cudaError_t LaunchGenericAttention(const GenericAttentionParams& p, cudaStream_t stream);

}  // namespace kvfleet::kernels
