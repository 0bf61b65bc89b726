#include "worker/backend/cpu/cpu_weights.h"

#include <algorithm>
#include <new>

namespace kvfleet::backend::cpu {
namespace {

// Elements per conversion work item: large enough to amortize scheduling.
constexpr int64_t kConvertChunk = 1 << 18;

// A block of a tensor seen as [rows][cols] (a 1-D tensor is one column): rows
// [row0, row0 + rows) and columns [col0, col0 + cols). rows/cols -1: all of them.
struct Part {
  int64_t row0 = 0, rows = -1, col0 = 0, cols = -1;
};
Part Rows(int64_t row0, int64_t rows) { return {row0, rows, 0, -1}; }
Part Cols(int64_t col0, int64_t cols) { return {0, -1, col0, cols}; }

class Loader {
 public:
  Loader(const model::Checkpoint& ck, ThreadPool& pool)
      : ck_(ck), pool_(pool), progress_(ck.specs().size(), ck.weight_bytes()) {}

  // Appends part `p` of the named tensor, converted to fp32, to `dst`.
  void Append(const std::string& name, std::vector<float>* dst, Part p = {}) {
    const model::TensorView& t = ck_.tensor(name);
    const int64_t n = t.numel();
    const int64_t all_cols = t.shape.size() >= 2 ? n / t.shape[0] : 1;
    const int64_t all_rows = n / all_cols;
    const int64_t rows = p.rows < 0 ? all_rows - p.row0 : p.rows, cols = p.cols < 0 ? all_cols - p.col0 : p.cols;
    const size_t at = dst->size();
    dst->resize(at + static_cast<size_t>(rows * cols));
    float* out = dst->data() + at;
    const size_t esize = model::DTypeSize(t.dtype);
    if (cols == all_cols) {  // contiguous rows: convert in even chunks
      const int64_t total = rows * cols;
      const std::byte* src = t.bytes.data() + p.row0 * cols * esize;
      pool_.ParallelFor((total + kConvertChunk - 1) / kConvertChunk, [&](int64_t c) {
        const int64_t b = c * kConvertChunk, e = std::min(total, b + kConvertChunk);
        model::ConvertToF32(t.dtype, src + b * esize, static_cast<size_t>(e - b), out + b);
      });
    } else {
      const int64_t per = std::max<int64_t>(1, kConvertChunk / std::max<int64_t>(cols, 1));
      pool_.ParallelFor((rows + per - 1) / per, [&](int64_t c) {
        for (int64_t r = c * per; r < std::min(rows, c * per + per); ++r) {
          const std::byte* src = t.bytes.data() + ((p.row0 + r) * all_cols + p.col0) * esize;
          model::ConvertToF32(t.dtype, src, static_cast<size_t>(cols), out + r * cols);
        }
      });
    }
  }
  void Done(const std::string& name) { progress_.Add(1, ck_.tensor(name).bytes.size()); }

