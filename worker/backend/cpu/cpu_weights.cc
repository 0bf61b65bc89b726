#include "worker/backend/cpu/cpu_weights.h"

#include <algorithm>
#include <new>

namespace kvfleet::backend::cpu {
namespace {

// Elements per conversion work item: large enough to amortize scheduling.
constexpr int64_t kConvertChunk = 1 << 18;

class Loader {
 public:
  Loader(const model::Checkpoint& ck, ThreadPool& pool)
      : ck_(ck), pool_(pool), progress_(ck.specs().size(), ck.weight_bytes()) {}

  // Appends the named tensor, converted to fp32, to `dst`.
  void Append(const std::string& name, std::vector<float>* dst) {
    const model::TensorView& t = ck_.tensor(name);
    const int64_t n = t.numel();
    const size_t at = dst->size();
    dst->resize(at + static_cast<size_t>(n));
    float* out = dst->data() + at;
    const size_t esize = model::DTypeSize(t.dtype);
    const int64_t chunks = (n + kConvertChunk - 1) / kConvertChunk;
    pool_.ParallelFor(chunks, [&](int64_t c) {
      const int64_t b = c * kConvertChunk, e = std::min(n, b + kConvertChunk);
      model::ConvertToF32(t.dtype, t.bytes.data() + b * esize, static_cast<size_t>(e - b), out + b);
    });
    progress_.Add(1, t.bytes.size());
  }

 private:
  const model::Checkpoint& ck_;
  ThreadPool& pool_;
  model::LoadProgress progress_;
};

}  // namespace

Result<CpuWeights> LoadCpuWeights(const model::Checkpoint& ck, ThreadPool& pool) {
  const model::ModelConfig& c = ck.config();
  CpuWeights w;
  try {
    Loader load(ck, pool);
    load.Append("model.embed_tokens.weight", &w.embed);
    w.layers.resize(c.num_layers);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      CpuLayerWeights& lw = w.layers[l];
      auto name = [l](std::string_view s) { return model::LayerTensorName(l, s); };
      load.Append(name("input_layernorm.weight"), &lw.input_norm);
      load.Append(name("self_attn.q_proj.weight"), &lw.qkv);
      load.Append(name("self_attn.k_proj.weight"), &lw.qkv);
      load.Append(name("self_attn.v_proj.weight"), &lw.qkv);
      if (c.attention_bias) {
        load.Append(name("self_attn.q_proj.bias"), &lw.qkv_bias);
        load.Append(name("self_attn.k_proj.bias"), &lw.qkv_bias);
        load.Append(name("self_attn.v_proj.bias"), &lw.qkv_bias);
      }
      load.Append(name("self_attn.o_proj.weight"), &lw.o);
      if (c.attention_out_bias) load.Append(name("self_attn.o_proj.bias"), &lw.o_bias);
      if (c.qk_norm) {
        load.Append(name("self_attn.q_norm.weight"), &lw.q_norm);
        load.Append(name("self_attn.k_norm.weight"), &lw.k_norm);
      }
      load.Append(name("post_attention_layernorm.weight"), &lw.post_norm);
      load.Append(name("mlp.gate_proj.weight"), &lw.gate_up);
      load.Append(name("mlp.up_proj.weight"), &lw.gate_up);
      load.Append(name("mlp.down_proj.weight"), &lw.down);
      if (c.mlp_bias) {
        load.Append(name("mlp.gate_proj.bias"), &lw.gate_up_bias);
        load.Append(name("mlp.up_proj.bias"), &lw.gate_up_bias);
        load.Append(name("mlp.down_proj.bias"), &lw.down_bias);
      }
    }
    load.Append("model.norm.weight", &w.final_norm);
    if (!c.tie_word_embeddings) load.Append("lm_head.weight", &w.lm_head);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(ck.dir() + ": not enough memory for the fp32 weights (" +
                             std::to_string(ck.weight_bytes()) + " bytes as stored)");
  }
  return w;
}

}  // namespace kvfleet::backend::cpu
