// ModelBackend: the one interface between the engine and a model implementation.
//
// Three implementations: `cpu` (fp32 reference, worker/backend/cpu), `mock` (a cost
// model, no math, worker/backend/mock) and `cuda` (bf16, worker/backend/cuda). The
// worker binary picks one by name through CreateBackend().
//
// What each side owns:
//   - The backend owns the model weights and ALL KV memory: device blocks and, when
//     asked for, host (secondary tier) blocks. It reports each pool's geometry; the KV
//     cache manager (worker/kv) decides which block ids a sequence uses and moves whole
//     blocks between slots and tiers through the backend's kv::BlockCopier.
//   - The engine owns requests, scheduling, stop conditions and the per-request RNG
//     counter; each step it hands the backend a StepBatch and gets one token per
//     sequence that asked for one.
//
// KV pools. Layers are grouped into pools by their attention geometry (window, kv heads);
// a model with full attention everywhere has one pool. A block of a pool holds B tokens
// of every layer of that pool, laid out block-major so a block is one contiguous range:
//
//   pool memory: [num_blocks][layers_in_pool][2 (K, V)][num_kv_heads][B][head_dim]
//
// in the backend's KV element type (cpu: fp32, cuda: bf16). K is stored with RoPE
// already applied at the token's absolute position.
//
// Where token t of a sequence lives in a pool: block block_table[t / B], offset t % B.
// The table is linear in positions; blocks the KV manager dropped behind a sliding window
// (kv::PoolView's kept blocks) are kNoBlock entries, which no query may see.
//
// Attention semantics, for a query at absolute position q in a pool with window W,
// sinks S and attention chunk C (0 = off for each), key t is visible iff
//   t <= q  and  (W == 0 or q - t < W or t < S)  and  (C == 0 or t / C == q / C).
// With position_shift (StreamingLLM, "Efficient Streaming Language Models with Attention
// Sinks": positions are taken within the cache), the query is rotated at
// min(q, S + W - 1) when scored against sink keys (t < S) and at q against the others;
// since RoPE scores depend only on the position difference, this equals rotating every
// key at its cache position.
// With dense_context (StreamingLLM's dense context phase, TensorRT-LLM's
// dense_context_fmha), a query of the prompt (q < SequenceStep::context_end) sees every key
// t <= q at its own position; only the tokens after the prompt see the window and sinks.
//
// Thread safety: thread-compatible. The engine thread calls Execute() and the copier;
// nothing else touches a backend while a step runs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "grammar/grammar.h"
#include "schema/sampling.h"
#include "worker/backend/kv_nccl.h"
#include "worker/backend/sampler.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/kv_config.h"
#include "worker/model/lora_adapter.h"
#include "worker/model/model_config.h"

