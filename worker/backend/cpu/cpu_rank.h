// CpuBackend::Rank: one tensor-parallel rank of the cpu backend, its shard, KV arenas,
// threads and per-step scratch. Shared by the files that make up CpuBackend.
#pragma once

#include <cstdlib>
#include <memory>
#include <vector>

#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/cpu_moe.h"
#include "worker/backend/cpu/cpu_weights.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/backend/tensor_parallel.h"

namespace kvfleet::backend::cpu {

struct CpuBackend::Rank {
  TensorParallelShard shard;
  std::unique_ptr<ThreadPool> pool;
  CpuWeights w;
  std::vector<float*> device_kv;  // [pool] → [device_blocks][layers][2][shard.kv_heads][B][head_dim]
  std::vector<float*> host_kv;    // [pool] → [host_blocks][...] or null
  std::vector<uint64_t> bytes_per_block;  // [pool]: this rank's part of a block
  std::vector<std::unique_ptr<model::LoraAdapter>> lora;  // [max_loras]: this rank's shard, null: empty

  // Per-step scratch. q, kv, I: the rank's q_size, kv_size and intermediate slice.
  std::vector<float> x;       // [T][hidden] residual stream (the same on every rank)
  std::vector<float> xn;      // [T][hidden] normed, then the row-parallel products
  std::vector<float> qkv;     // [T][q + 2kv]
  std::vector<float> attn;    // [T][q]
  std::vector<float> mlp;     // [T][2·I]
  std::vector<float> act;     // [T][I]
  std::vector<float> head;    // [rows needing logits][hidden]
  std::vector<float> logits;  // [rows needing logits][shard.vocab]; only with several ranks
  std::vector<float> moe_in;  // [T][hidden]: an MoE layer's normed input (its output goes to xn)
  MoeScratch moe;             // an MoE layer's routes and per-expert rows

  ~Rank() {
    for (float* p : device_kv) std::free(p);
    for (float* p : host_kv) std::free(p);
  }
  float* KvBase(size_t pi, kv::BlockId block) const {
    return device_kv[pi] + static_cast<size_t>(block) * (bytes_per_block[pi] / sizeof(float));
  }
};

}  // namespace kvfleet::backend::cpu
