// CudaBackend, forward pass: the embedding, every transformer layer (QKV, RoPE + K/V store,
// paged attention, O, MLP; on the gemv with the fusions of invariant 5; LoRA after each
// targeted product, invariant 7) and the final
// RMSNorm, enqueued on the backend's stream. Thread-compatible, as CudaBackend: the engine
// thread calls it.
#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/gemv.h"
#include "kernels/moe.h"
#include "kernels/paged_attention_generic.h"
#include "kernels/paged_decode.h"
#include "kernels/paged_prefill.h"
#include "kernels/small_kernels.h"
#include "kernels/tensor_parallel.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {
namespace {
using bf16 = __nv_bfloat16;
}  // namespace

Status CudaBackend::Forward(const StepBatch& batch, const StepMeta& m) {
  const model::ModelConfig& c = config_;
  // (8) This rank's heads, KV heads and intermediate columns (the model's at N = 1).
  const int64_t H = c.hidden_size, I = shard_.inter, V = c.vocab_size;
  const int64_t Q = shard_.heads * c.head_dim;
  const int64_t qkv_width = Q + 2 * shard_.kv_heads * c.head_dim;
  const int32_t T = m.num_tokens;
  const int32_t Hi = static_cast<int32_t>(H);
  auto gemm = [&](const bf16* w, const bf16* x, const bf16* bias, bf16* y, int64_t rows_out, int64_t k) {
    if (T <= tuning_.gemv_max_rows) {  // (5)
      return CudaStatus(kernels::LaunchGemv(w, x, bias, y, /*out_f32=*/false, static_cast<int32_t>(rows_out), T,
                                            static_cast<int32_t>(k), stream_),
                        "LaunchGemv");
    }
    return gemm_->Run(w, x, bias, y, LtGemm::Out::kBf16, rows_out, T, k, stream_);
  };
  // The MoE router's product in fp32: the top-k choice is discrete, and bf16's rounding of a
  // logit (0.03 near 8) flips near-tied experts that the model's fp32 reference keeps (9).
  auto gemm_f32 = [&](const bf16* w, const bf16* x, float* y, int64_t rows_out, int64_t k) {
    if (T <= tuning_.gemv_max_rows) {
      return CudaStatus(kernels::LaunchGemv(w, x, nullptr, y, /*out_f32=*/true, static_cast<int32_t>(rows_out), T,
                                            static_cast<int32_t>(k), stream_),
                        "LaunchGemv");
    }
    return gemm_->Run(w, x, nullptr, y, LtGemm::Out::kF32, rows_out, T, k, stream_);
  };
  const float eps = static_cast<float>(c.rms_norm_eps);
  // (5) On the gemv, each RMSNorm is the next product's prologue; the residual stream
  // alternates between resid_ and resid_alt_ (a block of the product writes the sum while
  // the others still read the old one).
  // A LoRA step (7) adds to each product's output before the kernels (5) would fuse in.
  const bool fused_silu = m.lora.num_tiles == 0 && T <= tuning_.gemv_max_rows && tuning_.gemv_fusion >= 1;
  // The gemv's RoPE epilogue takes one frequency row, no per-head norm (Qwen3) and none of
  // Llama 4's q/k transforms (interleaved pairs, L2 norm, NoPE layers' temperature, 11).
  const bool llama4_qk = c.rope_interleaved || c.qk_l2_norm || !c.layer_nope.empty();
  const bool fused_rope = fused_silu && tuning_.gemv_fusion >= 2 && T <= kernels::kGemvRopeKvMaxRows && !c.qk_norm &&
                          !llama4_qk && m.seq_inv_freq == nullptr;
  const bool norm_fits = int64_t{T} * H * 2 <= kernels::kGemvRmsNormMaxXBytes;
  const bool fused_post_norm = fused_silu && tuning_.gemv_fusion >= 3 && norm_fits;  // before gate/up
  const bool fused_norm = fused_post_norm && fused_rope && tuning_.gemv_fusion >= 4;  // before QKV
  bf16* resid = resid_;
  bf16* resid_next = resid_alt_;
  auto norm_gemv = [&](const bf16* x, bool add_residual, const bf16* norm_w, const bf16* w, const bf16* bias, bf16* y,
                       bool silu_mul, int64_t rows_out) -> Status {
    kernels::GemvRmsNorm nrm;
    nrm.x = x;
    nrm.residual_in = add_residual ? resid : nullptr;
    nrm.residual_out = add_residual ? resid_next : nullptr;
    nrm.weight = norm_w;
    nrm.eps = eps;
    KVF_CUDA_RETURN(kernels::LaunchRmsNormGemv(nrm, w, bias, y, silu_mul, static_cast<int32_t>(rows_out), T, Hi,
                                               stream_));
    if (add_residual) std::swap(resid, resid_next);
    return Status::Ok();
  };
  if (comm_ == nullptr) {
    KVF_CUDA_RETURN(kernels::LaunchEmbedding(m.ids, embed_, resid_, T, static_cast<int32_t>(V), Hi, stream_));
  } else {  // (8) vocab-parallel: the rank's rows, zeros elsewhere, summed over the ranks
    KVF_CUDA_RETURN(kernels::LaunchEmbeddingSlice(m.ids, embed_, static_cast<int32_t>(shard_.vocab_begin),
                                                  static_cast<int32_t>(shard_.vocab), resid_, T, Hi, stream_));
    KVF_RETURN_IF_ERROR(AllReduce(resid_, int64_t{T} * H));
  }
  if (!fused_norm) {
    KVF_CUDA_RETURN(kernels::LaunchRmsNorm(resid_, nullptr, layers_[0].input_norm, xn_, T, Hi, eps, stream_));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = layers_[l];
    if (fused_rope) {  // (RMSNorm,) QKV, RoPE and the K/V store in one launch
      kernels::GemvRmsNorm nrm;
      nrm.x = l == 0 ? resid : tmp_;
      nrm.residual_in = l == 0 ? nullptr : resid;
      nrm.residual_out = l == 0 ? nullptr : resid_next;
      nrm.weight = w.input_norm;
      nrm.eps = eps;
      const size_t pi = static_cast<size_t>(layer_pool_[l]);
      kernels::GemvRopeKvStore rope;
      rope.positions = m.positions;
      rope.slots = m.slots[pi];
      rope.inv_freq = inv_freq_;
      rope.q_out = q_;
      rope.kv_pool = KvBf16(pi);
      rope.kv_fp8 = KvFp8(pi);
      rope.scales = LayerKvScales(l);
      rope.layout = PoolLayout(pi);
      rope.layer = layer_index_[l];
      rope.num_q_heads = static_cast<int32_t>(shard_.heads);
      rope.rotate = !pools_[pi].position_shift;
      if (fused_norm) {
        KVF_CUDA_RETURN(kernels::LaunchRmsNormGemvRopeKv(nrm, w.qkv, w.qkv_bias, rope, T, Hi, stream_));
        if (l > 0) std::swap(resid, resid_next);
      } else {
        KVF_CUDA_RETURN(kernels::LaunchGemvRopeKv(w.qkv, xn_, w.qkv_bias, rope, T, Hi, stream_));
      }
    } else {
      KVF_RETURN_IF_ERROR(LoraShrinkAhead(m, l, kLoraQkv, xn_));
      KVF_RETURN_IF_ERROR(gemm(w.qkv, xn_, w.qkv_bias, qkv_, qkv_width, H));
      KVF_RETURN_IF_ERROR(LoraAddToProduct(m, l, kLoraQkv, xn_, qkv_));
    }
    KVF_RETURN_IF_ERROR(Attention(batch, m, l, /*rope_done=*/fused_rope));
    KVF_RETURN_IF_ERROR(LoraShrinkAhead(m, l, kLoraO, attn_));
    KVF_RETURN_IF_ERROR(gemm(w.o, attn_, w.o_bias, tmp_, H, Q));
    KVF_RETURN_IF_ERROR(LoraAddToProduct(m, l, kLoraO, attn_, tmp_));
    KVF_RETURN_IF_ERROR(AllReduce(tmp_, int64_t{T} * H));  // (8) row-parallel: before the RMSNorm reads it
    if (c.sparse_layer(l)) {  // (9) no gemv fusion: the router, the routing and the grouped GEMMs
      KVF_CUDA_RETURN(kernels::LaunchRmsNorm(tmp_, resid, w.post_norm, xn_, T, Hi, eps, stream_));
      KVF_RETURN_IF_ERROR(gemm_f32(w.router, xn_, moe_logits_, moe_router_rows_, H));
      if (w.shared_gate_up != nullptr) {  // Llama 4's shared expert over every token, for MoeBlock's combine
        const int64_t SI = c.moe.shared_expert_intermediate;
        KVF_RETURN_IF_ERROR(gemm(w.shared_gate_up, xn_, nullptr, gate_up_, 2 * SI, H));
        KVF_CUDA_RETURN(kernels::LaunchSiluMul(gate_up_, act_, T, static_cast<int32_t>(SI), stream_));
        KVF_RETURN_IF_ERROR(gemm(w.shared_down, act_, nullptr, moe_shared_, H, SI));
      }
      KVF_RETURN_IF_ERROR(MoeBlock(w, T, !m.all_decode));
    } else if (fused_post_norm) {  // SiLU-mul in the gate/up gemv's epilogue too
      KVF_RETURN_IF_ERROR(norm_gemv(tmp_, true, w.post_norm, w.gate_up, w.gate_up_bias, act_, true, I));
    } else {
      KVF_CUDA_RETURN(kernels::LaunchRmsNorm(tmp_, resid, w.post_norm, xn_, T, Hi, eps, stream_));
      if (fused_silu) {
        KVF_CUDA_RETURN(kernels::LaunchGemvSiluMul(w.gate_up, xn_, w.gate_up_bias, act_, static_cast<int32_t>(I), T,
                                                   Hi, stream_));
      } else {
        KVF_RETURN_IF_ERROR(LoraShrinkAhead(m, l, kLoraGateUp, xn_));
        KVF_RETURN_IF_ERROR(gemm(w.gate_up, xn_, w.gate_up_bias, gate_up_, 2 * I, H));
        KVF_RETURN_IF_ERROR(LoraAddToProduct(m, l, kLoraGateUp, xn_, gate_up_));
        KVF_CUDA_RETURN(kernels::LaunchSiluMul(gate_up_, act_, T, static_cast<int32_t>(I), stream_));
      }
    }
    if (!c.sparse_layer(l)) {
      KVF_RETURN_IF_ERROR(LoraShrinkAhead(m, l, kLoraDown, act_));
      KVF_RETURN_IF_ERROR(gemm(w.down, act_, w.down_bias, tmp_, H, I));
      KVF_RETURN_IF_ERROR(LoraAddToProduct(m, l, kLoraDown, act_, tmp_));
    }
    KVF_RETURN_IF_ERROR(AllReduce(tmp_, int64_t{T} * H));  // (8)
    if (!fused_norm || l + 1 == c.num_layers) {
      const bf16* next_norm = l + 1 < c.num_layers ? layers_[l + 1].input_norm : final_norm_;
      KVF_CUDA_RETURN(kernels::LaunchRmsNorm(tmp_, resid, next_norm, xn_, T, Hi, eps, stream_));
    }
  }
  return Status::Ok();
}