namespace kvfleet::backend {

using BlockId = kv::BlockId;
constexpr BlockId kNoBlock = kv::kNoBlock;  // a block-table entry the step never reads
constexpr TokenId kNoToken = UINT32_MAX;  // StepOutput::tokens for a sequence not sampled

// The worker's attention flags (TensorRT-LLM's KvCacheConfig names in brackets). Every
// backend turns them and the model's config.json into per-layer windows the same way
// (kv_setup.h: CheckAttentionOptions, KvCacheConfigFor), so its pools are the KV manager's.
struct AttentionOptions {
  // --max-attention-window [max_attention_window]: per-layer windows in tokens, repeated to
  // the number of layers; a window >= the context is full attention. Empty: config.json's.
  std::vector<int32_t> max_attention_window;
  int32_t sink_tokens = 0;           // --sink-tokens [sink_token_length]: kept by windowed layers
  bool streaming_llm = false;        // --streaming-llm: position shift + dense context phase
  int32_t attention_chunk_size = 0;  // --attention-chunk-size: Llama 4 chunks; 0: config.json's
};

// --kv-cache-dtype: the KV cache's element type. auto is the backend's own (cuda: bf16, cpu:
// fp32); fp8 is e4m3 with per-(layer, KV head) scales (kernels/paged_kv.h), cuda on sm_89+.
enum class KvCacheDtype : uint8_t { kAuto, kBf16, kFp8E4m3 };
// Accepts auto, bf16, fp8 and fp8_e4m3 (vLLM's names); the error names the flag.
Result<KvCacheDtype> ParseKvCacheDtype(std::string_view name);
std::string_view KvCacheDtypeName(KvCacheDtype dtype);

// Everything a backend needs to start. One struct for every backend; settings a single
// backend understands go in `extra` (e.g. the mock's cost constants), documented there.
struct BackendOptions {
  std::string model_dir;          // a Hugging Face directory (config.json, *.safetensors)
  int32_t block_size = 32;        // B: tokens per KV block; a power of two
  int32_t max_num_tokens = 8192;  // most tokens computed in one step, all sequences together
  int32_t max_batch_size = 256;   // most sequences in one step
  int64_t max_context = 0;        // longest sequence in tokens; 0: the model's max_position_embeddings
  // Device KV memory for all pools together, in bytes; 0: the backend's default
  // (cpu: 512 MiB; cuda: kv_memory_fraction of the free memory after the weights load).
  uint64_t kv_cache_bytes = 0;     // cuda with tensor_parallel > 1: per GPU
  double kv_memory_fraction = 0.9;  // cuda only, used when kv_cache_bytes == 0
  int64_t num_blocks = 0;           // > 0: exactly this many device blocks per pool (tests)
  uint64_t host_kv_bytes = 0;       // secondary tier (host memory) bytes; 0: no host tier
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;  // --kv-cache-dtype; a backend refuses what it cannot store
  AttentionOptions attention;       // windows, sinks, StreamingLLM, chunks (kv_setup.h applies them)
  int32_t threads = 0;           // cpu: worker threads; 0: hardware concurrency
  int32_t device = 0;            // cuda: device ordinal
  // --tensor-parallel: ranks the model is split over (tensor_parallel.h), 1, 2, 4 or 8. cpu: in-process
  // ranks; cuda: one GPU per rank from `device` on (cuda_backend.h invariant 8); mock: checked against
  // the model, no effect.
  int32_t tensor_parallel = 1;
  // LoRA: adapter slots on the device (--max-loras) and the largest rank a slot holds.
  // 0 slots: the backend serves no adapters.
  int32_t max_loras = 0;
  int32_t max_lora_rank = 64;
  std::map<std::string, std::string> extra;  // backend-specific settings by name
};

// One KV pool as the backend laid it out; the KV manager builds one pool per entry. The
// fields mirror kv::PoolLayout (worker/kv/kv_config.h); pools are ordered and the device
// budget is split between them as kv::ComputePools does.
struct KvPoolInfo {
  int32_t window = 0;           // attention window in tokens; 0: full attention
  int32_t sink_tokens = 0;      // StreamingLLM sinks kept forever; 0: none
  bool position_shift = false;  // RoPE positions within the cache (see the header comment)
  bool dense_context = false;   // prompt queries see the whole prompt (see the header comment)
  int32_t attention_chunk = 0;  // chunked attention: queries see only their own chunk; 0: off
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  std::vector<int32_t> layers;  // model layers in this pool, ascending
  uint64_t bytes_per_block = 0; // layers.size() * 2 * num_kv_heads * B * head_dim * element size
  int64_t device_blocks = 0;    // device blocks
  int64_t host_blocks = 0;      // host tier blocks; 0: no host tier
  int64_t max_blocks_per_seq = 0;  // ceil(max_context / B): the longest block table
};

// How a backend's KV block bytes read (Contract 4's Layout): two workers move blocks only
// when their formats and pools are equal.
struct KvTransferFormat {
  // "fp32" (cpu), "bf16" or "fp8e4m3" (cuda), "none" (mock: no bytes, a modelled size);
  // empty: this backend cannot move blocks.
  std::string dtype;
  std::string unsupported;    // with an empty dtype: why
  std::vector<float> scales;  // fp8: the dequantisation scales, [layer][K, V][kv head]
};

enum class LogitsRequest : uint8_t {
  kNone,  // only the sampled token
  kLast,  // the logits of the step's last token of this sequence
  kAll,   // the logits of every token this step computes for this sequence
};

// The argmax with no logit adjusted: a SequenceStep's sampling unless it points elsewhere.
inline const SamplingParams kGreedySampling{.temperature = 0.0f};

// One sequence's share of a step: a prefill chunk or one decode token.
struct SequenceStep {
  uint64_t request_id = 0;          // for messages only
  std::span<const TokenId> tokens;  // the tokens to compute; at least one
  // Absolute position of tokens[0]. Positions [0, start_position) are in the cache
  // already (computed by earlier steps or served from reused blocks) as far as this
  // step's queries can see them.
  int64_t start_position = 0;
  // One block table per pool, in pools() order. It covers every slot this step reads or
  // writes; entries for blocks no query can see may be kNoBlock. Blocks this step writes
  // (those holding positions [start_position, start_position + tokens.size())) belong to
  // this sequence alone.
  std::vector<std::span<const BlockId>> block_tables;
  // The prompt's length: with a dense_context pool, queries at positions below it attend
  // to every earlier position (the dense context phase). 0: none.
  int64_t context_end = 0;
  // True: sample a token from the logits of tokens.back() (the last prefill chunk or a
  // decode step). False: a prefill chunk that is not the last one.
  bool sample = false;
  // The request's sampling parameters as the engine holds them (schema/sampling.h), read
  // when `sample` and for prompt logprobs' top entries. Not owned: valid for the step.
  const SamplingParams* sampling = &kGreedySampling;
  uint64_t seed = 0;         // the sequence's: the request's seed, or the worker's, + its index
  uint64_t rng_counter = 0;  // tokens this sequence sampled before (the per-sequence RNG state)
  // Compute the logprob of every prompt token this step's rows predict (PromptLogprobRowsOf)
  // with sampling->logprobs top entries: the request asked, and they have not gone out yet.
  bool prompt_logprobs = false;
  // Every token of the sequence so far (prompt + generated; `tokens` is a part of it) and the
  // prompt's length: the penalties' counts (BuildLogitAdjusts) and prompt logprobs' targets.
  std::span<const TokenId> history;
  int64_t prompt_len = 0;
  LogitsRequest logits = LogitsRequest::kNone;  // tests and debugging; costs a copy
  // The device slot (ModelBackend::LoadLora) of the adapter every token of this sequence is
  // computed with; -1: the base model. Sequences of different slots share a step.
  int32_t lora_slot = -1;
  // Constrained decoding: when not empty (and `sample`), the tokens the sampled one may be,
  // bit id % 32 of word id / 32 (grammar::Matcher::FillNextTokenBitmask; at least one bit
  // set). A backend that applies_token_bitmask() samples only among them; logprobs stay
  // those of the raw logits. Empty: every token. Not owned: valid for the step.
  std::span<const uint32_t> token_bitmask;
  // Constrained decoding with the mask filled late (the engine's way): with `sample` and an
  // empty token_bitmask, the backend asks StepBatch::fill_token_bitmask for this sequence's
  // mask once the step's forward pass is queued, before sampling (see TokenBitmaskFiller).
  bool late_token_bitmask = false;
};

// Writes the allowed-token bitmask of batch.seqs[seq] (a late_token_bitmask sequence) into
// `mask`, BitmaskWords(vocab_size) words of the backend's memory (the cuda backend's pinned
// staging row: no further host copy), overwriting every word; at least one bit must be set.
// A backend calls it once per such sequence per step, on the thread that called Execute,
// after it has queued the step's forward pass (cuda: the GPU computes the logits meanwhile)
// and before it samples; with tensor parallelism (cuda, N > 1) before the step, once.
// This is when a constrained decoder's next-token mask costs nothing beside a GPU step.
using TokenBitmaskFiller = std::function<void(size_t seq, std::span<uint32_t> mask)>;

struct StepBatch {
  std::vector<SequenceStep> seqs;  // at most max_batch_size; tokens in all <= max_num_tokens
  TokenBitmaskFiller fill_token_bitmask;  // set when some sequence has late_token_bitmask
};

// True when the step's sampled token is constrained (a token_bitmask or a late one).
inline bool HasTokenBitmask(const SequenceStep& s) {
  return s.sample && (!s.token_bitmask.empty() || s.late_token_bitmask);
}
// The mask batch.seqs[i] samples with, written into `mask` (BitmaskWords(vocab) words): its
// token_bitmask copied, or the filler's. InvalidArgument when the mask allows no token: the
// caller fails the step (a late mask: after its forward pass ran).
// REQUIRES: HasTokenBitmask(batch.seqs[i]); a validated batch.
Status FillStepTokenBitmask(const StepBatch& batch, size_t i, std::span<uint32_t> mask);

// With prompt_logprobs: the positions p of this step's rows whose next token is a
// prompt token (p + 1 < prompt_len); row p gives history[p + 1]'s logprob. [first, end).
struct PromptLogprobRows {
  int64_t first = 0, end = 0;
};
PromptLogprobRows PromptLogprobRowsOf(const SequenceStep& step);

struct StepOutput {
  std::vector<TokenId> tokens;         // [seq]: the sampled token, or kNoToken when !sample
  // [seq]: the sampled token's logprob and top entries, when sample && sampling->logprobs >= 0.
  std::vector<TokenLogprobs> logprobs;
  // [seq]: with prompt_logprobs, one entry per PromptLogprobRowsOf position, in order.
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs;
  std::vector<int64_t> logits_offset;  // [seq]: first row of this sequence in `logits`, -1: none
  std::vector<float> logits;           // requested rows, [rows][vocab_size], fp32
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  ModelBackend() = default;
  ModelBackend(const ModelBackend&) = delete;
  ModelBackend& operator=(const ModelBackend&) = delete;

