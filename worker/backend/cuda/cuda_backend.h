// CudaBackend: the `cuda` model backend, the bf16 forward pass of the Llama family
// (Llama 2/3/3.x, Qwen2, Qwen3, Mistral, the MoE Mixtral and Qwen3-MoE: invariant 9, and Llama
// 4's text model: 11) on one GPU over the paged KV layout of backend.h.
//
// One step, all on one stream:
//   upload the step's metadata (token ids, positions, KV slots, block tables, sampling
//   settings: one packed host-to-device copy from pinned memory)
//   → embedding → per layer [RMSNorm (fused with the residual add) → QKV GEMM (Qwen2 bias
//   in the cuBLASLt epilogue) → RoPE fused with the K/V store into the pool (Qwen3's per-head
//   q/k RMSNorm first, in the same kernel; frequencies from kernels/rope.h, per sequence for
//   dynamic NTK scaling, and yarn's cos/sin scaling folded into the softmax scale) → paged
//   attention (decode kernel when every sequence brings one token, prefill kernel
//   otherwise; StreamingLLM pools always through the decode kernel, one query row per
//   token) → O GEMM → RMSNorm + residual → gate/up GEMM → SiLU·mul → down GEMM]
//   → final RMSNorm → gather the rows that need logits → LM head GEMM (fp32 out)
//   → sampling kernel (constrained rows: their allowed-token bitmasks, filled by the engine
//   while the GPU runs the step up to here and uploaded just before it, 10) → copy the tokens
//   (and requested logits) back.
//   On the gemv (few token rows, 5), RoPE + K/V store, the post-attention RMSNorm and
//   SiLU·mul run inside the QKV and gate/up products; the kernels launch with PDL (6).
//
// Weights: every tensor of the checkpoint goes to the device as bf16 (fp32 and fp16
// checkpoints are converted on the host while uploading); q/k/v and gate/up are stacked
// into one matrix each. KV memory: bf16 pools per kv::ComputePools, sized by
// BackendOptions::kv_cache_bytes or kv_memory_fraction of the free memory once weights
// and activations are allocated; the host tier is pinned memory. Every buffer is
// allocated at start-up, sized for max_num_tokens / max_batch_size / max_context.
//
// Numerics: bf16 storage, fp32 accumulation (GEMMs, norms, attention), each op rounded to
// bf16 as HF transformers does in a bf16 model; logits in fp32. Sampling uses the GPU
// kernel (kernels/sampling.h): greedy is exact argmax, seeded draws are reproducible on
// this backend but differ from the cpu backend's sampler.
//
// Invariants:
//   1. Execute() validates the whole batch before launching anything.
//   2. No buffer allocation after Make(). Created once per shape, on first use: cuBLASLt
//      plans (host objects, per GEMM shape) and decode graphs (per bucket, see 4).
//   3. Execute() returns after the step's work on the stream is complete.
//   4. CUDA graphs: a step where every sequence decodes one token, samples and asks for no
//      logits is padded to a bucket (batch: the next power of two up to max_batch_size;
//      length: the next power of two from kMinGraphLength up to max_context) and, from the
//      second step of that bucket on, replayed as one captured graph (metadata upload,
//      forward, sampling, tokens back; with a masked row, up to the logits: 10). Padding
//      rows compute a token at position 0, read block 0 and write no KV.
//      BackendOptions::extra["cuda_graphs"] = "0" turns this off.
//   5. A matrix product over at most gemv_max_rows token rows (decode at small batch, the
//      LM head of few sequences) runs on the skinny GEMM kernel (kernels/gemv.h), others on
//      cuBLASLt; both accumulate in fp32 and round once. BackendOptions::extra
//      ["gemv_max_rows"] sets the bound (0: cuBLASLt always; at most kernels::kGemvMaxRows).
//      On the gemv, neighbouring kernels fold into the products (same roundings), by
//      extra["gemv_fusion"] level: 1 SiLU-mul into the gate/up epilogue; 2 also RoPE + the K/V
//      store into the QKV epilogue; 3 (default) also the post-attention RMSNorm (+ residual)
//      into the gate/up prologue; 4 also the input RMSNorm into the QKV prologue. Measured on
//      an H100, llama-3.1-8b batch 1 @1K: 0 5.92, 1 5.89, 2 5.86, 3 5.80, 4 5.92 ms a step
//      (the QKV prologue, every block of one wave normalising the same row at once, costs more
//      than the launch it saves).
//   6. kvfleet's own kernels other than the prefill attention launch with programmatic
//      dependent launch (kernels/launch.h): each may start while the one before it finishes
//      and waits for it before touching activations; CUDA graphs keep these edges.
//      BackendOptions::extra["pdl"] = "0" turns it off for the whole process (a process-wide
//      kernel setting).
//   7. LoRA (max_loras > 0, cuda_lora.cc): each slot holds one adapter in bf16, every layer's
//      targets in the fused products' groups ([q|k|v], o, [gate|up], down) zero-padded to
//      max_lora_rank (rounded up to 8); LoadLora converts on the host and copies on its own
//      stream, and the next step waits for that copy. A step where some sequence names a slot
//      adds scaling·(x·Aᵀ)·Bᵀ after each group's product (kernels/lora.h: one shrink and one
//      expand launch per group over every slot of the step; the shrink reads only x, so it
//      runs on a side stream forked before the product and joined before the expand, which
//      keeps it off the step's critical path), without the gemv fusions of (5):
//      q, k, v need the adapter before RoPE and the K/V store, gate and up before SiLU·mul.
//      Its decode steps take graphs (4) too, keyed also by the groups it launches: the row
//      groups sit at staging offsets fixed by the padded batch, the tile height follows the
//      padded batch and the tiles are padded to ceil(T / tile) + slots (empty tiles do
//      nothing). Steps without an adapter take exactly the path of (4)-(6).
//      BackendOptions::extra["lora_tile_rows"] fixes the kernels' tile height (cuda_tuning.h;
//      default kernels::LoraTileRowsFor).
//   8. Tensor parallelism (BackendOptions::tensor_parallel N > 1, cuda_tensor_parallel.cc): N
//      CudaBackend ranks, this object rank 0 and the engine's, ranks 1..N-1 its peers_, each
//      on its own thread (RankThreads; rank 0 the engine thread), device, stream, cuBLASLt
//      handle, CUDA graphs and weights shard (tensor_parallel.h: q/k/v and gate/up
//      column-parallel, o and down row-parallel with their biases on rank 0, the embedding and
//      LM head vocab-parallel). Every rank runs the whole step on the same batch: the
//      embedding and the o and down products are summed over the ranks (CudaComm::AllReduceSum)
//      before anything reads them, so the RMSNorm + residual fusions of (5) stay after the
//      all-reduce; the LM head's vocab slices are gathered (AllGather) into every rank's
//      logits_, and every rank samples the same tokens (rank 0's go out). Each rank's KV pools
//      hold its KV heads of the same block ids, so the engine's one KV manager and
//      block_copier() (which copies on every rank) serve them all; --kv-cache-bytes is per
//      GPU. extra["tp_devices"] ("0,0": every rank on GPU 0, the same-device communicator,
//      for tests) places the ranks; by default rank r takes device + r, over NCCL. N = 1 has
//      no communicator and no threads: the path of (1)-(7). LoRA and an fp8 KV cache are
//      refused at N > 1.
//   9. Mixtures of experts (model::MoeConfig; kernels/moe.h): an MoE layer's MLP is the router
//      product (fp32 logits from bf16 operands: top-k is discrete, and rounding a logit to bf16
//      flips experts within 0.03 of each other that the fp32 reference keeps), a routing kernel (fp32 softmax,
//      top-k, renormalisation), a device-side grouping of the step's T·k routes by expert, one
//      grouped tensor-core GEMM for every expert's gate/up and one for down over those groups,
//      SiLU·mul between, and the weighted un-permute into the layer's output. No host sync and
//      no launch whose shape depends on the routing (grids are sized by T·k), so decode graphs
//      (4) capture it unchanged. Decode steps of few rows an expert take the expert gemv
//      instead (moe_limits.h); steps with prompt tokens (never graphed) take cuBLAS's grouped
//      GEMM (moe_blas.h: one host sync for the group sizes), 1.3-1.9x faster at 512-4096 rows. Tensor parallelism splits every expert's intermediate size
//      like the dense MLP's (the router is whole on each rank). The gemv fusions (5) and LoRA
//      (7) do not apply to MoE layers; LoRA is refused for MoE models.
//  10. Constrained decoding: a row's token bitmask (SequenceStep::token_bitmask, or a late one
//      from StepBatch::fill_token_bitmask) is written into its pinned staging row after the
//      step's forward pass and LM head are queued, so the engine fills masks while the GPU
//      computes the logits; the rows then go up in one copy on a copy stream (overlapping
//      what remains of that work) and the sampling kernel, which waits for it, applies them
//      in its first pass over the row (kernels/sampling.h). A graphed step (4) with a
//      masked row replays a graph of its bucket that ends at the logits (keyed apart), then
//      copies and samples outside it; a step without one keeps the whole-step graph. At N > 1
//      (8) the late masks are filled once, before the step, for every rank (no overlap).
//  11. Llama 4 (model/llama4_config.h), on one GPU (--tensor-parallel > 1, an fp8 KV cache and
//      --streaming-llm are refused at start-up, naming the option; LoRA as for any MoE, 9): the
//      QKV product runs unfused (no gemv RoPE epilogue, 5), then LaunchRopeKvStore with Llama 4's
//      extras (kernels/small_kernels.h): RoPE layers rotate interleaved pairs and L2-normalise q
//      and k after, NoPE layers store q and K unrotated with q scaled by its position's
//      temperature. Chunked attention per layer comes from the pools (kv::ComputePools keys them by
//      chunk: the RoPE layers' masks by it, the NoPE layers' attends globally). MoE layers (9) route
//      by sigmoid (top-k by logit, weights bf16(sigmoid), not normalised), scale each route's input
//      by its weight (LaunchMoeGatherScaled), and the combine adds the unweighted expert sum to the
//      shared expert's output, computed over every token before the block (LaunchMoeCombineAdd);
//      fused experts (x·W) are transposed at load. Dense layers: Llama's MLP, intermediate_size_mlp.
//
// Thread safety: thread-compatible (backend.h); the engine thread calls it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/lora.h"
#include "kernels/paged_kv.h"
#include "kernels/rope.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cuda_comm.h"
#include "worker/backend/cuda/cuda_block_copier.h"
#include "worker/backend/cuda/cuda_tuning.h"
#include "worker/backend/cuda/lt_gemm.h"
#include "worker/backend/cuda/moe_blas.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/kv/kv_config.h"
#include "worker/model/checkpoint.h"

