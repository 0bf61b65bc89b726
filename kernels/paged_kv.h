// The paged KV cache layout shared by the KV manager, the cpu backend and the kernels.
//
// One pool is one allocation of bf16:
//   pool[num_blocks][num_layers][2 (K, V)][num_kv_heads][block_size][head_dim]
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

  // Elements in one [block_size][head_dim] tile (one head's K or V in one block).
  KVF_HD int64_t TileElems() const { return static_cast<int64_t>(block_size) * head_dim; }
  // Elements in one block: every layer, K and V, every head.
  KVF_HD int64_t BlockElems() const {
    return static_cast<int64_t>(num_layers) * 2 * num_kv_heads * TileElems();
  }
  KVF_HD int64_t BlockBytes() const { return BlockElems() * 2; }
  // Element offset of (block, layer, kv (0 = K, 1 = V), head, slot, dim 0).
  KVF_HD int64_t Offset(int64_t block, int32_t layer, int32_t kv, int32_t head, int32_t slot) const {
    return block * BlockElems() +
           ((static_cast<int64_t>(layer) * 2 + kv) * num_kv_heads + head) * TileElems() +
           static_cast<int64_t>(slot) * head_dim;
  }
};

}  // namespace kvfleet::kernels
