// CpuWeights: a model's weights in fp32, laid out for the cpu backend's matrix products.
// q/k/v projections are stacked into one [q + 2·kv][hidden] matrix and gate/up into one
// [2·intermediate][hidden], so each takes one pass over the activations; an MoE expert's
// gate/up likewise. Llama 4's fused expert tensors ([E][hidden][2·inter] and
// [E][inter][hidden], applied as x·W) are transposed into the same per-expert layout.
//
// Under tensor parallelism (worker/backend/tensor_parallel.h) each rank's CpuWeights holds
// only its shard, in the same layout with local sizes: q, kv and intermediate below are the
// rank's heads·head_dim, KV heads·head_dim and intermediate slice; vocab is its vocab slice.
// Norms are whole on every rank; o_bias and down_bias only on rank 0 (added once).
//
// Thread safety: immutable after LoadCpuWeights().
#pragma once

#include <vector>

#include "common/status.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/model/checkpoint.h"

namespace kvfleet::backend::cpu {

struct CpuLayerWeights {
  std::vector<float> input_norm;    // [hidden]
  std::vector<float> qkv;           // [q + 2·kv][hidden]: q_proj, then k_proj, then v_proj rows
  std::vector<float> qkv_bias;      // [q + 2·kv], empty without attention_bias
  std::vector<float> o;             // [hidden][q]
  std::vector<float> o_bias;        // [hidden] or empty
  std::vector<float> q_norm;        // [head_dim] or empty without qk_norm (Qwen3)
  std::vector<float> k_norm;        // [head_dim] or empty
  std::vector<float> post_norm;     // [hidden]
  std::vector<float> gate_up;       // [2·intermediate][hidden]: gate rows, then up rows
  std::vector<float> gate_up_bias;  // [2·intermediate] or empty
  std::vector<float> down;          // [hidden][intermediate]
  std::vector<float> down_bias;     // [hidden] or empty
  // An MoE layer (ModelConfig::sparse_layer) has these instead of gate_up and down; ei is the
  // rank's slice of an expert's intermediate size.
  std::vector<float> router;                         // [experts][hidden], whole on every rank
  std::vector<std::vector<float>> expert_gate_up;    // [experts] → [2·ei][hidden]: gate rows, then up rows
  std::vector<std::vector<float>> expert_down;       // [experts] → [hidden][ei]
  // Llama 4's shared expert (MoeConfig::shared_expert_intermediate, sliced like an expert's).
  std::vector<float> shared_gate_up;  // [2·ei][hidden]: gate rows, then up rows; empty: none
  std::vector<float> shared_down;     // [hidden][ei]
};

struct CpuWeights {
  std::vector<float> embed;       // [vocab][hidden]: this rank's rows of the vocabulary
  std::vector<CpuLayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [vocab][hidden]; empty when tied to embed
  const float* lm_head_data() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
};

// Copies every tensor of the (already validated) checkpoint to fp32, showing progress on
// a terminal: one CpuWeights per shard, each holding only its part. Fails only when memory
// runs out.
Result<std::vector<CpuWeights>> LoadCpuWeights(const model::Checkpoint& checkpoint, ThreadPool& pool,
                                               const std::vector<TensorParallelShard>& shards);
// The whole model (one shard of one rank).
Result<CpuWeights> LoadCpuWeights(const model::Checkpoint& checkpoint, ThreadPool& pool);

}  // namespace kvfleet::backend::cpu
