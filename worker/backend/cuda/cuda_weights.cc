// CudaBackend::LoadWeights: the checkpoint's tensors on the device in bf16 (converted on the
// host when stored otherwise), this rank's shard of each under tensor parallelism (invariant
// 8), the fused [q|k|v] and [gate|up] products assembled from their parts, and the RoPE
// frequencies. Thread-compatible (cuda_backend.h): called once while the backend is built.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/rope.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"
#include "worker/model/checkpoint.h"
#include "worker/model/model_config.h"
#include "worker/model/safetensors.h"

namespace kvfleet::backend::cuda {

using bf16 = __nv_bfloat16;

namespace {

// dst[c][r] = bf16(src[r][c]) of a rows x cols matrix, in square tiles: a plain column walk
// misses the cache on every element (Scout's gate_up_proj rows are 64 KB apart).
void TransposeToBf16(const float* src, int64_t rows, int64_t cols, uint16_t* dst) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) {
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) dst[c * rows + r] = model::F32ToBF16(src[r * cols + c]);
      }
    }
  }
}

}  // namespace

Status CudaBackend::LoadLlama4Experts(const model::Checkpoint& checkpoint, int64_t l, LayerWeights* w) {
  // Llama 4's fused experts are x·W: gate_up_proj [E][hidden][2·ei] (gate columns, then up),
  // down_proj [E][ei][hidden]. The grouped GEMM takes [out][in], so each expert is transposed
  // on the host into expert_gate_up [E][2·ei][hidden] and expert_down [E][hidden][ei].
  const model::ModelConfig& c = config_;
  const int64_t E = c.moe.num_experts, H = c.hidden_size, EI = c.moe.expert_intermediate;
  const model::TensorView& gu = checkpoint.tensor(model::MlpTensorName(c, l, "experts.gate_up_proj"));
  const model::TensorView& dn = checkpoint.tensor(model::MlpTensorName(c, l, "experts.down_proj"));
  const std::string router = model::RouterTensorName(c, l);
  KVF_ASSIGN_OR_RETURN(w->router, DeviceAlloc<bf16>(static_cast<size_t>(moe_router_rows_ * H)));
  KVF_CUDA_RETURN(cudaMemset(w->router, 0, static_cast<size_t>(moe_router_rows_ * H) * sizeof(bf16)));
  std::vector<float> slab(static_cast<size_t>(H * 2 * EI));
  std::vector<uint16_t> out(static_cast<size_t>(H * 2 * EI));
  {  // the router [E][hidden], as stored
    const model::TensorView& r = checkpoint.tensor(router);
    std::vector<float> rf(static_cast<size_t>(E * H));
    model::ConvertToF32(r.dtype, r.bytes.data(), rf.size(), rf.data());
    std::vector<uint16_t> rb(rf.size());
    for (size_t i = 0; i < rf.size(); ++i) rb[i] = model::F32ToBF16(rf[i]);
    KVF_CUDA_RETURN(cudaMemcpy(w->router, rb.data(), rb.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    weight_bytes_ += rb.size() * sizeof(bf16);
  }
  KVF_ASSIGN_OR_RETURN(w->expert_gate_up, DeviceAlloc<bf16>(static_cast<size_t>(E * 2 * EI * H)));
  KVF_ASSIGN_OR_RETURN(w->expert_down, DeviceAlloc<bf16>(static_cast<size_t>(E * H * EI)));
  for (int64_t e = 0; e < E; ++e) {
    model::ConvertToF32(gu.dtype, gu.bytes.data() + e * H * 2 * EI * static_cast<int64_t>(model::DTypeSize(gu.dtype)),
                        slab.size(), slab.data());
    TransposeToBf16(slab.data(), H, 2 * EI, out.data());  // row r: column r of [gate | up]
    KVF_CUDA_RETURN(cudaMemcpy(w->expert_gate_up + e * 2 * EI * H, out.data(), static_cast<size_t>(2 * EI * H) * sizeof(bf16),
                               cudaMemcpyHostToDevice));
    model::ConvertToF32(dn.dtype, dn.bytes.data() + e * EI * H * static_cast<int64_t>(model::DTypeSize(dn.dtype)),
                        static_cast<size_t>(EI * H), slab.data());
    TransposeToBf16(slab.data(), EI, H, out.data());
    KVF_CUDA_RETURN(cudaMemcpy(w->expert_down + e * H * EI, out.data(), static_cast<size_t>(H * EI) * sizeof(bf16),
                               cudaMemcpyHostToDevice));
  }
  weight_bytes_ += static_cast<uint64_t>(E * 3 * EI * H) * sizeof(bf16);
  return Status::Ok();
}

Status CudaBackend::LoadWeights(const model::Checkpoint& checkpoint) {
  const model::ModelConfig& c = config_;
  // (8) This rank's shard: sizes and the row / column ranges it takes of each tensor.
  const TensorParallelShard& sh = shard_;
  const int64_t H = c.hidden_size, I = sh.inter, hd = c.head_dim;
  const int64_t Q = sh.heads * hd, KV = sh.kv_heads * hd;
  const int64_t qkv_rows = Q + 2 * KV;
  vocab_rows_ = sh.ranks == 1 ? c.vocab_size : (c.vocab_size + sh.ranks - 1) / sh.ranks;
  std::vector<uint16_t> converted;  // host bf16 for fp32 / fp16 tensors, and for column slices
  // Copies rows [r0, r0 + nr) and columns [c0, c0 + nc) of tensor `name` (a vector: one
  // column) to dst (bf16), converting on the host when it is not bf16. nr < 0: every row;
  // nc < 0: every column.
  auto upload_block = [&](const std::string& name, bf16* dst, int64_t r0, int64_t nr, int64_t c0,
                          int64_t nc) -> Status {
    const model::TensorView& t = checkpoint.tensor(name);
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    const int64_t cols = rows > 0 ? t.numel() / rows : 0;
    if (nr < 0) nr = rows;
    if (nc < 0) nc = cols;
    const size_t esize = t.dtype == model::DType::kF32 ? 4 : 2;
    converted.resize(static_cast<size_t>(nr * nc));
    for (int64_t i = 0; i < nr; ++i) {
      const std::byte* row = t.bytes.data() + ((r0 + i) * cols + c0) * static_cast<int64_t>(esize);
      uint16_t* out = converted.data() + i * nc;
      if (t.dtype == model::DType::kBF16) {
        std::memcpy(out, row, static_cast<size_t>(nc) * 2);
        continue;
      }
      for (int64_t j = 0; j < nc; ++j) {
        float f;
        if (t.dtype == model::DType::kF32) {
          std::memcpy(&f, row + 4 * j, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, row + 2 * j, 2);
          f = model::F16ToF32(h);
        }
        out[j] = model::F32ToBF16(f);
      }
    }
    KVF_CUDA_RETURN(cudaMemcpy(dst, converted.data(), converted.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    weight_bytes_ += converted.size() * sizeof(bf16);
    return Status::Ok();
  };
  // Copies tensor `name` to dst (bf16), converting on the host when it is not bf16.
  auto upload = [&](const std::string& name, bf16* dst) -> Status {
    const model::TensorView& t = checkpoint.tensor(name);
    const size_t n = static_cast<size_t>(t.numel());
    const void* src = t.bytes.data();
    if (t.dtype != model::DType::kBF16) {
      converted.resize(n);
      const std::byte* raw = t.bytes.data();
      for (size_t i = 0; i < n; ++i) {
        float f;
        if (t.dtype == model::DType::kF32) {
          std::memcpy(&f, raw + 4 * i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, raw + 2 * i, 2);
          f = model::F16ToF32(h);
        }
        converted[i] = model::F32ToBF16(f);
      }
      src = converted.data();
    }
    KVF_CUDA_RETURN(cudaMemcpy(dst, src, n * sizeof(bf16), cudaMemcpyHostToDevice));
    weight_bytes_ += n * sizeof(bf16);
    return Status::Ok();
  };
  model::LoadProgress progress(checkpoint.specs().size(), checkpoint.weight_bytes());
  // Whole, or the block of `part` ({r0, nr, c0, nc} as upload_block takes them).
  struct Part {
    int64_t r0 = 0, nr = -1, c0 = 0, nc = -1;
  };
  auto upload_part = [&](const std::string& name, bf16* dst, const Part& p) -> Status {
    const model::TensorView& t = checkpoint.tensor(name);
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    const int64_t cols = rows > 0 ? t.numel() / rows : 0;
    const bool whole = p.r0 == 0 && (p.nr < 0 || p.nr == rows) && p.c0 == 0 && (p.nc < 0 || p.nc == cols);
    return whole ? upload(name, dst) : upload_block(name, dst, p.r0, p.nr, p.c0, p.nc);
  };
  auto part_elems = [&](const std::string& name, const Part& p) {
    const model::TensorView& t = checkpoint.tensor(name);
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    const int64_t cols = rows > 0 ? t.numel() / rows : 0;
    return (p.nr < 0 ? rows : p.nr) * (p.nc < 0 ? cols : p.nc);
  };
  auto load = [&](const std::string& name, int64_t count, bf16** out, Part part = {}) -> Status {
    KVF_ASSIGN_OR_RETURN(*out, DeviceAlloc<bf16>(static_cast<size_t>(count)));
    KVF_RETURN_IF_ERROR(upload_part(name, *out, part));
    progress.Add(1, checkpoint.tensor(name).bytes.size());
    return Status::Ok();
  };
  // Stacks several tensors (each its part) into one allocation of `rows` rows of `cols`.
  auto stack = [&](std::initializer_list<std::pair<std::string, Part>> names, int64_t rows, int64_t cols,
                   bf16** out) -> Status {
    KVF_ASSIGN_OR_RETURN(*out, DeviceAlloc<bf16>(static_cast<size_t>(rows * cols)));
    bf16* at = *out;
    for (const auto& [n, part] : names) {
      KVF_RETURN_IF_ERROR(upload_part(n, at, part));
      at += part_elems(n, part);
      progress.Add(1, checkpoint.tensor(n).bytes.size());
    }
    return Status::Ok();
  };
  const Part q_rows{sh.head_begin * hd, Q, 0, -1}, kv_rows{sh.kv_head_begin * hd, KV, 0, -1};
  const Part i_rows{sh.inter_begin, I, 0, -1}, q_cols{0, -1, sh.head_begin * hd, Q}, i_cols{0, -1, sh.inter_begin, I};
  // The vocab slice, in an allocation of vocab_rows_ rows (the padding rows stay zero).
  auto load_vocab = [&](const std::string& name, bf16** out) -> Status {
    KVF_ASSIGN_OR_RETURN(*out, DeviceAlloc<bf16>(static_cast<size_t>(vocab_rows_ * H)));
    if (sh.vocab < vocab_rows_) KVF_CUDA_RETURN(cudaMemset(*out, 0, static_cast<size_t>(vocab_rows_ * H) * sizeof(bf16)));
    if (sh.vocab > 0) KVF_RETURN_IF_ERROR(upload_part(name, *out, Part{sh.vocab_begin, sh.vocab, 0, -1}));
    progress.Add(1, checkpoint.tensor(name).bytes.size());
    return Status::Ok();
  };
  const bool bias_rank = sh.rank == 0;  // a row-parallel product's bias is added once

  moe_router_rows_ = static_cast<int32_t>((c.moe.num_experts + 7) / 8 * 8);  // (9) 16-byte rows of logits
  KVF_RETURN_IF_ERROR(load_vocab("model.embed_tokens.weight", &embed_));
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[l];
    auto name = [l](std::string_view s) { return model::LayerTensorName(l, s); };
    KVF_RETURN_IF_ERROR(load(name("input_layernorm.weight"), H, &w.input_norm));
    KVF_RETURN_IF_ERROR(stack({{name("self_attn.q_proj.weight"), q_rows},
                               {name("self_attn.k_proj.weight"), kv_rows},
                               {name("self_attn.v_proj.weight"), kv_rows}},
                              qkv_rows, H, &w.qkv));
    if (c.attention_bias) {
      KVF_RETURN_IF_ERROR(stack({{name("self_attn.q_proj.bias"), q_rows},
                                 {name("self_attn.k_proj.bias"), kv_rows},
                                 {name("self_attn.v_proj.bias"), kv_rows}},
                                qkv_rows, 1, &w.qkv_bias));
    }
    KVF_RETURN_IF_ERROR(load(name("self_attn.o_proj.weight"), H * Q, &w.o, q_cols));
    if (c.attention_out_bias && bias_rank) KVF_RETURN_IF_ERROR(load(name("self_attn.o_proj.bias"), H, &w.o_bias));
    if (c.qk_norm) {
      KVF_RETURN_IF_ERROR(load(name("self_attn.q_norm.weight"), c.head_dim, &w.q_norm));
      KVF_RETURN_IF_ERROR(load(name("self_attn.k_norm.weight"), c.head_dim, &w.k_norm));
    }
    KVF_RETURN_IF_ERROR(load(name("post_attention_layernorm.weight"), H, &w.post_norm));
    if (c.sparse_layer(l) && c.architecture == model::Architecture::kLlama4) {  // (9) one GPU (Make refuses N > 1)
      KVF_RETURN_IF_ERROR(LoadLlama4Experts(checkpoint, l, &w));
      const int64_t SI = c.moe.shared_expert_intermediate;
      auto mlp = [&](std::string_view s) { return model::MlpTensorName(c, l, s); };
      KVF_RETURN_IF_ERROR(stack({{mlp("shared_expert.gate_proj.weight"), Part{}}, {mlp("shared_expert.up_proj.weight"), Part{}}},
                                2 * SI, H, &w.shared_gate_up));
      KVF_RETURN_IF_ERROR(load(mlp("shared_expert.down_proj.weight"), H * SI, &w.shared_down));
      for (const char* fused : {"experts.gate_up_proj", "experts.down_proj", "router.weight"}) {
        progress.Add(1, checkpoint.tensor(mlp(fused)).bytes.size());
      }
      continue;
    }
    if (c.sparse_layer(l)) {  // (9) the router whole, each expert's slice of its intermediate size
      const int64_t E = c.moe.num_experts, EI = sh.expert_inter;
      const Part e_rows{sh.expert_inter_begin, EI, 0, -1}, e_cols{0, -1, sh.expert_inter_begin, EI};
      KVF_ASSIGN_OR_RETURN(w.router, DeviceAlloc<bf16>(static_cast<size_t>(moe_router_rows_ * H)));
      KVF_CUDA_RETURN(cudaMemset(w.router, 0, static_cast<size_t>(moe_router_rows_ * H) * sizeof(bf16)));
      KVF_RETURN_IF_ERROR(upload(model::RouterTensorName(c, l), w.router));
      progress.Add(1, checkpoint.tensor(model::RouterTensorName(c, l)).bytes.size());
      KVF_ASSIGN_OR_RETURN(w.expert_gate_up, DeviceAlloc<bf16>(static_cast<size_t>(E * 2 * EI * H)));
      KVF_ASSIGN_OR_RETURN(w.expert_down, DeviceAlloc<bf16>(static_cast<size_t>(E * H * EI)));
      for (int64_t e = 0; e < E; ++e) {
        using model::ExpertProj;
        const std::string gate = model::ExpertTensorName(c, l, e, ExpertProj::kGate);
        const std::string up = model::ExpertTensorName(c, l, e, ExpertProj::kUp);
        const std::string down = model::ExpertTensorName(c, l, e, ExpertProj::kDown);
        KVF_RETURN_IF_ERROR(upload_part(gate, w.expert_gate_up + e * 2 * EI * H, e_rows));
        KVF_RETURN_IF_ERROR(upload_part(up, w.expert_gate_up + (e * 2 + 1) * EI * H, e_rows));
        KVF_RETURN_IF_ERROR(upload_part(down, w.expert_down + e * H * EI, e_cols));
        for (const std::string* n : {&gate, &up, &down}) progress.Add(1, checkpoint.tensor(*n).bytes.size());
      }
      continue;
    }
    // Llama 4's dense layers are feed_forward.* (intermediate_size_mlp), the others' mlp.*.
    auto mlp = [&](std::string_view s) { return model::MlpTensorName(c, l, s); };
    KVF_RETURN_IF_ERROR(
        stack({{mlp("gate_proj.weight"), i_rows}, {mlp("up_proj.weight"), i_rows}}, 2 * I, H, &w.gate_up));
    KVF_RETURN_IF_ERROR(load(mlp("down_proj.weight"), H * I, &w.down, i_cols));
    if (c.mlp_bias) {
      KVF_RETURN_IF_ERROR(
          stack({{mlp("gate_proj.bias"), i_rows}, {mlp("up_proj.bias"), i_rows}}, 2 * I, 1, &w.gate_up_bias));
      if (bias_rank) KVF_RETURN_IF_ERROR(load(mlp("down_proj.bias"), H, &w.down_bias));
    }
  }
  KVF_RETURN_IF_ERROR(load("model.norm.weight", H, &final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    KVF_RETURN_IF_ERROR(load_vocab("lm_head.weight", &lm_head_));
  }

  // RoPE frequencies, as the cpu backend takes them (kernels/rope.h). HF scales cos and sin
  // by attention_scaling (yarn), which scales every score by its square.
  inv_freq_host_ = kernels::RopeInvFreq(rope_);
  const double rope_scale = kernels::RopeAttentionScaling(rope_);
  attention_scale_ = static_cast<float>(rope_scale * rope_scale / std::sqrt(static_cast<double>(c.head_dim)));
  KVF_ASSIGN_OR_RETURN(inv_freq_, DeviceAlloc<float>(inv_freq_host_.size()));
  KVF_CUDA_RETURN(cudaMemcpy(inv_freq_, inv_freq_host_.data(), inv_freq_host_.size() * sizeof(float),
                             cudaMemcpyHostToDevice));
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
