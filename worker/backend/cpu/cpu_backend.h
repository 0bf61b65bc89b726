// CpuBackend: the `cpu` model backend, an fp32 reference forward pass of the Llama family
// (Llama 2/3/3.x, Qwen2, Qwen3, Mistral, Mixtral, Qwen3-MoE, Llama 4's text model) over the
// paged KV layout of backend.h. Llama 4's pieces: cpu_qk.h (NoPE layers, interleaved RoPE,
// the L2 q/k norm, temperature tuning), cpu_moe.h (sigmoid routing, the shared expert),
// cpu_weights.h (fused experts) and per-layer chunks through the KV pools.
//
// One step: embeddings → per layer [RMSNorm → QKV (+bias) → Qwen3's per-head q/k RMSNorm →
// RoPE (none on Llama 4's NoPE layers) (kernels/rope.h; dynamic NTK per sequence, at its length after the step) → write K/V into the
// sequence's blocks → attention through the block tables (GQA/MQA, sliding window,
// sinks with position shift, chunked attention) → o_proj → residual → RMSNorm → SwiGLU
// MLP → residual] → final RMSNorm → LM head for the rows that need logits → sampler.
// Matrix products split output rows, attention splits (sequence, head, query rows) over a
// std::thread pool. KV memory is fp32 and lives in host memory, so the "device" tier and
// the host tier are both plain arrays and block copies are memcpy.
//
// Tensor parallelism (options.tensor_parallel = N > 1): N ranks, each a thread (RankGroup)
// with its own pool of threads / N (at least 1) threads, its shard of the weights
// (tensor_parallel.h: Megatron's column-parallel QKV and gate/up, row-parallel o and down,
// vocab-parallel embedding and LM head) and its own KV arenas holding only its KV heads,
// under the same block ids. o and down are each followed by RankGroup::AllReduce, the LM
// head by a gather of the vocab slices; sampling runs on the engine thread. The engine
// still sees one backend: one set of pools (pools() describes the whole model, as the KV
// manager counts blocks), one block copier (copying a block copies it on every rank). With
// replicated KV heads (fewer KV heads than ranks) the arenas hold N / kv_heads copies, so
// KV memory is that many times kv_cache_bytes. N = 1 runs the one rank on the engine thread,
// with no group and no collectives.
//
// LoRA: options.max_loras slots, each an fp32 copy of an adapter (LoadLora). A sequence
// whose lora_slot is set adds scaling·B·(A·x) (LoraAddRow) to each targeted projection's
// output, after the base product and its bias, before q/k norms and RoPE; sequences of
// different slots and of the base model share a step. Under tensor parallelism each rank
// holds B's rows of its outputs for column-parallel targets and A's columns of its inputs
// for row-parallel ones (o, down), whose partial deltas the all-reduce sums with the product.
//
// Thread safety: thread-compatible (backend.h); the engine thread calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/backend/backend.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/backend/cpu/cpu_kernels.h"
#include "worker/backend/cpu/cpu_weights.h"
#include "worker/backend/cpu/rank_group.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/kv_config.h"

namespace kvfleet::backend::cpu {

namespace config {
// KV memory when BackendOptions::kv_cache_bytes is 0: 512 MiB holds 32k tokens of the
// tiny model or 2.8k tokens of SmolLM2-135M in fp32, plenty for tests, small for a laptop.
constexpr uint64_t kDefaultKvBytes = 512ull << 20;
// Query rows per attention work item: long prefill chunks split across threads.
constexpr int64_t kAttentionRowsPerTask = 16;
}  // namespace config

class CpuBackend final : public ModelBackendBase {
 public:
  // Opens and validates the checkpoint, converts the weights, allocates the KV pools.
  static Result<std::unique_ptr<CpuBackend>> Make(const BackendOptions& options);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  bool applies_token_bitmask() const override { return true; }
  Status Execute(const StepBatch& batch, StepOutput* out) override;
  kv::BlockCopier& block_copier() override { return *copier_; }
  int32_t max_loras() const override { return options_.max_loras; }
  Status LoadLora(int32_t slot, const model::LoraAdapter& adapter) override;
  // KV transfer (cpu_kv_transfer.cc): fp32 blocks of one rank; several ranks cannot.
  KvTransferFormat kv_transfer_format() const override;
  Status ReadKvBlocks(uint32_t pool, std::span<const kv::BlockLocation> blocks, std::span<std::byte> out) override;
  Status WriteKvBlocks(uint32_t pool, std::span<const BlockId> blocks, std::span<const std::byte> in) override;

