// CpuBackend: construction (weights, each rank's shard and KV arenas), LoRA slots, the fp32
// forward pass (embedding, layers, attention over the paged KV, the rank group's all-reduces,
// LM head) and Execute. The math lives in cpu_kernels.cc, the weights in cpu_weights.cc and
// the shards' geometry, LoRA's included, in ../tensor_parallel.cc.
// Thread-compatible (cpu_backend.h): the engine thread calls it.
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/cpu_moe.h"
#include "worker/backend/cpu/cpu_qk.h"
#include "worker/backend/cpu/cpu_rank.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/block_hash.h"
#include "common/check.h"
#include "common/log.h"
#include "worker/backend/kv_setup.h"
#include "worker/model/lora_adapter.h"

namespace kvfleet::backend::cpu {

struct CpuBackend::Row {
  int32_t seq = 0;        // index in the batch
  int32_t index = 0;      // index of the token within its sequence's step
  int64_t position = 0;   // absolute position
  int32_t logits_row = -1;  // row in logits_, -1: no logits needed
};

// Copies each block on every rank: a block id names the same tokens in every rank's arenas.
class CpuBackend::RankCopier final : public kv::BlockCopier {
 public:
  explicit RankCopier(std::vector<kv::MemcpyBlockCopier> ranks) : ranks_(std::move(ranks)) {}
  void Copy(std::span<const kv::BlockCopy> copies) override {
    for (auto& r : ranks_) r.Copy(copies);
  }

 private:
  std::vector<kv::MemcpyBlockCopier> ranks_;
};

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options) : ModelBackendBase(options) {}

CpuBackend::~CpuBackend() = default;

int CpuBackend::threads() const {
  int n = 0;
  for (const auto& rk : ranks_) n += rk->pool->size();
  return n;
}

