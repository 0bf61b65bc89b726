// Paged-attention decode: one new query token per sequence attends to that sequence's cached
// K/V, read through its block table. Split-K over the context with a reduction kernel.
// GQA/MQA: one thread block reads each KV head once for (up to 16 of) its query heads.
// Masks: causal, sliding window, StreamingLLM sinks, chunked attention (attention_mask.h).
// StreamingLLM position-shifted RoPE: with rope_inv_freq set, q and the cached K are
// un-rotated and the kernel rotates them by their positions inside the kept cache
// (sinks first, then the window), as StreamingLLM does.
//
// Host tier: every block in a block table must be on the device; the KV manager onboards
// host-tier blocks (kv_block_copy.h) before the step. Nothing is read over PCIe.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_mask.h"
#include "kernels/decode_partition.h"  // PagedDecodeChoosePartition
#include "kernels/paged_kv.h"

namespace kvfleet::kernels {

struct PagedDecodeParams {
  const __nv_bfloat16* q = nullptr;     // [num_seqs][num_q_heads][head_dim], RoPE applied
                                        // unless rope_inv_freq is set
  const __nv_bfloat16* kv_pool = nullptr;  // PagedKvLayout: [blocks][layers][2][kv_heads][B][head_dim]
  const uint8_t* kv_fp8 = nullptr;         // instead of kv_pool: an fp8 e4m3 pool (layout.elem_bytes 1)
  KvScales scales;                         // this layer's, with kv_fp8
  const int32_t* block_tables = nullptr;   // [num_seqs][max_blocks_per_seq]; entry j holds
                                           // tokens [j*B, (j+1)*B); masked-out entries unread
  const int32_t* seq_lens = nullptr;       // [num_seqs] cached tokens incl. this step's, >= 1
  __nv_bfloat16* out = nullptr;            // [num_seqs][num_q_heads][head_dim]
  float* workspace = nullptr;              // PagedDecodeWorkspaceBytes(); unused when one
                                           // partition covers max_seq_len
  const float* rope_inv_freq = nullptr;    // [head_dim/2] or null (see above)
  PagedKvLayout layout;
  int32_t layer = 0;             // layer within the pool
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;       // multiple of layout.num_kv_heads
  int32_t max_blocks_per_seq = 0;
  int32_t max_seq_len = 0;       // upper bound of seq_lens: sizes the grid (CUDA graphs: fixed)
  int32_t partition_size = 0;    // tokens per split-K partition, multiple of 128, > 0
  float scale = 0;               // softmax scale, usually 1/sqrt(head_dim)
  AttentionMask mask;
  // head_dim <= 128 without shifted RoPE runs on tensor cores; true forces the CUDA-core
  // kernel (which head_dim 256 and shifted RoPE always use). For tests and benches.
  bool force_cuda_cores = false;
};

// Bytes of workspace the launch needs (0 when max_seq_len fits one partition).
size_t PagedDecodeWorkspaceBytes(const PagedDecodeParams& p);

// REQUIRES: head_dim in {64, 128, 256}; 16-byte aligned q, out and pool; the shapes above.
cudaError_t LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace kvfleet::kernels