  virtual std::string_view name() const = 0;  // "cpu", "mock", "cuda"
  // The compute device as every worker sharing it names it (the Hello's deviceId: cuda the
  // GPU's UUID). Empty: the backend names none (the worker then decides: cpu its host).
  virtual std::string device_id() const { return ""; }
  // True when Execute honours SequenceStep::token_bitmask (constrained decoding): the worker
  // offers structured outputs only then (its Hello's structuredOutputs).
  virtual bool applies_token_bitmask() const { return false; }
  // The vocabulary the worker's grammars compile against, once at start-up, before any step
  // (the mock steers its token choice with it). Default: not needed.
  virtual void UseVocabulary(const grammar::Vocabulary& vocabulary) { (void)vocabulary; }
  virtual const model::ModelConfig& config() const = 0;
  virtual int32_t block_size() const = 0;
  virtual int32_t max_num_tokens() const = 0;
  virtual int32_t max_batch_size() const = 0;
  virtual int64_t max_context() const = 0;
  // The KV pools, fixed at construction.
  virtual std::span<const KvPoolInfo> pools() const = 0;

  // Runs one step: writes the K/V of every token of every sequence into its blocks,
  // attends, and samples where asked; `out` is resized here. The batch is validated
  // before anything is computed: a malformed one (a block id out of range, a block table
  // too short, too many tokens, bad sampling values) fails with InvalidArgument and
  // changes nothing.
  // REQUIRES: the engine's side of the contract above (visible positions cached, written
  // blocks unshared).
  virtual Status Execute(const StepBatch& batch, StepOutput* out) = 0;

