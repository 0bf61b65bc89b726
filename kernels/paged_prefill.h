// Paged-attention prefill / chunked prefill: a chunk of new query tokens per sequence attends,
// causally, to the sequence's cached prefix plus itself (the chunk's K/V are already in the
// cache: LaunchRopeKvStore runs first). Flash-attention-2 style: K/V tiles of 64 cached tokens
// (spanning any number of pages) stream through shared memory (cp.async, double-buffered),
// scores and P.V run on tensor cores (mma.sync m16n8k16 bf16, fp32 accumulation), softmax is
// online, nothing of size q_len x kv_len is ever stored. GQA: the rows of a thread block are
// (token, query head) pairs of one KV head, so each K/V tile is loaded once for the whole group.
// Masks as decode (attention_mask.h); StreamingLLM shifted RoPE is decode-only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention_mask.h"
#include "kernels/paged_kv.h"

namespace kvfleet::kernels {

struct PagedPrefillParams {
  const __nv_bfloat16* q = nullptr;        // [num_tokens][num_q_heads][head_dim], RoPE applied
  const __nv_bfloat16* kv_pool = nullptr;  // PagedKvLayout
  const uint8_t* kv_fp8 = nullptr;         // instead of kv_pool: an fp8 e4m3 pool (layout.elem_bytes 1)
  KvScales scales;                         // this layer's, with kv_fp8
  const int32_t* block_tables = nullptr;   // [num_seqs][max_blocks_per_seq]
  const int32_t* cu_q_lens = nullptr;      // [num_seqs + 1] query token offsets into q / out
  const int32_t* seq_lens = nullptr;       // [num_seqs] cached tokens incl. this chunk; query
                                           // token j sits at seq_lens[s] - q_len + j
  __nv_bfloat16* out = nullptr;            // [num_tokens][num_q_heads][head_dim]
  PagedKvLayout layout;
  int32_t layer = 0;
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t max_q_len = 0;  // upper bound of the chunk lengths: sizes the grid
  float scale = 0;
  AttentionMask mask;
  // Split-KV, for chunks too few to fill the GPU over a long cached prefix (a prefix pulled
  // or reused, then its last block computed): with a workspace, the launcher splits each
  // block's K/V tiles over up to num_sms / blocks parts that write fp32 partials (O, max,
  // sum) here, then merges them into `out`. Null workspace or num_sms 0: one part.
  float* workspace = nullptr;
  size_t workspace_bytes = 0;  // PagedPrefillWorkspaceBytes: enough for any split it picks
  int32_t num_sms = 0;
  int32_t max_seq_len = 0;     // the longest seq_lens entry: how many K/V tiles there are to split
  // Set by the launcher: K/V parts, and the workspace rows one part takes (num_seqs *
  // max_q_len * num_q_heads, a row per query token and head).
  int32_t num_splits = 1;
  int64_t split_rows = 0;
};

// The workspace the split path may use at most: fp32 partials for 2 * num_sms blocks of
// query rows.
size_t PagedPrefillWorkspaceBytes(int32_t head_dim, int32_t num_sms);
// The K/V parts LaunchPagedPrefill splits each block into for `p` (1: no split).
int32_t PagedPrefillChooseSplits(const PagedPrefillParams& p);

// REQUIRES: head_dim in {64, 128}; 16-byte aligned pointers; shapes above; num_seqs and
// max_q_len * (num_q_heads / num_kv_heads) / 256 at most 65535 (grid y and z; else
// cudaErrorInvalidValue).
cudaError_t LaunchPagedPrefill(const PagedPrefillParams& p, cudaStream_t stream);

}  // namespace kvfleet::kernels
