// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053): which part of a
// model each of N ranks holds. Every backend that shards a model takes its geometry from
// here, so the cpu backend's in-process ranks and a multi-GPU backend split the same way.
//
//   - q/k/v and gate/up are column-parallel: rank r holds the output rows of its query heads,
//     its KV heads and its slice of the intermediate columns. In an MoE block, every expert's
//     gate/up and down split the same way over the expert's intermediate size; the router is
//     replicated, so every rank routes every token alike.
//   - o and down are row-parallel: rank r holds the input columns matching the above; each
//     rank's partial product is summed over the ranks (all-reduce). A bias is added once.
//   - Query heads split evenly. KV heads split evenly when there are at least N of them;
//     with fewer (MQA, or GQA with few groups) each is replicated on N / kv_heads ranks, so
//     every rank's query heads find their KV head locally.
//   - The embedding and the LM head are vocab-parallel over ceil(vocab / N)-row slices (the
//     last rank's may be shorter): the embedding's lookup is summed over ranks (a row held by
//     one rank, zeros elsewhere: exact), the LM head's logits are gathered.
//   - Norms, RoPE and the residual stream are replicated.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend {

// What rank `rank` of `ranks` holds. Ranges are [begin, begin + count).
struct TensorParallelShard {
  int32_t rank = 0, ranks = 1;
  int64_t head_begin = 0, heads = 0;        // query heads
  int64_t kv_head_begin = 0, kv_heads = 0;  // KV heads (replicated ones included)
  int64_t inter_begin = 0, inter = 0;       // intermediate (gate/up rows, down columns)
  int64_t expert_inter_begin = 0, expert_inter = 0;  // each MoE expert's intermediate; 0 when dense
  int64_t vocab_begin = 0, vocab = 0;       // embedding and LM head rows; may be 0 for a tiny vocabulary
};

// Checks that `model` shards over `ranks` (--tensor-parallel): ranks is 1, 2, 4 or 8; the
// attention heads and the intermediate size divide by it; the KV heads divide by it or it
// by them. InvalidArgument names the flag and the config.json field.
Status CheckTensorParallel(const model::ModelConfig& model, int32_t ranks);

// REQUIRES: CheckTensorParallel(model, ranks).ok(), 0 <= rank < ranks.
TensorParallelShard ShardOf(const model::ModelConfig& model, int32_t ranks, int32_t rank);

// A LoRA target's input and output widths on shard s: model::LoraTargetDims for its part.
model::LoraDims ShardLoraDims(const model::ModelConfig& model, const TensorParallelShard& s, model::LoraTarget t);

// Shard s's part of adapter `a` (REQUIRES: validated against the model): column-parallel
// targets keep A whole and B's rows of the shard's outputs; row-parallel ones (o, down) keep
// A's columns of the shard's inputs and B whole, so their partial deltas sum to the delta
// over the ranks. With one rank, a copy of `a`.
std::unique_ptr<model::LoraAdapter> ShardLora(const model::LoraAdapter& a, const model::ModelConfig& model,
                                              const TensorParallelShard& s);

}  // namespace kvfleet::backend