  // Whole-block copies within a pool (copy on partial reuse) and between tiers (offload,
  // onboard). Owned by the backend; valid for its lifetime.
  virtual kv::BlockCopier& block_copier() = 0;

  // KV transfer between workers (Contract 4, schema/README.md). What this backend's block
  // bytes are, for a peer's layout check; dtype empty: it cannot move blocks (and why in
  // `unsupported`).
  virtual KvTransferFormat kv_transfer_format() const;
  // Copies whole blocks of `pool` (either tier) into `out`, block after block, each
  // pools()[pool].bytes_per_block bytes (none with dtype "none"). Called between steps.
  virtual Status ReadKvBlocks(uint32_t pool, std::span<const kv::BlockLocation> blocks, std::span<std::byte> out);
  // Writes whole device blocks of `pool` from `in`, laid out as ReadKvBlocks writes them.
  // Called between steps; the next step reads them.
  virtual Status WriteKvBlocks(uint32_t pool, std::span<const BlockId> blocks, std::span<const std::byte> in);
  // The same, block i's bytes from in[i] (each bytes_per_block long) where they lie: a
  // received frame's blocks, written with no gather first. The default writes block by block.
  virtual Status WriteKvBlocksFrom(uint32_t pool, std::span<const BlockId> blocks,
                                   std::span<const std::span<const std::byte>> in);
  // The prefill rate (tokens/s) a step of at most `max_tokens` prompt tokens computes, cut to
  // `max_step_ms` (> 0) as the engine's step bound cuts prefill while decodes run: what the
  // worker announces before it has measured one (its Hello). 0: this backend cannot tell.
  virtual double ExpectedPrefillTokensPerSecond(uint32_t max_tokens, double max_step_ms) const { return 0; }
  // Same-host device copies (Contract 4's device answer, CUDA IPC). ExportKvDevice: per pool,
  // a handle another process on this host can open to map the pool's device blocks, after the
  // work queued so far has finished (a block named after the call holds its final bytes);
  // empty when this backend cannot (cpu, mock, an fp8 cache, tensor parallelism). Between steps.
  virtual std::vector<std::string> ExportKvDevice();
  // Copies device blocks `src` of `pool` in the process that exported `handle` into this
  // backend's device blocks `dst` of the same pool, and returns once they are copied. The
  // exporter keeps `src` unchanged until then. Called between steps.
  virtual Status CopyKvBlocksFromPeer(uint32_t pool, const std::string& handle, std::span<const BlockId> src,
                                      std::span<const BlockId> dst);
  // NCCL point-to-point transfers of device blocks with other workers (Contract 4's `nccl`
  // answer, kv_nccl.h); `on_done` is called whenever a transfer ends. FailedPrecondition,
  // saying why, when this backend cannot (cpu, mock, an fp8 cache, tensor parallelism, a
  // build without NCCL). Once, at start-up.
  virtual Result<std::unique_ptr<KvNccl>> MakeKvNccl(std::function<void()> on_done);

