// The sparse mixture-of-experts MLP of the cpu backend, as transformers' Mixtral and
// Qwen3-MoE compute it (model::MoeConfig has the math): each token's router logits, a
// softmax over the experts in fp32, its top k, renormalised when norm_topk_prob; then each
// expert runs once over the tokens routed to it (rows gathered, SwiGLU, down projection),
// and its outputs, scaled by their routing weights, are added into the tokens' rows in
// expert order, as HF's index_add_ loop does.
//
// Llama 4 (MoeConfig::sigmoid_routing): the top k by logit, each scored sigmoid(logit); an
// expert's rows are scaled by their scores before it runs and added unscaled, and the shared
// expert's output over every token is added first (modeling_llama4.py's Llama4TextMoe).
//
// Under tensor parallelism each rank holds a slice of every expert's intermediate size
// (tensor_parallel.h) and the router whole: every rank routes alike, and its partial outputs
// sum to the block's output over the ranks.
//
// Thread safety: pure functions over caller-owned scratch; the products split their rows
// over the given pool.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/backend/cpu/cpu_weights.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend::cpu {

// Routes T tokens from their router logits: experts[t][j] and weights[t][j] for j < k are
// token t's chosen experts by descending probability (ties: the lower expert id first) and
// their weights (the softmax probabilities, divided by their sum when `normalize`).
//   logits: [T][E]; experts: [T][k]; weights: [T][k]. REQUIRES: 1 <= k <= E.
void RouteTopK(const float* logits, int64_t T, int64_t E, int64_t k, bool normalize, int32_t* experts,
               float* weights);

// Llama 4's routing: experts[t][j] for j < k are token t's k largest logits, descending (ties:
// the lower expert id first), and weights[t][j] = sigmoid(logit) of each. Shapes as RouteTopK.
void RouteTopKSigmoid(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* experts, float* weights);

// Buffers MoeMlp reuses from call to call.
struct MoeScratch {
  std::vector<float> logits;     // [T][E]
  std::vector<int32_t> experts;  // [T][k]
  std::vector<float> weights;    // [T][k]
  std::vector<int64_t> offsets;  // [E + 1]: expert e's routes are slots [offsets[e], offsets[e+1])
  std::vector<int64_t> slots;    // [T·k]: route slots (t·k + j), grouped by expert, tokens ascending
  std::vector<float> rows;       // [n][H]: the tokens routed to one expert
  std::vector<float> gate_up;    // [n][2·I]
  std::vector<float> act;        // [n][I]
  std::vector<float> down;       // [n][H]
};

// out[t] = Σ_j weights[t][j] · expert_{experts[t][j]}(x[t]): layer lw's MoE block over T rows
// (Llama 4: shared(x[t]) + Σ_j expert_{experts[t][j]}(weights[t][j] · x[t])).
//   x: [T][H]; out: [T][H] (overwritten); lw.router: [E][H], lw.expert_gate_up[e]: [2·I][H],
//   lw.expert_down[e]: [H][I], with I the rank's slice of an expert's intermediate size;
//   Llama 4: lw.shared_gate_up [2·I][H], lw.shared_down [H][I].
void MoeMlp(ThreadPool& pool, const model::MoeConfig& moe, const CpuLayerWeights& lw, const float* x, int64_t T,
            int64_t H, int64_t I, MoeScratch* s, float* out);

}  // namespace kvfleet::backend::cpu
