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
  if (c.is_moe() && c.moe.expert_intermediate % ranks != 0) {
    return InvalidArgument(flag + ": the model's experts' intermediate size " +
                           std::to_string(c.moe.expert_intermediate) +
                           " (config.json moe_intermediate_size, or Mixtral's intermediate_size) does not split over " +
                           std::to_string(ranks) + " ranks");
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
  s.expert_inter = c.moe.expert_intermediate / ranks;
  s.expert_inter_begin = rank * s.expert_inter;
  const int64_t per = (c.vocab_size + ranks - 1) / ranks;
  s.vocab_begin = std::min<int64_t>(c.vocab_size, rank * per);
  s.vocab = std::min<int64_t>(c.vocab_size, s.vocab_begin + per) - s.vocab_begin;
  return s;
}

model::LoraDims ShardLoraDims(const model::ModelConfig& c, const TensorParallelShard& s, model::LoraTarget t) {
  const auto h = static_cast<int32_t>(c.hidden_size), q = static_cast<int32_t>(s.heads * c.head_dim),
             kv = static_cast<int32_t>(s.kv_heads * c.head_dim), inter = static_cast<int32_t>(s.inter);
  switch (t) {
    case model::LoraTarget::kQ: return {h, q};
    case model::LoraTarget::kK:
    case model::LoraTarget::kV: return {h, kv};
    case model::LoraTarget::kO: return {q, h};
    case model::LoraTarget::kGate:
    case model::LoraTarget::kUp: return {h, inter};
    case model::LoraTarget::kDown: return {inter, h};
  }
  return {};
}

std::unique_ptr<model::LoraAdapter> ShardLora(const model::LoraAdapter& a, const model::ModelConfig& c,
                                              const TensorParallelShard& s) {
  using model::LoraTarget;
  auto out = std::make_unique<model::LoraAdapter>();
  out->name = a.name;
  out->lora_id = a.lora_id;
  out->base_model = a.base_model;
  out->path = a.path;
  out->rank = a.rank;
  out->scaling = a.scaling;
  out->layers.resize(a.layers.size());
  const int64_t hd = c.head_dim, R = a.rank;
  for (size_t l = 0; l < a.layers.size(); ++l) {
    for (int ti = 0; ti < model::kNumLoraTargets; ++ti) {
      const auto t = static_cast<LoraTarget>(ti);
      const model::LoraMatrices& m = a.layers[l][ti];
      model::LoraMatrices& o = out->layers[l][ti];
      if (m.empty()) continue;
      if (s.ranks == 1) {
        o = m;
        continue;
      }
      const model::LoraDims full = model::LoraTargetDims(c, t);
      int64_t begin = 0, count = 0;  // the rank's outputs (column-parallel) or inputs (row-parallel)
      switch (t) {
        case LoraTarget::kQ:
        case LoraTarget::kO: begin = s.head_begin * hd, count = s.heads * hd; break;
        case LoraTarget::kK:
        case LoraTarget::kV: begin = s.kv_head_begin * hd, count = s.kv_heads * hd; break;
        case LoraTarget::kGate:
        case LoraTarget::kUp:
        case LoraTarget::kDown: begin = s.inter_begin, count = s.inter; break;
      }
      if (t == LoraTarget::kO || t == LoraTarget::kDown) {
        o.b = m.b;
        o.a.reserve(static_cast<size_t>(R * count));
        for (int64_t r = 0; r < R; ++r) {
          const float* row = m.a.data() + r * full.in + begin;
          o.a.insert(o.a.end(), row, row + count);
        }
      } else {
        o.a = m.a;
        o.b.assign(m.b.begin() + begin * R, m.b.begin() + (begin + count) * R);
      }
    }
  }
  return out;
}

}  // namespace kvfleet::backend