  // LoRA. Adapter slots on the device: 0 when the backend serves no adapters.
  virtual int32_t max_loras() const { return 0; }
  // Copies `adapter` into slot `slot` (0..max_loras() - 1), replacing what was there; steps
  // whose sequences name the slot then use it. Called between steps. InvalidArgument for an
  // adapter this backend cannot hold (its rank above max_lora_rank, say).
  virtual Status LoadLora(int32_t slot, const model::LoraAdapter& adapter);
};

// The part every backend holds and reports the same way: its options, its model's
// configuration, the longest context it serves and its KV pools. A backend derives from it
// and fills config_, max_context_ and pools_ while it is built (Make), before the engine
// sees it.
class ModelBackendBase : public ModelBackend {
 public:
  const model::ModelConfig& config() const final { return config_; }
  int32_t block_size() const final { return options_.block_size; }
  int32_t max_num_tokens() const final { return options_.max_num_tokens; }
  int32_t max_batch_size() const final { return options_.max_batch_size; }
  int64_t max_context() const final { return max_context_; }
  std::span<const KvPoolInfo> pools() const final { return pools_; }

 protected:
  explicit ModelBackendBase(const BackendOptions& options, model::ModelConfig config = {})
      : options_(options), config_(std::move(config)) {}
  // ReadKvBlocks / WriteKvBlocks' common checks: a format that moves blocks, a pool that
  // exists, and `bytes` = blocks × the pool's bytes_per_block.
  Status CheckKvTransfer(uint32_t pool, size_t blocks, size_t bytes) const;

