#include "worker/backend/tensor_parallel.h"

#include <algorithm>
#include <string>

namespace kvfleet::backend {

Status CheckTensorParallel(const model::ModelConfig& c, int32_t ranks) {
  const std::string flag = "--tensor-parallel " + std::to_string(ranks);
  if (ranks != 1 && ranks != 2 && ranks != 4 && ranks != 8) {
    return InvalidArgument("--tensor-parallel must be 1, 2, 4 or 8, got " + std::to_string(ranks));
  }
  if (c.num_heads % ranks != 0) {
    return InvalidArgument(flag + ": the model's " + std::to_string(c.num_heads) +
                           " attention heads (config.json num_attention_heads) do not split over " +
                           std::to_string(ranks) + " ranks");
  }
  if (c.num_kv_heads % ranks != 0 && ranks % c.num_kv_heads != 0) {
    return InvalidArgument(flag + ": the model's " + std::to_string(c.num_kv_heads) +
                           " KV heads (config.json num_key_value_heads) neither split over " + std::to_string(ranks) +
                           " ranks nor replicate evenly onto them");
  }
  if (c.intermediate_size % ranks != 0) {
    return InvalidArgument(flag + ": the model's intermediate_size " + std::to_string(c.intermediate_size) +
                           " (config.json) does not split over " + std::to_string(ranks) + " ranks");
  }
  return Status::Ok();
}

TensorParallelShard ShardOf(const model::ModelConfig& c, int32_t ranks, int32_t rank) {
  TensorParallelShard s;
  s.rank = rank;
  s.ranks = ranks;
  s.heads = c.num_heads / ranks;
  s.head_begin = rank * s.heads;
  if (c.num_kv_heads >= ranks) {
    s.kv_heads = c.num_kv_heads / ranks;
    s.kv_head_begin = rank * s.kv_heads;
  } else {  // replicated: ranks / kv_heads consecutive ranks share one KV head
    s.kv_heads = 1;
    s.kv_head_begin = rank / (ranks / c.num_kv_heads);
  }
  s.inter = c.intermediate_size / ranks;
  s.inter_begin = rank * s.inter;
  const int64_t per = (c.vocab_size + ranks - 1) / ranks;
  s.vocab_begin = std::min<int64_t>(c.vocab_size, rank * per);
  s.vocab = std::min<int64_t>(c.vocab_size, s.vocab_begin + per) - s.vocab_begin;
  return s;
}

}  // namespace kvfleet::backend