namespace {

// The options the cpu backend cannot serve, before anything is loaded.
Status CheckCpuOptions(const BackendOptions& options) {
  if (!IsValidBlockSize(static_cast<uint32_t>(options.block_size))) {
    return InvalidArgument("cpu backend: block_size " + std::to_string(options.block_size) +
                           " is not a power of two");
  }
  if (options.max_num_tokens <= 0 || options.max_batch_size <= 0) {
    return InvalidArgument("cpu backend: max_num_tokens and max_batch_size must be > 0");
  }
  if (options.kv_cache_dtype != KvCacheDtype::kAuto) {
    return InvalidArgument("--kv-cache-dtype " + std::string(KvCacheDtypeName(options.kv_cache_dtype)) +
                           ": the cpu backend keeps its KV cache in fp32 (auto only); fp8 needs --backend cuda on "
                           "an sm_89+ GPU");
  }
  if (options.max_loras < 0 || options.max_lora_rank < 1 || options.max_lora_rank > model::kMaxLoraRank) {
    return InvalidArgument("cpu backend: max_loras must be >= 0 and max_lora_rank in 1.." +
                           std::to_string(model::kMaxLoraRank));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<CpuBackend>> CpuBackend::Make(const BackendOptions& options) {
  const auto t0 = Clock::now();
  KVF_RETURN_IF_ERROR(CheckCpuOptions(options));
  std::unique_ptr<CpuBackend> b(new CpuBackend(options));
  b->lora_loaded_.assign(static_cast<size_t>(options.max_loras), false);

  KVF_ASSIGN_OR_RETURN(auto checkpoint, model::Checkpoint::Open(options.model_dir));
  b->config_ = checkpoint->config();
  const model::ModelConfig& c = b->config_;
  b->max_context_ = options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  // Flag errors before the weights load.
  KVF_RETURN_IF_ERROR(CheckAttentionOptions(c, options.attention, static_cast<uint32_t>(options.block_size),
                                            static_cast<uint32_t>(b->max_context_)));
  KVF_RETURN_IF_ERROR(CheckTensorParallel(c, options.tensor_parallel));
  const int tp = options.tensor_parallel;
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::vector<TensorParallelShard> shards;
  for (int r = 0; r < tp; ++r) {
    auto rk = std::make_unique<Rank>();
    rk->shard = ShardOf(c, tp, r);
    rk->pool = std::make_unique<ThreadPool>(std::max(threads / tp, 1));
    rk->lora.resize(static_cast<size_t>(options.max_loras));
    shards.push_back(rk->shard);
    b->ranks_.push_back(std::move(rk));
  }
  if (tp > 1) b->group_ = std::make_unique<RankGroup>(tp);
  const auto t_open = Clock::now();
  KVF_ASSIGN_OR_RETURN(std::vector<CpuWeights> weights, LoadCpuWeights(*checkpoint, *b->ranks_[0]->pool, shards));
  for (int r = 0; r < tp; ++r) b->ranks_[r]->w = std::move(weights[r]);
  const auto t_weights = Clock::now();
  b->rope_ = std::make_unique<Rope>(c.rope());
  KVF_RETURN_IF_ERROR(b->AllocateKv());

  const auto t_end = Clock::now();
  const double convert_s = Seconds(t_open, t_weights);
  uint64_t kv_bytes = 0;
  for (const auto& rk : b->ranks_) {
    for (size_t pi = 0; pi < b->pools_.size(); ++pi) {
      kv_bytes += rk->bytes_per_block[pi] * static_cast<uint64_t>(b->pools_[pi].device_blocks);
    }
  }
  Logger("model")->info(
      "cpu backend: {} ({}, {} layers, tensor parallel {}) ready in {:.2f} s: open+validate {:.2f} s, {:.2f} GB "
      "to fp32 in {:.2f} s ({:.2f} GB/s, {} threads), KV {:.0f} MiB in {} pool(s) {:.2f} s",
      options.model_dir, model::ArchitectureName(c.architecture), c.num_layers, tp, Seconds(t0, t_end),
      Seconds(t0, t_open), static_cast<double>(checkpoint->weight_bytes()) * 1e-9, convert_s,
      convert_s > 0 ? static_cast<double>(checkpoint->weight_bytes()) * 1e-9 / convert_s : 0.0, b->threads(),
      static_cast<double>(kv_bytes) / (1 << 20), b->pools_.size(), Seconds(t_weights, t_end));
  return b;
}

Status CpuBackend::AllocateKv() {
  const model::ModelConfig& c = config_;
  const int tp = tensor_parallel();
  // KV pools, as the KV manager computes them; each rank's arenas hold its KV heads of them.
  KvMemorySettings memory;
  memory.block_size = static_cast<uint32_t>(options_.block_size);
  memory.max_context = static_cast<uint32_t>(max_context_);
  memory.dtype_bytes = sizeof(float);
  memory.device_bytes = options_.kv_cache_bytes > 0 ? options_.kv_cache_bytes : config::kDefaultKvBytes;
  memory.host_bytes = options_.host_kv_bytes;
  kv::KvCacheConfig& kc = kv_config_;
  kc = KvCacheConfigFor(c, memory, options_.attention);
  if (options_.num_blocks > 0) KVF_RETURN_IF_ERROR(kv::SizeForBlocksPerPool(&kc, options_.num_blocks));
  KVF_RETURN_IF_ERROR(kc.Validate());
  KVF_ASSIGN_OR_RETURN(std::vector<kv::PoolLayout> layouts, kv::ComputePools(kc));
  std::vector<std::vector<kv::MemcpyBlockCopier::Arena>> arenas(static_cast<size_t>(tp));
  for (size_t pi = 0; pi < layouts.size(); ++pi) {
    const kv::PoolLayout& l = layouts[pi];
    KvPoolInfo p = PoolInfoOf(l, c, options_, max_context_);
    for (int r = 0; r < tp; ++r) {
      Rank& rk = *ranks_[r];
      const uint64_t bytes = l.bytes_per_block / static_cast<uint64_t>(c.num_kv_heads) * rk.shard.kv_heads;
      // calloc: large arenas come from fresh zero pages, committed as they are touched.
      float* dev = static_cast<float*>(std::calloc(static_cast<size_t>(l.device_blocks), bytes));
      float* host = l.host_blocks > 0 ? static_cast<float*>(std::calloc(l.host_blocks, bytes)) : nullptr;
      rk.device_kv.push_back(dev);
      rk.host_kv.push_back(host);
      rk.bytes_per_block.push_back(bytes);
      if (dev == nullptr || (l.host_blocks > 0 && host == nullptr)) {
        return ResourceExhausted("cpu backend: cannot allocate the KV cache of pool " + std::to_string(pi) +
                                 (tp > 1 ? " on rank " + std::to_string(r) : ""));
      }
      arenas[r].push_back({reinterpret_cast<std::byte*>(dev), reinterpret_cast<std::byte*>(host), bytes});
    }
    pools_.push_back(std::move(p));
  }
  MapLayersToPools(pools_, c.num_layers, &layer_pool_, &layer_index_);
  if (tp == 1) {
    copier_ = std::make_unique<kv::MemcpyBlockCopier>(std::move(arenas[0]));
  } else {
    std::vector<kv::MemcpyBlockCopier> copiers;
    for (auto& a : arenas) copiers.emplace_back(std::move(a));
    copier_ = std::make_unique<RankCopier>(std::move(copiers));
  }
  return Status::Ok();
}

Status CpuBackend::Validate(const StepBatch& batch) const {
  KVF_RETURN_IF_ERROR(ValidateStepBatch(batch, options_, pools_, config_.vocab_size, max_context_));
  for (const SequenceStep& s : batch.seqs) {
    if (s.lora_slot >= 0 && !lora_loaded_[s.lora_slot]) {
      return InvalidArgument("request " + std::to_string(s.request_id) + ": LoRA slot " + std::to_string(s.lora_slot) +
                             " holds no adapter");
    }
  }
  return Status::Ok();
}

Status CpuBackend::LoadLora(int32_t slot, const model::LoraAdapter& adapter) {
  if (slot < 0 || slot >= options_.max_loras) {
    return InvalidArgument("LoRA slot " + std::to_string(slot) + " is outside the cpu backend's " +
                           std::to_string(options_.max_loras) + " slots");
  }
  if (adapter.rank < 1 || adapter.rank > options_.max_lora_rank) {
    return InvalidArgument("LoRA adapter '" + adapter.name + "': rank " + std::to_string(adapter.rank) +
                           " is above --max-lora-rank " + std::to_string(options_.max_lora_rank));
  }
  if (adapter.layers.size() != static_cast<size_t>(config_.num_layers)) {
    return InvalidArgument("LoRA adapter '" + adapter.name + "': " + std::to_string(adapter.layers.size()) +
                           " layers, the model has " + std::to_string(config_.num_layers));
  }
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    const auto& layer = adapter.layers[l];
    for (model::LoraTarget t : {model::LoraTarget::kGate, model::LoraTarget::kUp, model::LoraTarget::kDown}) {
      if (config_.sparse_layer(static_cast<int64_t>(l)) && !layer[static_cast<int>(t)].empty()) {
        return InvalidArgument("LoRA adapter '" + adapter.name + "': layer " + std::to_string(l) + "'s " +
                               model::LoraTargetName(t) + " targets a dense MLP, and the layer's MLP is a mixture " +
                               "of experts (adapters of MoE layers may target q/k/v/o only)");
      }
    }
    for (int t = 0; t < model::kNumLoraTargets; ++t) {
      const model::LoraMatrices& m = layer[t];
      const model::LoraDims d = model::LoraTargetDims(config_, static_cast<model::LoraTarget>(t));
      if (!m.empty() && (m.a.size() != static_cast<size_t>(adapter.rank) * d.in ||
                         m.b.size() != static_cast<size_t>(adapter.rank) * d.out)) {
        return InvalidArgument("LoRA adapter '" + adapter.name + "': its " +
                               model::LoraTargetName(static_cast<model::LoraTarget>(t)) +
                               " matrices do not fit the model");
      }
    }
  }
  for (auto& rk : ranks_) rk->lora[slot] = ShardLora(adapter, config_, rk->shard);
  lora_loaded_[slot] = true;
  return Status::Ok();
}

void CpuBackend::AddLora(const StepBatch& batch, int64_t layer, model::LoraTarget t, Rank& rk, const float* x,
                         int64_t x_stride, float* y, int64_t y_stride, int64_t y_offset) {
  const model::LoraDims d = ShardLoraDims(config_, rk.shard, t);
  const int64_t T = static_cast<int64_t>(rows_.size());
  rk.pool->ParallelFor((T + 15) / 16, [&](int64_t chunk) {
    thread_local std::vector<float> scratch;
    scratch.resize(model::kMaxLoraRank);
    for (int64_t r = chunk * 16; r < std::min(T, chunk * 16 + 16); ++r) {
      const int32_t slot = batch.seqs[rows_[r].seq].lora_slot;
      if (slot < 0) continue;
      const model::LoraAdapter& a = *rk.lora[slot];
      const model::LoraMatrices& m = a.layers[layer][static_cast<int>(t)];
      if (m.empty()) continue;
      LoraAddRow(x + r * x_stride, d.in, m.a.data(), m.b.data(), a.rank, d.out, a.scaling, scratch.data(),
                 y + r * y_stride + y_offset);
    }
  });
}

// A rank's block: [layers_in_pool][2][kv_heads][B][head_dim].
int64_t CpuBackend::KvOffset(int64_t li, int64_t g, bool v, const Rank& rk) const {
  return ((li * 2 + (v ? 1 : 0)) * rk.shard.kv_heads + g) * options_.block_size * config_.head_dim;
}

void CpuBackend::WriteKv(const StepBatch& batch, int64_t layer, Rank& rk) {
  const size_t pi = static_cast<size_t>(layer_pool_[layer]);
  const int64_t li = layer_index_[layer];
  const int64_t B = options_.block_size, hd = config_.head_dim, kvh = rk.shard.kv_heads;
  const int64_t q_size = rk.shard.heads * hd, kv_size = kvh * hd;
  const int64_t qkv_width = q_size + 2 * kv_size;
  const int64_t T = static_cast<int64_t>(rows_.size());
  rk.pool->ParallelFor((T + 63) / 64, [&](int64_t chunk) {
    for (int64_t r = chunk * 64; r < std::min(T, chunk * 64 + 64); ++r) {
      const Row& row = rows_[r];
      const auto& table = batch.seqs[row.seq].block_tables[pi];
      float* base = rk.KvBase(pi, table[row.position / B]);
      const int64_t off = (row.position % B) * hd;
      const float* src = rk.qkv.data() + r * qkv_width;
      for (int64_t g = 0; g < kvh; ++g) {
        std::memcpy(base + KvOffset(li, g, false, rk) + off, src + q_size + g * hd, hd * sizeof(float));
        std::memcpy(base + KvOffset(li, g, true, rk) + off, src + q_size + kv_size + g * hd, hd * sizeof(float));
      }
    }
  });
}

void CpuBackend::Attention(const StepBatch& batch, int64_t layer, Rank& rk) {
  WriteKv(batch, layer, rk);
  const model::ModelConfig& c = config_;
  const size_t pi = static_cast<size_t>(layer_pool_[layer]);
  const KvPoolInfo& pool = pools_[pi];
  const int64_t li = layer_index_[layer];
  // The rank's heads; with one rank, the model's.
  const int64_t hd = c.head_dim, nh = rk.shard.heads;
  const int64_t q_size = nh * hd, qkv_width = q_size + 2 * rk.shard.kv_heads * hd;
  // One task per (sequence, head, block of query rows).
  struct Task {
    int32_t seq, head;
    int64_t row0, rows;  // rows_ range
  };
  std::vector<Task> tasks;
  int64_t r0 = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const int64_t n = static_cast<int64_t>(batch.seqs[s].tokens.size());
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < n; i += config::kAttentionRowsPerTask) {
        tasks.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h), r0 + i,
                         std::min<int64_t>(config::kAttentionRowsPerTask, n - i)});
      }
    }
    r0 += n;
  }
  // YaRN scales cos and sin by attention_scaling (HF), so q·k by its square; not on NoPE layers.
  const double rope_scale = c.uses_rope(layer) ? rope_->attention_scaling() : 1.0;
  const float scale = static_cast<float>(rope_scale * rope_scale / std::sqrt(static_cast<double>(hd)));
  const int64_t group = c.num_heads / c.num_kv_heads;
  rk.pool->ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
    const Task& task = tasks[ti];
    const int64_t context_end = batch.seqs[task.seq].context_end;
    // The model's KV head of this query head, as the rank's arenas index it.
    const int64_t g = (rk.shard.head_begin + task.head) / group - rk.shard.kv_head_begin;
    const PagedKvHead kv{rk.device_kv[pi],
                         batch.seqs[task.seq].block_tables[pi].data(),
                         static_cast<int64_t>(rk.bytes_per_block[pi] / sizeof(float)),
                         options_.block_size,
                         KvOffset(li, g, false, rk),
                         KvOffset(li, g, true, rk),
                         hd};
    thread_local std::vector<float> scores, q_shift, acc, cs;
    q_shift.resize(hd);
    acc.resize(hd);
    cs.resize(hd);
    for (int64_t r = task.row0; r < task.row0 + task.rows; ++r) {
      const int64_t q = rows_[r].position;
      const float* qv = rk.qkv.data() + r * qkv_width + task.head * hd;
      const VisibleRange vis = VisibleOf(pool, q, context_end);  // a dense prompt query: [0, q], no sinks
      const int64_t n_sink = vis.sink_hi - vis.sink_lo, n_main = q + 1 - vis.lo;
      scores.resize(n_sink + n_main);
      // StreamingLLM position shift: score sinks with the query rotated to its cache position.
      const float* q_sink = qv;
      if (pool.position_shift && n_sink > 0) {
        const int64_t cache_pos = std::min<int64_t>(q, pool.sink_tokens + pool.window - 1);
        if (cache_pos != q) {
          std::memcpy(q_shift.data(), qv, hd * sizeof(float));
          rope_->Angles(static_cast<double>(cache_pos - q), cs.data(), cs.data() + hd / 2);
          rope_->Apply(cs.data(), cs.data() + hd / 2, q_shift.data());
          q_sink = q_shift.data();
        }
      }
      PagedAttentionRow(kv, qv, q_sink, vis.sink_lo, vis.sink_hi, vis.lo, q + 1, scale, scores.data(), acc.data(),
                        rk.attn.data() + r * q_size + task.head * hd);
    }
  });
}