Status CudaBackend::MoeBlock(const LayerWeights& w, int32_t T, bool prompt_rows) {
  const model::MoeConfig& moe = config_.moe;
  const int32_t H = static_cast<int32_t>(config_.hidden_size), EI = static_cast<int32_t>(shard_.expert_inter);
  const int32_t E = static_cast<int32_t>(moe.num_experts), k = static_cast<int32_t>(moe.experts_per_token);
  const int32_t S = T * k;
  // Llama 4 (sigmoid routing): the scores scale the experts' inputs, gathered in grouped order
  // into moe_scaled_; the combine sums the outputs unweighted onto the shared expert's.
  const bool scale_input = moe.sigmoid_routing;
  if (scale_input) {
    KVF_CUDA_RETURN(kernels::LaunchMoeRouteSigmoid(moe_logits_, moe_router_rows_, T, E, k, moe_experts_, moe_weights_,
                                                   stream_));
  } else {
    KVF_CUDA_RETURN(kernels::LaunchMoeRoute(moe_logits_, moe_router_rows_, T, E, k, moe.norm_topk_prob, moe_experts_,
                                            moe_weights_, stream_));
  }
  KVF_CUDA_RETURN(kernels::LaunchMoeGroup(moe_experts_, S, E, moe_sorted_, moe_position_, moe_offsets_,
                                          moe_tile_offsets_, stream_, moe_active_));
  if (scale_input) {
    KVF_CUDA_RETURN(kernels::LaunchMoeGatherScaled(xn_, moe_sorted_, k, moe_weights_, moe_scaled_, S, H, stream_));
  }
  const bf16* x_in = scale_input ? moe_scaled_ : xn_;  // token rows (k routes each), or scaled grouped rows
  const int32_t gather_div = scale_input ? 0 : k;
  auto combine = [&]() -> Status {
    if (scale_input) {
      KVF_CUDA_RETURN(kernels::LaunchMoeCombineAdd(moe_out_, moe_position_, moe_shared_, tmp_, T, k, H, stream_));
    } else {
      KVF_CUDA_RETURN(kernels::LaunchMoeCombine(moe_out_, moe_weights_, moe_position_, tmp_, T, k, H, stream_));
    }
    return Status::Ok();
  };
  if (tuning_.moe_gemv && kernels::MoeUseGemv(T, k, E)) {  // decode: few rows an expert (moe_limits.h)
    KVF_CUDA_RETURN(kernels::LaunchMoeGroupedGemv(w.expert_gate_up, x_in, moe_sorted_, gather_div, moe_offsets_,
                                                  moe_active_, moe_act_, /*silu_mul=*/true, T, S, E, EI, H, stream_));
    KVF_CUDA_RETURN(kernels::LaunchMoeGroupedGemv(w.expert_down, moe_act_, moe_sorted_, /*gather_div=*/0, moe_offsets_,
                                                  moe_active_, moe_out_, /*silu_mul=*/false, T, S, E, H, EI, stream_));
    return combine();
  }
  if (prompt_rows && moe_blas_ != nullptr) {  // never graphed (4): graphs hold decode steps alone
    KVF_RETURN_IF_ERROR(moe_blas_->Products(w.expert_gate_up, w.expert_down, x_in, gather_div, moe_sorted_, moe_offsets_,
                                            moe_scaled_, moe_gate_up_, moe_act_, moe_out_, S, E, EI, H, stream_));
    return combine();
  }
  KVF_CUDA_RETURN(kernels::LaunchMoeGroupedGemm(w.expert_gate_up, x_in, moe_sorted_, gather_div, moe_offsets_,
                                                moe_tile_offsets_, moe_gate_up_, S, E, 2 * EI, H, stream_));
  KVF_CUDA_RETURN(kernels::LaunchSiluMul(moe_gate_up_, moe_act_, S, EI, stream_));
  KVF_CUDA_RETURN(kernels::LaunchMoeGroupedGemm(w.expert_down, moe_act_, moe_sorted_, /*gather_div=*/0, moe_offsets_,
                                                moe_tile_offsets_, moe_out_, S, E, H, EI, stream_));
  return combine();
}