namespace kvfleet::backend::cuda {

namespace config {
// Rows of fp32 logits the LM head writes at once. Sampled rows (one per sequence, at
// most max_batch_size) must fit together; extra rows (LogitsRequest::kAll) go in chunks.
constexpr int64_t kMinLogitsRows = 64;
// Device memory left out of the KV budget when it is a fraction of free memory: the CUDA
// context's later growth, cuBLASLt's internal allocations.
constexpr uint64_t kReserveBytes = 512ull << 20;
// Smallest sequence-length bucket of a decode graph (the decode kernel's partition unit).
constexpr int32_t kMinGraphLength = 128;
// Alignment of every array in the step's metadata staging buffer (16 bytes: vector loads in
// kernels).
constexpr size_t kStagingAlign = 16;
// First capacity of the logit-adjustment buffers (16 bytes an entry): a few penalised
// sequences of some thousand distinct tokens each before the first growth.
constexpr size_t kMinAdjustEntries = 16384;
// Each half of the KV transfer's pinned staging: large enough that a copy's fixed cost is
// small beside its bytes, small enough to overlap a host memcpy of one half with the DMA of
// the other. 8 MiB = two llama-3.1-8b blocks of 32 tokens.
constexpr size_t kTransferStagingBytes = 8ull << 20;
// Peer KV pools mapped at once (CUDA IPC); each maps a peer's whole pool into the address space.
constexpr size_t kMaxPeerMappings = 32;
}  // namespace config

class CudaBackend final : public ModelBackendBase {
 public:
  // Opens and validates the checkpoint, uploads the weights, allocates every buffer and
  // the KV pools. Unimplemented for tensor_parallel > 1 or head_dim not a multiple of 16
  // up to 256 (64 and 128 run on the tensor-core kernels, others on the generic one).
  static Result<std::unique_ptr<CudaBackend>> Make(const BackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  std::string device_id() const override { return device_uuid_; }  // rank 0's GPU
  Status Execute(const StepBatch& batch, StepOutput* out) override;
  kv::BlockCopier& block_copier() override { return rank_copier_ != nullptr ? *rank_copier_ : *copier_; }
  int32_t max_loras() const override { return options_.max_loras; }
  bool applies_token_bitmask() const override { return true; }
  // (7) REQUIRES: no step in flight (Execute has returned).
  Status LoadLora(int32_t slot, const model::LoraAdapter& adapter) override;
  // KV transfer (Contract 4, cuda_kv_transfer.cc): whole bf16 blocks through the pinned
  // transfer staging, ordered after the steps and copies already on the stream; the written
  // blocks are on the device when WriteKvBlocks returns. Not with an fp8 cache or N > 1 (8).
  KvTransferFormat kv_transfer_format() const override;
  Status ReadKvBlocks(uint32_t pool, std::span<const kv::BlockLocation> blocks, std::span<std::byte> out) override;
  Status WriteKvBlocks(uint32_t pool, std::span<const BlockId> blocks, std::span<const std::byte> in) override;
  Status WriteKvBlocksFrom(uint32_t pool, std::span<const BlockId> blocks,
                           std::span<const std::span<const std::byte>> in) override;
  // CUDA IPC: each pool's cudaIpcMemHandle_t; a peer's pools are mapped on first use and kept
  // (config::kMaxPeerMappings, the oldest unmapped first).
  std::vector<std::string> ExportKvDevice() override;
  Status CopyKvBlocksFromPeer(uint32_t pool, const std::string& handle, std::span<const BlockId> src,
                              std::span<const BlockId> dst) override;
  // NCCL point-to-point (cuda_kv_nccl.h): this backend's device pools, after its stream.
  Result<std::unique_ptr<KvNccl>> MakeKvNccl(std::function<void()> on_done) override;

  const kv::KvCacheConfig& kv_cache_config() const { return kv_config_; }
  // --kv-cache-dtype fp8: the pools hold e4m3 (kernels/paged_kv.h).
  bool kv_fp8() const { return kv_fp8_; }
  // fp8: the dequantisation scales, [layer][K, V][num_kv_heads] (empty for bf16), fixed
  // from start-up on (cached blocks are reused, so they never change), and where they came
  // from: "checkpoint" or "calibrated" (cuda_kv_scales.cc).
  std::span<const float> kv_scales() const { return kv_scales_host_; }
  const std::string& kv_scales_source() const { return kv_scales_source_; }
  // Bytes of weights on the device (rank 0's shard with tensor parallelism).
  uint64_t weight_bytes() const { return weight_bytes_; }

  // Ablation and profiling of LoRA steps (cuda_backend_bench --lora-ablation); not for serving.
  struct LoraDebug {
    // false: a LoRA step keeps its path (eager, unfused, its rows grouped and uploaded) but
    // launches no shrink or expand, so its tokens are the base model's.
    bool launch_kernels = true;
    // true: CUDA events around every shrink and expand (they cost the PDL overlap between
    // them); LoRA steps then run eagerly. Read with TakeLoraKernelTimes.
    bool time_kernels = false;
    // false: the expands (or the shrinks) are left out, the rest of the path kept; the bench
    // separates what each adds to a graphed step. The tokens are then wrong.
    bool launch_expand = true;
    bool launch_shrink = true;
  };
  void set_lora_debug(const LoraDebug& d) { lora_debug_ = d; }
  // Turns decode graphs (4) on or off from the next step on (extra["cuda_graphs"] at start).
  void set_use_graphs(bool on) {
    tuning_.use_graphs = on;
    for (auto& p : peers_) p->tuning_.use_graphs = on;  // (8)
  }
  // Decode graphs (4) captured so far.
  size_t graphs_captured() const { return graphs_.size(); }
  struct LoraKernelTimes {
    std::array<double, 4> shrink_ms = {}, expand_ms = {};  // [LoraGroup: qkv, o, gate_up, down]
    int64_t launches = 0;                                   // shrink + expand pairs timed
  };
  // The kernel time of every pair timed since the last call; synchronises the stream.
  Result<LoraKernelTimes> TakeLoraKernelTimes();

  // Tensor parallelism (8): ranks, and the communicator's kind ("nccl", "same-device"; "" at N = 1).
  int32_t tensor_parallel() const { return shard_.ranks; }
  const char* comm_kind() const { return comm_ != nullptr ? comm_->kind() : ""; }
  // Ablation and timing of the collectives (cuda_backend_bench); not for serving.
  struct CommDebug {
    // false: the all-reduces and the gather are skipped (wrong numbers, the step's time
    // without its collectives).
    bool run_collectives = true;
    // true: CUDA events around every collective on rank 0's stream; steps then run eagerly.
    bool time_collectives = false;
  };
  void set_comm_debug(const CommDebug& d);
  struct CommTimes {
    double all_reduce_ms = 0, gather_ms = 0;  // summed over the collectives timed
    int64_t all_reduces = 0, gathers = 0;
  };
  // Rank 0's collective time since the last call; synchronises its stream.
  Result<CommTimes> TakeCommTimes();

 private:
  struct LayerWeights {
    __nv_bfloat16 *input_norm = nullptr, *qkv = nullptr, *qkv_bias = nullptr, *o = nullptr, *o_bias = nullptr;
    __nv_bfloat16 *q_norm = nullptr, *k_norm = nullptr;  // [head_dim], Qwen3 only
    __nv_bfloat16 *post_norm = nullptr, *gate_up = nullptr, *gate_up_bias = nullptr, *down = nullptr,
                  *down_bias = nullptr;
    // An MoE layer (9) has these instead of gate_up and down. ei: the rank's slice of an
    // expert's intermediate size; router rows padded with zeros to moe_router_rows_.
    __nv_bfloat16 *router = nullptr;          // [moe_router_rows_][hidden]
    __nv_bfloat16 *expert_gate_up = nullptr;  // [experts][2·ei][hidden]: each expert's gate rows, then up rows
    __nv_bfloat16 *expert_down = nullptr;     // [experts][hidden][ei]
    // Llama 4's shared expert (9), a SwiGLU MLP of si = shared_expert_intermediate over every token.
    __nv_bfloat16 *shared_gate_up = nullptr;  // [2·si][hidden]: gate rows, then up rows
    __nv_bfloat16 *shared_down = nullptr;     // [hidden][si]
  };
  // One step as the kernels see it: its shape, and device pointers into the packed staging
  // buffer (valid once UploadMeta's copy has run on the stream). T: token rows, S: sequences
  // (padding included in graph mode).
  struct StepMeta {
    bool graph = false;           // replayed as the captured graph of its bucket (4)
    int32_t bucket_len = 0;       // graph mode: the length bucket
    size_t staging_used = 0;      // bytes of the staging buffer in use
    int32_t num_tokens = 0, num_seqs = 0;
    bool all_decode = false;      // every sequence brings exactly one token
    int32_t max_q_len = 0;        // longest chunk of the step
    int32_t max_seq_len = 0;      // longest sequence end of the step
    int32_t table_stride = 0;     // block-table entries per sequence in this step
    const int32_t* ids = nullptr;        // [T]
    const int32_t* positions = nullptr;  // [T]
    const int32_t* row_lens = nullptr;   // [T] position + 1
    const int32_t* row_seq = nullptr;    // [T] sequence of each row
    std::vector<const int32_t*> slots;   // [pool] → [T]
    std::vector<const int32_t*> tables;  // [pool] → [S][table_stride]
    const int32_t* cu_q_lens = nullptr;  // [S + 1]
    const int32_t* seq_lens = nullptr;   // [S]
    std::vector<int32_t> row0;           // host: first row of each sequence, [S + 1]
    std::vector<int32_t> end_pos;        // host: [S] sequence end positions
    // Rows that need logits: part A, the last row of each sequence that samples or asks for
    // logits (sampled together); part B, the other rows of kAll sequences (in chunks).
    std::vector<int32_t> part_a_seq;                  // host: sequences of part A rows
    std::vector<std::pair<int32_t, int32_t>> part_b;  // host: (sequence, row) of part B rows
    const int32_t* head_rows = nullptr;  // [part A + part B] row of each, part A first
    // Dynamic NTK scaling only: each sequence's RoPE frequencies at its length after the
    // step (row_seq picks a token's row); null otherwise (inv_freq_ serves every token).
    const float* seq_inv_freq = nullptr;  // [S][head_dim / 2]
    // Sampling settings, [part A].
    const float* temperature = nullptr;
    const int32_t* top_k = nullptr;
    const float* top_p = nullptr;
    const uint64_t* seed = nullptr;
    const uint64_t* rng_counter = nullptr;
    const float* min_p = nullptr;        // [part A]
    const int32_t* logprobs = nullptr;   // [part A]: -1 none, else top entries
    bool want_logprobs = false;          // some part A row asks (never in a graphed step)
    // Logit adjustments of part A (never in a graphed step): adjust_begin [part A + 1] in the
    // staging buffer, the entries (adjust_scratch_) uploaded to adjust_dev_ by UploadMeta.
    const int32_t* adjust_begin = nullptr;
    int32_t adjust_entries = 0;
    // Constrained decoding (10): allowed_rows [part A] in the staging buffer (1: row a samples
    // among allowed_dev_[a]); the masked_rows' masks are written into allowed_host_ once the
    // logits are queued, and its first allowed_upload rows go up before the sampling kernel.
    const int32_t* allowed_rows = nullptr;
    std::vector<int32_t> masked_rows;  // host: part A rows with a mask, ascending
    int32_t allowed_upload = 0;
    // Prompt logprobs: part B rows whose next prompt token's logprob is asked for.
    std::vector<int32_t> part_b_target;  // host: [part B] the token, -1: none (logits only)
    std::vector<uint8_t> part_b_logits;  // host: [part B] 1: its logits go out (kAll)
    const int32_t* part_b_target_dev = nullptr;  // [part B]
    int32_t prompt_top = 0;              // top entries of prompt rows (the largest asked)
    // LoRA (7): the rows of sequences with a slot, grouped and tiled; num_tiles 0: none.
    kernels::LoraGroups lora;
    std::array<bool, 4> lora_groups = {};  // [LoraGroup]: some slot of the step targets it
  };
  // LoRA targets as the fused products take them (7).
  enum LoraGroup : int { kLoraQkv, kLoraO, kLoraGateUp, kLoraDown, kNumLoraGroups };
  // One group of one layer, every slot: a [max_loras][segments · R][in], b [max_loras][out][R].
  struct LoraGroupSlots {
    __nv_bfloat16 *a = nullptr, *b = nullptr;
    int32_t in = 0, out = 0, segments = 1;
    int32_t seg_end[kernels::kLoraMaxSegments] = {0, 0, 0};
  };

  explicit CudaBackend(const BackendOptions& options);
  Status Validate(const StepBatch& batch) const;
  Status LoadWeights(const model::Checkpoint& checkpoint);
  // Llama 4's router and fused experts of layer l into w, transposed to [out][in] (9).
  Status LoadLlama4Experts(const model::Checkpoint& checkpoint, int64_t l, LayerWeights* w);
  Status AllocateBuffers();
  Status AllocateKv(uint64_t free_after_buffers);
  // LoRA (cuda_lora.cc): the slots, their stream and staging (7); none when max_loras == 0.
  Status AllocateLora();
  // Packs the step's LoRA row groups (PackStep's part).
  void PackLora(const StepBatch& batch, StepMeta* m, std::byte* host, std::byte* dev, size_t* used);
  // y[:, 0, out) += the step's adapters' share of group g of layer l, x its input.
  // A targeted product y = x·Wᵀ becomes LoraShrinkAhead(x) (before the product: the shrink runs
  // on lora_side_ alongside it), the product, then LoraAddToProduct(x, y) (joins the shrink and
  // launches the expand into y). With lora_debug_.time_kernels both run in the second, timed.
  Status LoraShrinkAhead(const StepMeta& m, int64_t layer, LoraGroup g, const __nv_bfloat16* x);
  Status LoraAddToProduct(const StepMeta& m, int64_t layer, LoraGroup g, const __nv_bfloat16* x, __nv_bfloat16* y);
  bool LoraRuns(const StepMeta& m, LoraGroup g) const;
  kernels::LoraShrinkParams LoraShrinkFor(const StepMeta& m, int64_t layer, LoraGroup g, const __nv_bfloat16* x) const;
  kernels::LoraExpandParams LoraExpandFor(const StepMeta& m, int64_t layer, LoraGroup g, __nv_bfloat16* y) const;
  kernels::PagedKvLayout PoolLayout(size_t pool) const;
  // fp8 (cuda_kv_scales.cc): the scales from the checkpoint's k_scale / v_scale tensors when
  // it has them, else from a calibration forward; then uploads them.
  Status SetUpKvScales(const model::Checkpoint& checkpoint);
  Status CalibrateKvScales();
  // The pools as the kernels read them now: e4m3 unless calibrating (then bf16).
  bool KvFp8Now() const { return kv_fp8_ && !kv_calibrating_; }
  __nv_bfloat16* KvBf16(size_t pool) const {
    return KvFp8Now() ? nullptr : static_cast<__nv_bfloat16*>(device_kv_[pool]);
  }
  uint8_t* KvFp8(size_t pool) const { return KvFp8Now() ? static_cast<uint8_t*>(device_kv_[pool]) : nullptr; }
  kernels::KvScales LayerKvScales(int64_t layer) const;

  // The parts of a step (Execute). Packing (cuda_batch.cc): the step's shape and metadata
  // into the pinned staging buffer, and its upload.
  void PackStep(const StepBatch& batch, StepMeta* m);
  Status UploadMeta(const StepMeta& m);
  // Everything from the metadata upload to the sampled tokens' copy back; with m.graph, as
  // the bucket's graph (captured on its second step; a constrained step's graph ends at the
  // logits, 10).
  Status EnqueueStep(const StepBatch& batch, const StepMeta& m);
  Status EnqueueGraphed(const StepBatch& batch, const StepMeta& m);
  // EnqueueStep's parts: the metadata upload, the forward pass and part A's logits (LM head);
  // then (10) the masked rows' bitmasks, filled on the host (FillStepTokenBitmask, straight
  // into allowed_host_) while the GPU runs those, and uploaded; then the sampling kernel and
  // the tokens' copy back (Sample).
  Status EnqueueLogits(const StepBatch& batch, const StepMeta& m);
  Status FillAndUploadMasks(const StepBatch& batch, const StepMeta& m);
  // The forward pass (cuda_forward.cc): embedding, layers, final RMSNorm into xn_.
  Status Forward(const StepBatch& batch, const StepMeta& m);
  // RoPE + K/V store (unless rope_done: the QKV gemv's epilogue did it), then attention.
  Status Attention(const StepBatch& batch, const StepMeta& m, int64_t layer, bool rope_done);
  // (9) Layer w's MoE block over T rows: xn_ in, tmp_ out (this rank's partial sum). With
  // sigmoid routing (Llama 4) the shared expert's output must be in moe_shared_ already.
  Status MoeBlock(const LayerWeights& w, int32_t T, bool prompt_rows);
  // Sampling and outputs (cuda_sampling.cc). Sizes out's tokens and logits; returns the
  // rows of logits it holds.
  int64_t ShapeOutput(const StepBatch& batch, const StepMeta& m, StepOutput* out) const;
  // logits_[0, n) = LM head of the rows_dev rows of xn_.
  Status LmHead(const StepMeta& m, const int32_t* rows_dev, int32_t n);
  // The sampling kernel over part A's logits and the tokens' (and logprobs') copy back.
  Status Sample(const StepMeta& m);
  // Grows the logit-adjustment buffers to hold n entries (cuda_backend.cc).
  Status ReserveAdjust(size_t n);
  // The logprob outputs of `rows` rows, copied to their pinned mirrors (asynchronously).
  Status CopyLogprobsBack(int32_t rows);
  // One row's logprobs from the pinned mirrors (after the copy completed).
  TokenLogprobs LogprobsOfRow(int32_t row, TokenId token, int32_t top) const;
  // Waits for the step (3), fills out with its tokens and logits (part B rows computed here,
  // in chunks of logits_rows_).
  Status CollectOutput(const StepBatch& batch, const StepMeta& m, int64_t out_rows, StepOutput* out);

  // A device allocation owned by the backend (freed in the destructor): `bytes` (at least 1),
  // and count elements of T through it.
  Result<void*> DeviceAllocBytes(size_t bytes);
  template <typename T>
  Result<T*> DeviceAlloc(size_t count) {
    Result<void*> p = DeviceAllocBytes(count * sizeof(T));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }

  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LtGemm> gemm_;
  std::vector<void*> allocations_;       // device
  std::vector<void*> host_allocations_;  // pinned

  // Weights.
  __nv_bfloat16* embed_ = nullptr;  // [vocab][hidden]
  __nv_bfloat16* final_norm_ = nullptr;
  __nv_bfloat16* lm_head_ = nullptr;  // [vocab][hidden]; == embed_ when tied
  std::vector<LayerWeights> layers_;
  float* inv_freq_ = nullptr;  // [head_dim / 2]
  kernels::RopeConfig rope_;          // the model's RoPE (kernels/rope.h)
  std::vector<float> inv_freq_host_;  // [head_dim / 2]: inv_freq_'s values
  float attention_scale_ = 0;         // softmax scale: yarn's attention_scaling² / sqrt(head_dim)
  uint64_t weight_bytes_ = 0;

  // KV.
  kv::KvCacheConfig kv_config_;
  std::vector<int32_t> layer_pool_, layer_index_;  // [layer] → pool, index within it
  std::vector<int32_t> dense_rows_scratch_;         // Attention: [seq] its dense context rows
  std::vector<void*> device_kv_;                    // [pool]: bf16, or e4m3 with kv_fp8_
  bool kv_fp8_ = false;
  std::string device_uuid_;  // rank 0's GPU, GpuUuid: what workers sharing it announce
  bool kv_calibrating_ = false;      // the calibration forward: fp8 pools read as bf16
  float* kv_scales_ = nullptr;       // device [layer][K, V][num_kv_heads], with kv_fp8_
  std::vector<float> kv_scales_host_;
  std::string kv_scales_source_;
  std::unique_ptr<CudaBlockCopier> copier_;
  std::vector<std::byte*> host_kv_;  // [pool]: the pinned host tier, or null without one
  // KV transfer staging (cuda_kv_transfer.cc): two pinned halves of
  // config::kTransferStagingBytes, one filled while the other is copied; an event per half.
  std::array<std::byte*, 2> transfer_staging_ = {};
  std::array<cudaEvent_t, 2> transfer_done_ = {};
  std::optional<std::vector<std::string>> ipc_handles_;  // [pool]: ExportKvDevice's; empty: it failed
  std::vector<std::pair<std::string, void*>> peer_kv_;  // a peer pool's handle and its mapping, oldest first

  // Activations, [max_num_tokens][...] bf16.
  __nv_bfloat16 *resid_ = nullptr, *xn_ = nullptr, *tmp_ = nullptr, *qkv_ = nullptr, *q_ = nullptr,
                *attn_ = nullptr, *gate_up_ = nullptr, *act_ = nullptr, *head_in_ = nullptr;
  __nv_bfloat16* resid_alt_ = nullptr;  // [min(max_num_tokens, kGemvMaxRows)][hidden]: (5)
  // (9) MoE scratch, S = max_num_tokens · experts_per_token routes; null for a dense model.
  int32_t moe_router_rows_ = 0;               // experts rounded up to 8 (16-byte rows of logits)
  float* moe_logits_ = nullptr;               // [max_num_tokens][moe_router_rows_], fp32: routing is discrete
  int32_t *moe_experts_ = nullptr, *moe_sorted_ = nullptr, *moe_position_ = nullptr;  // [S]
  int32_t *moe_offsets_ = nullptr, *moe_tile_offsets_ = nullptr;                      // [experts + 1]
  int32_t* moe_active_ = nullptr;             // [experts + 1]: the non-empty groups (kernels/moe.h)
  std::unique_ptr<MoeBlas> moe_blas_;         // steps with prompt tokens (tuning_.moe_blas)
  float* moe_weights_ = nullptr;              // [S]
  __nv_bfloat16 *moe_gate_up_ = nullptr, *moe_act_ = nullptr, *moe_out_ = nullptr;  // [S][2·ei], [S][ei], [S][hidden]
  // Llama 4 (sigmoid routing, 9): the routed rows scaled by their scores, [S][hidden], and the
  // shared expert's output, [max_num_tokens][hidden]; null otherwise.
  __nv_bfloat16 *moe_scaled_ = nullptr, *moe_shared_ = nullptr;
  float* logits_ = nullptr;  // [logits_rows_][vocab]
  int64_t logits_rows_ = 0;
  float* decode_workspace_ = nullptr;
  size_t decode_workspace_bytes_ = 0;
  float* prefill_workspace_ = nullptr;
  size_t prefill_workspace_bytes_ = 0;
  // Step metadata: pinned host staging and its device mirror, one copy per step.
  std::byte* staging_host_ = nullptr;
  std::byte* staging_dev_ = nullptr;
  size_t staging_bytes_ = 0;
  int32_t* tokens_host_ = nullptr;  // pinned [max_batch_size]: sampled tokens
  int32_t* tokens_dev_ = nullptr;
  float* logits_host_ = nullptr;    // pinned [logits_rows_][vocab]
  // Logprobs out of the sampling and logprobs kernels, [logits_rows_] rows (device, pinned).
  float *lp_token_dev_ = nullptr, *lp_token_host_ = nullptr;
  int32_t *lp_top_tok_dev_ = nullptr, *lp_top_tok_host_ = nullptr;  // [rows][kMaxTopLogprobs]
  float *lp_top_val_dev_ = nullptr, *lp_top_val_host_ = nullptr;    // [rows][kMaxTopLogprobs]
  // Logit adjustments of a step (penalties, logit_bias): built on the host, uploaded when
  // there are any; the buffers grow by doubling (superseded ones are freed with the backend).
  std::vector<kernels::LogitAdjust> adjust_scratch_, adjust_row_;
  kernels::LogitAdjust* adjust_host_ = nullptr;  // pinned [adjust_capacity_]
  kernels::LogitAdjust* adjust_dev_ = nullptr;   // [adjust_capacity_]
  float* adjust_raw_dev_ = nullptr;              // [adjust_capacity_] the kernel's scratch
  size_t adjust_capacity_ = 0;
  // Allowed-token bitmasks of a step's part A rows, [max_batch_size][allowed_words_].
  uint32_t* allowed_host_ = nullptr;  // pinned
  uint32_t* allowed_dev_ = nullptr;
  int32_t allowed_words_ = 0;
  // (10) Their upload, off the step's stream once the host has filled them.
  cudaStream_t mask_stream_ = nullptr;
  cudaEvent_t masks_uploaded_ = nullptr;
  // (8, 10) At N > 1: the late masks of a step, filled before it on the engine thread.
  std::vector<uint32_t> tp_masks_;

  // Decode graphs by (padded batch, length bucket) (4); buckets seen once, not yet captured.
  CudaTuning tuning_;  // graphs (4), gemv rows and fusion (5), MoE paths (9): cuda_tuning.h
  // (padded batch, length bucket, mask of the LoRA groups the step launches (7)).
  using GraphKey = std::tuple<int32_t, int32_t, int32_t>;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::set<GraphKey> graph_seen_;

  // LoRA slots (7).
  int32_t lora_rank_ = 0;                                              // R: max_lora_rank rounded up to 8
  std::vector<std::array<LoraGroupSlots, kNumLoraGroups>> lora_;       // [layer]
  std::vector<int32_t> lora_slot_rank_;                                // [slot] 0: empty
  std::vector<float> lora_slot_scaling_;                               // [slot]
  std::vector<std::array<bool, kNumLoraGroups>> lora_slot_groups_;     // [slot] groups it targets
  int32_t* lora_slot_rank_dev_ = nullptr;                              // [slot]
  float* lora_slot_scaling_dev_ = nullptr;                             // [slot]
  float* lora_t_ = nullptr;  // the shrink's partial sums: LoraShrinkScratchFloats(max_num_tokens, 3R)
  int32_t* lora_counters_ = nullptr;  // the shrink's split counters: kLoraShrinkTargetBlocks, zero between launches
  cudaStream_t lora_stream_ = nullptr;                                 // LoadLora's copies
  cudaEvent_t lora_ready_ = nullptr;                                   // recorded after them
  cudaStream_t lora_side_ = nullptr;  // the shrinks, forked from stream_ before each targeted product
  cudaEvent_t lora_fork_ = nullptr;   // stream_ -> lora_side_ (x ready)
  cudaEvent_t lora_join_ = nullptr;   // lora_side_ -> stream_ (t ready)
  bool lora_pending_ = false;                                          // the next step waits for it
  std::array<uint16_t*, 2> lora_pinned_ = {};                          // conversion buffers, in turn
  std::array<cudaEvent_t, 2> lora_pinned_free_ = {};                   // their copies done
  LoraDebug lora_debug_;
  // time_kernels: three events per timed pair (before the shrink, between, after the expand),
  // created as needed; lora_timed_ holds (group, first event) of each pair since the last take.
  std::vector<cudaEvent_t> lora_events_;
  std::vector<std::pair<int, size_t>> lora_timed_;
  size_t lora_pinned_elems_ = 0;

  // ---- Tensor parallelism (8), cuda_tensor_parallel.cc ----
  // Make's part per rank: stream, cuBLASLt, the weights shard, the activation buffers.
  Status InitRank(const model::Checkpoint& checkpoint);
  // Rank 0 at N > 1: the peers (InitRank each), after rank 0's own InitRank, and the
  // communicator over every rank.
  Status MakePeers(const model::Checkpoint& checkpoint, std::span<const int> devices);
  // Device bytes the KV pools may take on this rank's GPU (the least over the ranks, a GPU's
  // free memory split between the ranks on it).
  Result<uint64_t> FreeForKv() const;
  // Allocates this rank's part of each pool (its KV heads) and its block copier.
  Status AllocateKvPools(const std::vector<kv::PoolLayout>& layouts);
  // Rank 0 at N > 1, after the KV pools: the rank threads and the copier over every rank's pools.
  Status StartRanks();
  // Rank 0's Execute after validation at N > 1: the late masks (10), then RunStep on every rank.
  Status RunRanks(const StepBatch& batch, StepOutput* out);
  // Execute after validation, on this rank (its own thread at N > 1).
  Status RunStep(const StepBatch& batch, StepOutput* out);
  // buf[0, count) summed over the ranks (8); nothing at N = 1.
  Status AllReduce(__nv_bfloat16* buf, int64_t count);
  // Runs `collective`, between CUDA events when comm_debug_.time_collectives (rank 0 only).
  Status TimedCollective(bool gather, const std::function<Status()>& collective);
  // logits_[0, n) from this rank's LM head slice (vocab_local_), gathered over the ranks.
  Status GatherLogits(int32_t n);
  // This rank's KV heads of a pool's block.
  int32_t RankKvHeads(const KvPoolInfo& pool) const {
    return static_cast<int32_t>(pool.num_kv_heads * shard_.kv_heads / config_.num_kv_heads);
  }
  TensorParallelShard shard_;            // this rank's part; the whole model at N = 1
  int64_t vocab_rows_ = 0;               // embed_ and lm_head_ rows: the vocab slice padded to ceil(V / N)
  CudaComm* comm_ = nullptr;             // null at N = 1; owned by rank 0
  std::unique_ptr<CudaComm> owned_comm_;                // rank 0
  std::vector<std::unique_ptr<CudaBackend>> peers_;     // rank 0: ranks 1..N-1
  std::unique_ptr<RankThreads> rank_threads_;           // rank 0
  std::unique_ptr<kv::BlockCopier> rank_copier_;        // rank 0: copies on every rank
  float* vocab_local_ = nullptr;     // [logits_rows_][vocab_rows_]: this rank's LM head slice
  float* vocab_gathered_ = nullptr;  // [N][logits_rows_][vocab_rows_]
  CommDebug comm_debug_;
  std::vector<cudaEvent_t> comm_events_;            // time_collectives: two per collective, reused
  std::vector<std::pair<bool, size_t>> comm_timed_;  // (is a gather, first event) since the last take
};

}  // namespace kvfleet::backend::cuda