  // The KV cache configuration the pools were computed from (kv::ComputePools); a KV
  // manager built from it has the same pools.
  const kv::KvCacheConfig& kv_cache_config() const { return kv_config_; }
  // Threads over every rank.
  int threads() const;
  int tensor_parallel() const { return static_cast<int>(ranks_.size()); }

 private:
  struct Row;   // one token of the step: sequence, position, destination of its logits
  struct Rank;  // one tensor-parallel rank: its shard, KV arenas, threads and scratch
  class RankCopier;
  explicit CpuBackend(const BackendOptions& options);
  // Computes the KV pools (kv_config_, pools_, the layer map) and allocates every rank's
  // arenas and the block copier. REQUIRES: config_, max_context_ and ranks_ are set.
  Status AllocateKv();
  Status Validate(const StepBatch& batch) const;
  // The step's rows, which of them need logits, their RoPE angles, and logits_ sized.
  void PrepareStep(const StepBatch& batch);
  // Samples, logprobs and requested logits from logits_ into *out; a late token bitmask is
  // filled here (FillStepTokenBitmask), after the forward pass.
  Status CollectOutputs(const StepBatch& batch, StepOutput* out);
  // Rank `rk`'s forward pass of the step PrepareStep prepared: the logits of its vocab slice
  // into logits_ (gathered through the rank's own buffer when there are several ranks).
  void Forward(const StepBatch& batch, Rank& rk);
  void Embed(const StepBatch& batch, Rank& rk);          // rk.x: the tokens' embeddings
  void Layer(const StepBatch& batch, int64_t l, Rank& rk);  // one decoder layer, rk.x in place
  void LmHead(Rank& rk);                                  // the final norm and the LM head
  // Sums v over the ranks (nothing with one rank).
  void AllReduce(Rank& rk, std::vector<float>& v);
  // Writes the step's K/V of layer `layer` into the sequences' blocks.
  void WriteKv(const StepBatch& batch, int64_t layer, Rank& rk);
  // WriteKv, then attention through the block tables into rk.attn.
  void Attention(const StepBatch& batch, int64_t layer, Rank& rk);
  // Floats from a rank's block start to layer li's K (or V) of its KV head g.
  int64_t KvOffset(int64_t li, int64_t g, bool v, const Rank& rk) const;
  // y[r] += the LoRA delta of target t (the rank's shard of it) for each row r whose
  // sequence has an adapter slot with that target. x: [T][x_stride] (the projection's input),
  // y: [T][y_stride] with the target's output at column y_offset.
  void AddLora(const StepBatch& batch, int64_t layer, model::LoraTarget t, Rank& rk, const float* x,
               int64_t x_stride, float* y, int64_t y_stride, int64_t y_offset);

  std::vector<std::unique_ptr<Rank>> ranks_;  // [tensor_parallel]
  std::unique_ptr<RankGroup> group_;          // null with one rank
  std::unique_ptr<Rope> rope_;
  kv::KvCacheConfig kv_config_;
  std::vector<int32_t> layer_pool_;   // [layer] → pool
  std::vector<int32_t> layer_index_;  // [layer] → index of the layer within its pool
  std::unique_ptr<kv::BlockCopier> copier_;
  Sampler sampler_;
  std::vector<kernels::LogitAdjust> adjust_;  // the sampled row's (scratch)
  std::vector<uint32_t> mask_;                // the sampled row's token bitmask (scratch)
  std::vector<bool> lora_loaded_;             // [max_loras]: the slot holds an adapter

  // Per-step data every rank reads, reused across steps. T = tokens in the step.
  std::vector<Row> rows_;
  int32_t logit_rows_ = 0;
  bool step_has_lora_ = false;
  std::vector<float> cos_, sin_;  // [T][head_dim / 2]
  std::vector<std::vector<float>> seq_inv_freq_;  // [sequences][head_dim / 2]: dynamic NTK only
  std::vector<float> logits_; // [rows needing logits][vocab]
};

}  // namespace kvfleet::backend::cpu