namespace {

const float* OrNull(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// fn(r) for r in [0, T), in chunks of 16 rows over the pool: the per-row elementwise stages.
template <typename Fn>
void PerRow(ThreadPool& pool, int64_t T, Fn&& fn) {
  pool.ParallelFor((T + 15) / 16, [&](int64_t chunk) {
    for (int64_t r = chunk * 16; r < std::min(T, chunk * 16 + 16); ++r) fn(r);
  });
}

}  // namespace

void CpuBackend::AllReduce(Rank& rk, std::vector<float>& v) {
  if (group_ != nullptr) group_->AllReduce(rk.shard.rank, v.data(), static_cast<int64_t>(v.size()));
}

void CpuBackend::Forward(const StepBatch& batch, Rank& rk) {
  const int64_t H = config_.hidden_size, I = rk.shard.inter, hd = config_.head_dim;
  const int64_t q_size = rk.shard.heads * hd, kv_size = rk.shard.kv_heads * hd;
  const int64_t T = static_cast<int64_t>(rows_.size());
  rk.x.resize(T * H);
  rk.xn.resize(T * H);
  rk.qkv.resize(T * (q_size + 2 * kv_size));
  rk.attn.resize(T * q_size);
  rk.mlp.resize(T * 2 * I);
  rk.act.resize(T * I);
  Embed(batch, rk);
  for (int64_t l = 0; l < config_.num_layers; ++l) Layer(batch, l, rk);
  LmHead(rk);
}

void CpuBackend::Embed(const StepBatch& batch, Rank& rk) {
  // Vocab-parallel embedding: each rank copies the rows it holds, zeros the others, and the
  // all-reduce assembles them (adding zeros is exact).
  const TensorParallelShard& sh = rk.shard;
  const int64_t H = config_.hidden_size, T = static_cast<int64_t>(rows_.size());
  for (int64_t r = 0; r < T; ++r) {
    const int64_t tok = batch.seqs[rows_[r].seq].tokens[rows_[r].index];
    float* dst = &rk.x[r * H];
    if (tok >= sh.vocab_begin && tok < sh.vocab_begin + sh.vocab) {
      std::memcpy(dst, &rk.w.embed[static_cast<size_t>(tok - sh.vocab_begin) * H], H * sizeof(float));
    } else {
      std::fill(dst, dst + H, 0.0f);
    }
  }
  AllReduce(rk, rk.x);
}

void CpuBackend::Layer(const StepBatch& batch, int64_t l, Rank& rk) {
  const model::ModelConfig& c = config_;
  const TensorParallelShard& sh = rk.shard;
  const int64_t H = c.hidden_size, I = sh.inter, hd = c.head_dim;
  const int64_t q_size = sh.heads * hd, kv_size = sh.kv_heads * hd;
  const int64_t qkv_width = q_size + 2 * kv_size;
  const int64_t T = static_cast<int64_t>(rows_.size());
  using model::LoraTarget;
  auto add_lora = [&](LoraTarget t, const float* x, int64_t x_stride, float* y, int64_t y_stride, int64_t y_offset) {
    if (step_has_lora_) AddLora(batch, l, t, rk, x, x_stride, y, y_stride, y_offset);
  };
  auto add_residual = [&] {
    PerRow(*rk.pool, T, [&](int64_t r) {
      for (int64_t i = 0; i < H; ++i) rk.x[r * H + i] += rk.xn[r * H + i];
    });
  };
  ThreadPool& pool = *rk.pool;
  const CpuLayerWeights& lw = rk.w.layers[l];
  PerRow(pool, T, [&](int64_t r) { RmsNorm(&rk.x[r * H], lw.input_norm.data(), H, c.rms_norm_eps, &rk.xn[r * H]); });
  MatMul(pool, rk.xn.data(), T, H, lw.qkv.data(), qkv_width, OrNull(lw.qkv_bias), rk.qkv.data());
  add_lora(LoraTarget::kQ, rk.xn.data(), H, rk.qkv.data(), qkv_width, 0);
  add_lora(LoraTarget::kK, rk.xn.data(), H, rk.qkv.data(), qkv_width, q_size);
  add_lora(LoraTarget::kV, rk.xn.data(), H, rk.qkv.data(), qkv_width, q_size + kv_size);
  PerRow(pool, T, [&](int64_t r) {  // q/k norms, RoPE, Llama 4's NoPE temperature (cpu_qk.h)
    TransformQk(c, l, lw, *rope_, &cos_[r * hd / 2], &sin_[r * hd / 2], rows_[r].position, sh.heads, sh.kv_heads,
                &rk.qkv[r * qkv_width]);
  });
  Attention(batch, l, rk);
  // Row-parallel o: each rank's partial product (and LoRA delta), summed over the ranks.
  MatMul(pool, rk.attn.data(), T, q_size, lw.o.data(), H, OrNull(lw.o_bias), rk.xn.data());
  add_lora(LoraTarget::kO, rk.attn.data(), q_size, rk.xn.data(), H, 0);
  AllReduce(rk, rk.xn);
  add_residual();
  PerRow(pool, T, [&](int64_t r) { RmsNorm(&rk.x[r * H], lw.post_norm.data(), H, c.rms_norm_eps, &rk.xn[r * H]); });
  if (c.sparse_layer(l)) {  // the MoE block reads the normed rows and writes its output over them
    rk.moe_in.assign(rk.xn.begin(), rk.xn.end());
    MoeMlp(pool, c.moe, lw, rk.moe_in.data(), T, H, sh.expert_inter, &rk.moe, rk.xn.data());
    AllReduce(rk, rk.xn);
    add_residual();
    return;
  }
  MatMul(pool, rk.xn.data(), T, H, lw.gate_up.data(), 2 * I, OrNull(lw.gate_up_bias), rk.mlp.data());
  add_lora(LoraTarget::kGate, rk.xn.data(), H, rk.mlp.data(), 2 * I, 0);
  add_lora(LoraTarget::kUp, rk.xn.data(), H, rk.mlp.data(), 2 * I, I);
  PerRow(pool, T, [&](int64_t r) { SiluMul(&rk.mlp[r * 2 * I], &rk.mlp[r * 2 * I + I], I, &rk.act[r * I]); });
  MatMul(pool, rk.act.data(), T, I, lw.down.data(), H, OrNull(lw.down_bias), rk.xn.data());
  add_lora(LoraTarget::kDown, rk.act.data(), I, rk.xn.data(), H, 0);
  AllReduce(rk, rk.xn);
  add_residual();
}

void CpuBackend::LmHead(Rank& rk) {
  // Vocab-parallel LM head for the rows that need logits, gathered into logits_.
  const TensorParallelShard& sh = rk.shard;
  const int64_t H = config_.hidden_size, V = config_.vocab_size, T = static_cast<int64_t>(rows_.size());
  const int64_t rows = logit_rows_;
  rk.head.resize(static_cast<size_t>(rows) * H);
  for (int64_t r = 0; r < T; ++r) {
    if (rows_[r].logits_row >= 0) {
      RmsNorm(&rk.x[r * H], rk.w.final_norm.data(), H, config_.rms_norm_eps, &rk.head[rows_[r].logits_row * H]);
    }
  }
  if (rows == 0 || sh.vocab == 0) return;
  if (group_ == nullptr) {
    MatMul(*rk.pool, rk.head.data(), rows, H, rk.w.lm_head_data(), V, nullptr, logits_.data());
    return;
  }
  rk.logits.resize(static_cast<size_t>(rows) * sh.vocab);
  MatMul(*rk.pool, rk.head.data(), rows, H, rk.w.lm_head_data(), sh.vocab, nullptr, rk.logits.data());
  for (int64_t r = 0; r < rows; ++r) {  // disjoint columns of logits_ per rank
    std::memcpy(&logits_[r * V + sh.vocab_begin], &rk.logits[r * sh.vocab], sh.vocab * sizeof(float));
  }
}

Status CpuBackend::Execute(const StepBatch& batch, StepOutput* out) {
  KVF_RETURN_IF_ERROR(Validate(batch));
  PrepareStep(batch);
  if (group_ == nullptr) {
    Forward(batch, *ranks_[0]);
  } else {
    group_->Run([&](int r) { Forward(batch, *ranks_[r]); });
  }
  return CollectOutputs(batch, out);
}

void CpuBackend::PrepareStep(const StepBatch& batch) {
  const int64_t V = config_.vocab_size, hd = config_.head_dim;
  const size_t nseq = batch.seqs.size();
  // Rows of the step, and which of them need logits.
  rows_.clear();
  int32_t logit_rows = 0;
  for (size_t s = 0; s < nseq; ++s) {
    const SequenceStep& step = batch.seqs[s];
    const int64_t n = static_cast<int64_t>(step.tokens.size());
    const PromptLogprobRows prompt_rows = PromptLogprobRowsOf(step);
    for (int64_t i = 0; i < n; ++i) {
      Row row{static_cast<int32_t>(s), static_cast<int32_t>(i), step.start_position + i, -1};
      const bool last = i == n - 1;
      const bool prompt_logprob = row.position >= prompt_rows.first && row.position < prompt_rows.end;
      if (step.logits == LogitsRequest::kAll || prompt_logprob ||
          (last && (step.sample || step.logits == LogitsRequest::kLast))) {
        row.logits_row = logit_rows++;
      }
      rows_.push_back(row);
    }
  }
  logit_rows_ = logit_rows;
  const int64_t T = static_cast<int64_t>(rows_.size());
  cos_.resize(T * hd / 2);
  sin_.resize(T * hd / 2);
  // Dynamic NTK: each sequence's frequencies for its length at the end of this step.
  seq_inv_freq_.resize(nseq);
  for (size_t s = 0; s < nseq && rope_->depends_on_length(); ++s) {
    const SequenceStep& step = batch.seqs[s];
    seq_inv_freq_[s] = rope_->InvFreqFor(step.start_position + static_cast<int64_t>(step.tokens.size()));
  }
  for (int64_t r = 0; r < T; ++r) {
    const float* inv = rope_->depends_on_length() ? seq_inv_freq_[rows_[r].seq].data() : rope_->inv_freq().data();
    rope_->Angles(inv, static_cast<double>(rows_[r].position), &cos_[r * hd / 2], &sin_[r * hd / 2]);
  }
  step_has_lora_ = false;
  for (const SequenceStep& s : batch.seqs) step_has_lora_ |= s.lora_slot >= 0;
  logits_.resize(static_cast<size_t>(logit_rows) * V);
}

Status CpuBackend::CollectOutputs(const StepBatch& batch, StepOutput* out) {
  const int64_t V = config_.vocab_size;
  const size_t nseq = batch.seqs.size();
  out->tokens.assign(nseq, kNoToken);
  out->logits_offset.assign(nseq, -1);
  out->logits.clear();
  out->logprobs.assign(nseq, {});
  out->prompt_logprobs.assign(nseq, {});
  int64_t out_rows = 0;
  int64_t r = 0;
  for (size_t s = 0; s < nseq; ++s) {
    const SequenceStep& step = batch.seqs[s];
    const int64_t n = static_cast<int64_t>(step.tokens.size());
    const Row& last = rows_[r + n - 1];
    const SamplingParams& sampling = *step.sampling;
    const int32_t top = std::max(sampling.logprobs, 0);
    if (step.sample) {
      const std::span<const float> row(&logits_[last.logits_row * V], V);
      BuildLogitAdjusts(sampling, step.history, static_cast<size_t>(step.prompt_len), &adjust_);
      std::span<const uint32_t> allowed;
      if (HasTokenBitmask(step)) {  // a late mask is filled here, after the forward pass (backend.h)
        mask_.resize(grammar::BitmaskWords(static_cast<size_t>(V)));
        KVF_RETURN_IF_ERROR(FillStepTokenBitmask(batch, s, mask_));
        allowed = mask_;
      }
      out->tokens[s] = sampler_.Sample(row, sampling, step.seed, step.rng_counter, adjust_, allowed);
      if (sampling.logprobs >= 0) out->logprobs[s] = ComputeLogprobs(row, out->tokens[s], top);
    }
    const PromptLogprobRows prompt_rows = PromptLogprobRowsOf(step);
    for (int64_t p = prompt_rows.first; p < prompt_rows.end; ++p) {
      const Row& row = rows_[r + (p - step.start_position)];
      out->prompt_logprobs[s].push_back(
          ComputeLogprobs(std::span<const float>(&logits_[row.logits_row * V], V), step.history[p + 1], top));
    }
    if (step.logits != LogitsRequest::kNone) {
      const int64_t first = step.logits == LogitsRequest::kAll ? r : r + n - 1;
      out->logits_offset[s] = out_rows;
      for (int64_t k = first; k < r + n; ++k) {
        const float* src = &logits_[rows_[k].logits_row * V];
        out->logits.insert(out->logits.end(), src, src + V);
        ++out_rows;
      }
    }
    r += n;
  }
  return Status::Ok();
}

namespace {
Result<std::unique_ptr<ModelBackend>> MakeCpuBackend(const BackendOptions& options) {
  KVF_ASSIGN_OR_RETURN(auto b, CpuBackend::Make(options));
  return std::unique_ptr<ModelBackend>(std::move(b));
}
}  // namespace

}  // namespace kvfleet::backend::cpu

KVF_REGISTER_BACKEND(cpu, "cpu", kvfleet::backend::cpu::MakeCpuBackend)
