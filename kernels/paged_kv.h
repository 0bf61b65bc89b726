// The paged KV cache layout shared by the KV manager, the cpu backend and the kernels.
//
// One pool is one allocation of bf16, or of fp8 e4m3 (elem_bytes 1: --kv-cache-dtype fp8):
//   pool[num_blocks][num_layers][2 (K, V)][num_kv_heads][block_size][head_dim]
// An fp8 element holds e4m3(x / scale) with one fp32 scale per (layer, KV head) for K and one
// for V (KvScales); it reads back as e4m3 * scale. Offsets are in elements either way.
// Block-major, so one block (all the layers of its pool) is one contiguous range of bytes and
// offload/onboard moves whole blocks. Token t of a sequence lives in the block named by its
// block table entry t / block_size, at slot t % block_size. Plain data, callable on host and device.
#pragma once

#include <cstdint>

#include "kernels/attention_mask.h"  // KVF_HD

namespace kvfleet::kernels {

struct PagedKvLayout {
  int32_t num_layers = 1;    // layers stored in this pool
  int32_t num_kv_heads = 1;
  int32_t block_size = 16;   // tokens per block, 1..256 (1: token-level KV)
  int32_t head_dim = 128;
  int32_t elem_bytes = 2;    // 2: bf16; 1: fp8 e4m3

  // Elements in one [block_size][head_dim] tile (one head's K or V in one block).
  KVF_HD int64_t TileElems() const { return static_cast<int64_t>(block_size) * head_dim; }
  // Elements in one block: every layer, K and V, every head.
  KVF_HD int64_t BlockElems() const {
    return static_cast<int64_t>(num_layers) * 2 * num_kv_heads * TileElems();
  }
  KVF_HD int64_t BlockBytes() const { return BlockElems() * elem_bytes; }
  // Element offset of (block, layer, kv (0 = K, 1 = V), head, slot, dim 0).
  KVF_HD int64_t Offset(int64_t block, int32_t layer, int32_t kv, int32_t head, int32_t slot) const {
    return block * BlockElems() +
           ((static_cast<int64_t>(layer) * 2 + kv) * num_kv_heads + head) * TileElems() +
           static_cast<int64_t>(slot) * head_dim;
  }
};

// The dequantisation scales of one layer of an fp8 pool (device memory for the kernels):
// K element = e4m3 * k[head], V element = e4m3 * v[head]. Per-tensor scales repeat one value.
struct KvScales {
  const float* k = nullptr;  // [num_kv_heads]
  const float* v = nullptr;  // [num_kv_heads]
};

}  // namespace kvfleet::kernels