 private:
  const model::Checkpoint& ck_;
  ThreadPool& pool_;
  model::LoadProgress progress_;
};

// Llama 4's fused experts of layer l into each shard's expert_gate_up / expert_down, the
// shard's slice of every expert's intermediate columns, transposed (llama4_config.h).
void LoadFusedExperts(const model::Checkpoint& ck, int64_t l, ThreadPool& pool,
                      const std::vector<TensorParallelShard>& shards, std::vector<CpuWeights>& ws) {
  const model::ModelConfig& c = ck.config();
  const int64_t E = c.moe.num_experts, H = c.hidden_size, I = c.moe.expert_intermediate;
  const model::TensorView& gu = ck.tensor(model::MlpTensorName(c, l, "experts.gate_up_proj"));  // [E][H][2I]
  const model::TensorView& dn = ck.tensor(model::MlpTensorName(c, l, "experts.down_proj"));     // [E][I][H]
  const size_t esize = model::DTypeSize(gu.dtype);
  for (CpuWeights& w : ws) {
    w.layers[l].expert_gate_up.resize(static_cast<size_t>(E));
    w.layers[l].expert_down.resize(static_cast<size_t>(E));
  }
  pool.ParallelFor(E, [&](int64_t e) {
    std::vector<float> slab(static_cast<size_t>(H * 2 * I));
    model::ConvertToF32(gu.dtype, gu.bytes.data() + e * H * 2 * I * esize, slab.size(), slab.data());
    for (size_t i = 0; i < shards.size(); ++i) {
      const int64_t b = shards[i].expert_inter_begin, ei = shards[i].expert_inter;
      std::vector<float>& dst = ws[i].layers[l].expert_gate_up[e];
      dst.resize(static_cast<size_t>(2 * ei * H));
      for (int64_t r = 0; r < ei; ++r) {
        for (int64_t h = 0; h < H; ++h) {
          dst[r * H + h] = slab[h * 2 * I + b + r];             // gate column b + r
          dst[(ei + r) * H + h] = slab[h * 2 * I + I + b + r];  // up column I + b + r
        }
      }
    }
    slab.resize(static_cast<size_t>(I * H));
    model::ConvertToF32(dn.dtype, dn.bytes.data() + e * I * H * model::DTypeSize(dn.dtype), slab.size(), slab.data());
    for (size_t i = 0; i < shards.size(); ++i) {
      const int64_t b = shards[i].expert_inter_begin, ei = shards[i].expert_inter;
      std::vector<float>& dst = ws[i].layers[l].expert_down[e];
      dst.resize(static_cast<size_t>(H * ei));
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t r = 0; r < ei; ++r) dst[h * ei + r] = slab[(b + r) * H + h];
      }
    }
  });
}

}  // namespace