Status CudaBackend::Attention(const StepBatch& batch, const StepMeta& m, int64_t layer, bool rope_done) {
  const model::ModelConfig& c = config_;
  const size_t pi = static_cast<size_t>(layer_pool_[layer]);
  const KvPoolInfo& pool = pools_[pi];
  const kernels::PagedKvLayout layout = PoolLayout(pi);
  const int32_t li = layer_index_[layer];
  const int32_t nh = static_cast<int32_t>(shard_.heads);  // (8)
  const bool shift = pool.position_shift;
  if (!rope_done) {
    const LayerWeights& w = layers_[layer];
    kernels::RopeKvExtras extras;
    extras.q_norm = w.q_norm;
    extras.k_norm = w.k_norm;
    extras.norm_eps = static_cast<float>(c.rms_norm_eps);
    extras.inv_freq_row = m.seq_inv_freq != nullptr ? m.row_seq : nullptr;
    extras.kv_fp8 = KvFp8(pi);
    extras.scales = LayerKvScales(layer);
    // Llama 4 (11): interleaved pairs; RoPE layers L2-normalise q and k after the rotation,
    // NoPE layers rotate nothing and scale q by its position's temperature.
    const bool rope_layer = c.uses_rope(layer);
    extras.interleaved = c.rope_interleaved;
    extras.l2_norm = c.qk_l2_norm && rope_layer;
    if (!rope_layer && c.attn_temperature_tuning) {
      extras.temperature_scale = static_cast<float>(c.attn_scale);
      extras.temperature_floor = static_cast<float>(c.floor_scale);
    }
    const float* inv_freq = m.seq_inv_freq != nullptr ? m.seq_inv_freq : inv_freq_;
    KVF_CUDA_RETURN(kernels::LaunchRopeKvStore(qkv_, m.positions, m.slots[pi], inv_freq, q_, KvBf16(pi), layout,
                                               li, m.num_tokens, nh, /*rotate=*/!shift && rope_layer, extras, stream_));
  }
  kernels::AttentionMask mask;
  mask.window = pool.window;
  mask.sinks = pool.sink_tokens;
  mask.chunk = pool.attention_chunk;
  // StreamingLLM's dense context phase: prompt rows (positions below their sequence's
  // context_end) attend to [0, q] at absolute positions: no window, no sinks (backend.h).
  const kernels::AttentionMask dense_mask{};
  // Per sequence, its leading rows that are dense; none unless the pool has a dense phase.
  std::vector<int32_t>& dense_rows = dense_rows_scratch_;
  dense_rows.assign(batch.seqs.size(), 0);
  bool any_dense = false;
  if (pool.dense_context) {
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const SequenceStep& st = batch.seqs[s];
      const int64_t d = std::clamp<int64_t>(st.context_end - st.start_position, 0,
                                            static_cast<int64_t>(st.tokens.size()));
      dense_rows[s] = static_cast<int32_t>(d);
      any_dense = any_dense || d > 0;
    }
  }
  // yarn's attention_scaling scales the rotated q·k; a NoPE layer (Llama 4) has none.
  const float scale =
      c.uses_rope(layer) ? attention_scale_ : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  // The fields the params of every attention kernel share: q, out and block tables of the
  // launch; the layer's pool, heads, scale and mask.
  auto set_common = [&](auto& p, const bf16* q, bf16* out, const int32_t* tables, int32_t stride,
                        const kernels::AttentionMask& launch_mask) {
    p.q = q;
    p.kv_pool = KvBf16(pi);
    p.kv_fp8 = KvFp8(pi);
    p.scales = LayerKvScales(layer);
    p.block_tables = tables;
    p.out = out;
    p.layout = layout;
    p.layer = li;
    p.num_q_heads = nh;
    p.max_blocks_per_seq = stride;
    p.scale = scale;
    p.mask = launch_mask;
  };

  // Decode-kernel launch over `n` query rows (one per "sequence" of the kernel).
  auto decode = [&](const bf16* q, bf16* out, const int32_t* tables, int32_t stride, const int32_t* lens, int32_t n,
                    int32_t max_len, const kernels::AttentionMask& launch_mask) -> Status {
    kernels::PagedDecodeParams p;
    set_common(p, q, out, tables, stride, launch_mask);
    p.seq_lens = lens;
    p.workspace = decode_workspace_;
    p.rope_inv_freq = shift ? inv_freq_ : nullptr;
    p.num_seqs = n;
    p.max_seq_len = max_len;
    p.partition_size = kernels::PagedDecodeChoosePartition(n, nh, layout.num_kv_heads, max_len, num_sms_);
    while (kernels::PagedDecodeWorkspaceBytes(p) > decode_workspace_bytes_) p.partition_size *= 2;
    KVF_CUDA_RETURN(kernels::LaunchPagedDecode(p, stream_));
    return Status::Ok();
  };
  const size_t qs = static_cast<size_t>(shard_.heads * c.head_dim);
  // Rows [r, r + n) of sequence s as decode queries, each reading the sequence's one table
  // (stride 0), at most max_batch_size per launch.
  auto decode_rows = [&](size_t s, int32_t r_begin, int32_t r_end, const kernels::AttentionMask& launch_mask) {
    for (int32_t r = r_begin; r < r_end; r += options_.max_batch_size) {
      const int32_t n = std::min(options_.max_batch_size, r_end - r);
      const int32_t max_len = m.end_pos[s] - (m.row0[s + 1] - (r + n));
      KVF_RETURN_IF_ERROR(decode(q_ + r * qs, attn_ + r * qs, m.tables[pi] + s * m.table_stride, 0, m.row_lens + r,
                                 n, max_len, launch_mask));
    }
    return Status::Ok();
  };

  // Shapes the tensor-core kernels do not take go through the generic kernel.
  const int32_t hd = pool.head_dim;
  const bool fast = m.all_decode ? (hd == 64 || hd == 128 || hd == 256) : (hd == 64 || hd == 128);
  if (!fast) {
    kernels::GenericAttentionParams g;
    set_common(g, q_, attn_, m.tables[pi], m.table_stride, mask);
    g.token_seq = m.row_seq;
    g.positions = m.positions;
    g.rope_inv_freq = shift ? inv_freq_ : nullptr;
    g.num_tokens = m.num_tokens;
    KVF_CUDA_RETURN(kernels::LaunchGenericAttention(g, stream_));
    // Dense prompt rows again with the dense mask, over what the windowed launch wrote.
    for (size_t s = 0; any_dense && s < batch.seqs.size(); ++s) {
      if (dense_rows[s] == 0) continue;
      const int32_t r = m.row0[s];
      kernels::GenericAttentionParams d = g;
      d.q = q_ + r * qs;
      d.out = attn_ + r * qs;
      d.token_seq = m.row_seq + r;
      d.positions = m.positions + r;
      d.num_tokens = dense_rows[s];
      d.mask = dense_mask;
      KVF_CUDA_RETURN(kernels::LaunchGenericAttention(d, stream_));
    }
    return Status::Ok();
  }
  if (m.all_decode && !any_dense) {
    return decode(q_, attn_, m.tables[pi], m.table_stride, m.seq_lens, m.num_seqs, m.max_seq_len, mask);
  }
  if (shift) {
    // Shifted RoPE is decode-only: every query row of a chunk is its own decode query.
    for (size_t s = 0; s < batch.seqs.size(); ++s) {
      const int32_t dense_end = m.row0[s] + dense_rows[s];
      KVF_RETURN_IF_ERROR(decode_rows(s, m.row0[s], dense_end, dense_mask));
      KVF_RETURN_IF_ERROR(decode_rows(s, dense_end, m.row0[s + 1], mask));
    }
    return Status::Ok();
  }
  // A dense context phase comes with position shift (--streaming-llm), so it never gets here.
  kernels::PagedPrefillParams p;
  set_common(p, q_, attn_, m.tables[pi], m.table_stride, mask);
  p.cu_q_lens = m.cu_q_lens;
  p.seq_lens = m.seq_lens;
  p.num_seqs = m.num_seqs;
  p.max_q_len = m.max_q_len;
  p.workspace = prefill_workspace_;  // split-KV for short chunks over long cached prefixes
  p.workspace_bytes = prefill_workspace_bytes_;
  p.num_sms = num_sms_;
  p.max_seq_len = m.max_seq_len;
  KVF_CUDA_RETURN(kernels::LaunchPagedPrefill(p, stream_));
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