  BackendOptions options_;
  model::ModelConfig config_;
  int64_t max_context_ = 0;
  std::vector<KvPoolInfo> pools_;
};

// ---- Shared by every backend --------------------------------------------------------

// The positions a query at q sees in a pool (the rule above): the main range [lo, q] and the
// sink range [sink_lo, sink_hi) (empty unless the pool has a window and sinks). A query
// below context_end in a dense_context pool sees [0, q].
struct VisibleRange {
  int64_t lo, sink_lo, sink_hi;
};
VisibleRange VisibleOf(const KvPoolInfo& pool, int64_t q, int64_t context_end = 0);
// True when a query at q of a step with this context_end is in the pool's dense context phase.
inline bool DenseQuery(const KvPoolInfo& pool, int64_t q, int64_t context_end) {
  return pool.dense_context && q < context_end;
}

// The description of a pool the KV manager laid out (kv::ComputePools) for model `c` under
// `options`, serving contexts of up to max_context tokens: geometry, tiers and masks.
KvPoolInfo PoolInfoOf(const kv::PoolLayout& layout, const model::ModelConfig& c, const BackendOptions& options,
                      int64_t max_context);
// For each model layer: the pool that holds it (*pool_of) and its index among that pool's
// layers (*index_in_pool).
void MapLayersToPools(std::span<const KvPoolInfo> pools, int64_t num_layers, std::vector<int32_t>* pool_of,
                      std::vector<int32_t>* index_in_pool);

// The checks Execute() makes before computing anything: batch and token limits, positions
// inside the context, token ids inside the vocabulary, sampling values, token bitmasks (one
// word per 32 tokens, some bit set; a late one only on a sampled row without a token_bitmask
// and with the batch's filler set), one block table per pool reaching every visible and
// written position with in-range ids, and no block written by two sequences.
// InvalidArgument names the request and the reason.
Status ValidateStepBatch(const StepBatch& batch, const BackendOptions& options, const std::vector<KvPoolInfo>& pools,
                         int64_t vocab_size, int64_t max_context);

// ---- Selection by name -------------------------------------------------------------

using BackendFactory = std::function<Result<std::unique_ptr<ModelBackend>>(const BackendOptions&)>;

// Adds a backend under `name`; returns true (for the static registrar below).
// REQUIRES: no backend of that name yet.
bool RegisterBackend(std::string name, BackendFactory factory);

// Builds the named backend; NotFound lists the registered names when `name` is unknown.
Result<std::unique_ptr<ModelBackend>> CreateBackend(std::string_view name, const BackendOptions& options);

// Registered names, sorted.
std::vector<std::string> BackendNames();

}  // namespace kvfleet::backend

// KVF_REGISTER_BACKEND(cpu, "cpu", factory) in a backend's .cc registers it before main.
// A static library's object is only linked when something refers to it, so the backend's
// CMakeLists.txt must also say
//   target_link_options(<lib> INTERFACE "LINKER:--undefined=kvfleet_backend_<ident>_registered")
// and then linking the library is all it takes.
#define KVF_REGISTER_BACKEND(ident, name, factory)               \
  extern "C" {                                                  \
  extern const bool kvfleet_backend_##ident##_registered;      \
  const bool kvfleet_backend_##ident##_registered =            \
      ::kvfleet::backend::RegisterBackend(name, factory);       \
  }