Result<std::vector<CpuWeights>> LoadCpuWeights(const model::Checkpoint& ck, ThreadPool& pool,
                                               const std::vector<TensorParallelShard>& shards) {
  const model::ModelConfig& c = ck.config();
  const int64_t hd = c.head_dim;
  std::vector<CpuWeights> ws(shards.size());
  try {
    Loader load(ck, pool);
    // Loads `name` into every shard, `part` choosing each one's block, and `dst` its vector.
    auto each = [&](const std::string& name, auto&& part, auto&& dst) {
      for (size_t i = 0; i < shards.size(); ++i) load.Append(name, dst(ws[i]), part(shards[i]));
      load.Done(name);
    };
    auto whole = [](const TensorParallelShard&) { return Part{}; };
    auto q_rows = [&](const TensorParallelShard& s) { return Rows(s.head_begin * hd, s.heads * hd); };
    auto kv_rows = [&](const TensorParallelShard& s) { return Rows(s.kv_head_begin * hd, s.kv_heads * hd); };
    auto q_cols = [&](const TensorParallelShard& s) { return Cols(s.head_begin * hd, s.heads * hd); };
    auto i_rows = [](const TensorParallelShard& s) { return Rows(s.inter_begin, s.inter); };
    auto i_cols = [](const TensorParallelShard& s) { return Cols(s.inter_begin, s.inter); };
    auto v_rows = [](const TensorParallelShard& s) { return Rows(s.vocab_begin, s.vocab); };
    // A bias of a row-parallel product: added once, by rank 0.
    auto once = [](const TensorParallelShard& s) { return s.rank == 0 ? Part{} : Rows(0, 0); };

    each("model.embed_tokens.weight", v_rows, [](CpuWeights& w) { return &w.embed; });
    for (CpuWeights& w : ws) w.layers.resize(c.num_layers);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      auto name = [l](std::string_view s) { return model::LayerTensorName(l, s); };
      auto layer = [l](auto member) { return [l, member](CpuWeights& w) { return &(w.layers[l].*member); }; };
      using L = CpuLayerWeights;
      each(name("input_layernorm.weight"), whole, layer(&L::input_norm));
      each(name("self_attn.q_proj.weight"), q_rows, layer(&L::qkv));
      each(name("self_attn.k_proj.weight"), kv_rows, layer(&L::qkv));
      each(name("self_attn.v_proj.weight"), kv_rows, layer(&L::qkv));
      if (c.attention_bias) {
        each(name("self_attn.q_proj.bias"), q_rows, layer(&L::qkv_bias));
        each(name("self_attn.k_proj.bias"), kv_rows, layer(&L::qkv_bias));
        each(name("self_attn.v_proj.bias"), kv_rows, layer(&L::qkv_bias));
      }
      each(name("self_attn.o_proj.weight"), q_cols, layer(&L::o));
      if (c.attention_out_bias) each(name("self_attn.o_proj.bias"), once, layer(&L::o_bias));
      if (c.qk_norm) {
        each(name("self_attn.q_norm.weight"), whole, layer(&L::q_norm));
        each(name("self_attn.k_norm.weight"), whole, layer(&L::k_norm));
      }
      each(name("post_attention_layernorm.weight"), whole, layer(&L::post_norm));
      auto e_rows = [](const TensorParallelShard& s) { return Rows(s.expert_inter_begin, s.expert_inter); };
      auto e_cols = [](const TensorParallelShard& s) { return Cols(s.expert_inter_begin, s.expert_inter); };
      auto mlp = [&](std::string_view suffix) { return model::MlpTensorName(c, l, suffix); };
      if (c.sparse_layer(l) && c.moe.shared_expert_intermediate > 0) {  // Llama 4
        each(model::RouterTensorName(c, l), whole, layer(&L::router));
        LoadFusedExperts(ck, l, pool, shards, ws);
        load.Done(mlp("experts.gate_up_proj"));
        load.Done(mlp("experts.down_proj"));
        each(mlp("shared_expert.gate_proj.weight"), e_rows, layer(&L::shared_gate_up));
        each(mlp("shared_expert.up_proj.weight"), e_rows, layer(&L::shared_gate_up));
        each(mlp("shared_expert.down_proj.weight"), e_cols, layer(&L::shared_down));
        continue;
      }
      if (c.sparse_layer(l)) {
        each(model::RouterTensorName(c, l), whole, layer(&L::router));
        const auto experts = static_cast<size_t>(c.moe.num_experts);
        for (CpuWeights& w : ws) {
          w.layers[l].expert_gate_up.resize(experts);
          w.layers[l].expert_down.resize(experts);
        }
        for (size_t e = 0; e < experts; ++e) {
          auto gate_up = [l, e](CpuWeights& w) { return &w.layers[l].expert_gate_up[e]; };
          auto down = [l, e](CpuWeights& w) { return &w.layers[l].expert_down[e]; };
          using model::ExpertProj;
          const auto ei = static_cast<int64_t>(e);
          each(model::ExpertTensorName(c, l, ei, ExpertProj::kGate), e_rows, gate_up);
          each(model::ExpertTensorName(c, l, ei, ExpertProj::kUp), e_rows, gate_up);
          each(model::ExpertTensorName(c, l, ei, ExpertProj::kDown), e_cols, down);
        }
        continue;
      }
      each(mlp("gate_proj.weight"), i_rows, layer(&L::gate_up));
      each(mlp("up_proj.weight"), i_rows, layer(&L::gate_up));
      each(mlp("down_proj.weight"), i_cols, layer(&L::down));
      if (c.mlp_bias) {
        each(mlp("gate_proj.bias"), i_rows, layer(&L::gate_up_bias));
        each(mlp("up_proj.bias"), i_rows, layer(&L::gate_up_bias));
        each(mlp("down_proj.bias"), once, layer(&L::down_bias));
      }
    }
    each("model.norm.weight", whole, [](CpuWeights& w) { return &w.final_norm; });
    if (!c.tie_word_embeddings) each("lm_head.weight", v_rows, [](CpuWeights& w) { return &w.lm_head; });
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(ck.dir() + ": not enough memory for the fp32 weights (" +
                             std::to_string(ck.weight_bytes()) + " bytes as stored)");
  }
  return ws;
}

Result<CpuWeights> LoadCpuWeights(const model::Checkpoint& ck, ThreadPool& pool) {
  KVF_ASSIGN_OR_RETURN(std::vector<CpuWeights> ws, LoadCpuWeights(ck, pool, {ShardOf(ck.config(), 1, 0)}));
  return std::move(ws[0]);
}

}  // namespace kvfleet::backend::cpu
