#include "worker/backend/cpu/cpu_backend.h"

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

namespace kvfleet::backend::cpu {

struct CpuBackend::Row {
  int32_t seq = 0;        // index in the batch
  int32_t index = 0;      // index of the token within its sequence's step
  int64_t position = 0;   // absolute position
  int32_t logits_row = -1;  // row in logits_, -1: no logits needed
};

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options) : ModelBackendBase(options) {}

CpuBackend::~CpuBackend() {
  for (float* p : device_kv_) std::free(p);
  for (float* p : host_kv_) std::free(p);
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::Make(const BackendOptions& options) {
  const auto t0 = Clock::now();
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
  std::unique_ptr<CpuBackend> b(new CpuBackend(options));
  b->lora_slots_.resize(static_cast<size_t>(options.max_loras));
  int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  b->pool_ = std::make_unique<ThreadPool>(std::max(threads, 1));

  KVF_ASSIGN_OR_RETURN(auto checkpoint, model::Checkpoint::Open(options.model_dir));
  b->config_ = checkpoint->config();
  const model::ModelConfig& c = b->config_;
  b->max_context_ = options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  // Flag errors before the weights load.
  KVF_RETURN_IF_ERROR(CheckAttentionOptions(c, options.attention, static_cast<uint32_t>(options.block_size),
                                            static_cast<uint32_t>(b->max_context_)));
  const auto t_open = Clock::now();
  KVF_ASSIGN_OR_RETURN(b->w_, LoadCpuWeights(*checkpoint, *b->pool_));
  const auto t_weights = Clock::now();
  b->rope_ = std::make_unique<Rope>(c.rope());

  // KV pools, as the KV manager computes them.
  KvMemorySettings memory;
  memory.block_size = static_cast<uint32_t>(options.block_size);
  memory.max_context = static_cast<uint32_t>(b->max_context_);
  memory.dtype_bytes = sizeof(float);
  memory.device_bytes = options.kv_cache_bytes > 0 ? options.kv_cache_bytes : config::kDefaultKvBytes;
  memory.host_bytes = options.host_kv_bytes;
  kv::KvCacheConfig& kc = b->kv_config_;
  kc = KvCacheConfigFor(c, memory, options.attention);
  if (options.num_blocks > 0) KVF_RETURN_IF_ERROR(kv::SizeForBlocksPerPool(&kc, options.num_blocks));
  KVF_RETURN_IF_ERROR(kc.Validate());
  KVF_ASSIGN_OR_RETURN(std::vector<kv::PoolLayout> layouts, kv::ComputePools(kc));
  std::vector<kv::MemcpyBlockCopier::Arena> arenas;
  for (size_t pi = 0; pi < layouts.size(); ++pi) {
    const kv::PoolLayout& l = layouts[pi];
    KvPoolInfo p = PoolInfoOf(l, c, options, b->max_context_);
    // calloc: large arenas come from fresh zero pages, committed as they are touched.
    float* dev = static_cast<float*>(std::calloc(static_cast<size_t>(l.device_blocks), l.bytes_per_block));
    float* host = l.host_blocks > 0 ? static_cast<float*>(std::calloc(l.host_blocks, l.bytes_per_block)) : nullptr;
    b->device_kv_.push_back(dev);
    b->host_kv_.push_back(host);
    if (dev == nullptr || (l.host_blocks > 0 && host == nullptr)) {
      return ResourceExhausted("cpu backend: cannot allocate the KV cache of pool " + std::to_string(pi));
    }
    arenas.push_back({reinterpret_cast<std::byte*>(dev), reinterpret_cast<std::byte*>(host), l.bytes_per_block});
    b->pools_.push_back(std::move(p));
  }
  MapLayersToPools(b->pools_, c.num_layers, &b->layer_pool_, &b->layer_index_);
  b->copier_ = std::make_unique<kv::MemcpyBlockCopier>(std::move(arenas));

  const auto t_end = Clock::now();
  const double convert_s = Seconds(t_open, t_weights);
  uint64_t kv_bytes = 0;
  for (const auto& p : b->pools_) kv_bytes += p.bytes_per_block * static_cast<uint64_t>(p.device_blocks);
  Logger("model")->info(
      "cpu backend: {} ({}, {} layers) ready in {:.2f} s: open+validate {:.2f} s, {:.2f} GB to fp32 in {:.2f} s "
      "({:.2f} GB/s, {} threads), KV {:.0f} MiB in {} pool(s) {:.2f} s",
      options.model_dir, model::ArchitectureName(c.architecture), c.num_layers, Seconds(t0, t_end),
      Seconds(t0, t_open), static_cast<double>(checkpoint->weight_bytes()) * 1e-9, convert_s,
      convert_s > 0 ? static_cast<double>(checkpoint->weight_bytes()) * 1e-9 / convert_s : 0.0, b->pool_->size(),
      static_cast<double>(kv_bytes) / (1 << 20), b->pools_.size(), Seconds(t_weights, t_end));
  return b;
}

float* CpuBackend::KvBase(size_t pool, kv::BlockId block) const {
  return device_kv_[pool] + static_cast<size_t>(block) * (pools_[pool].bytes_per_block / sizeof(float));
}

Status CpuBackend::Validate(const StepBatch& batch) const {
  KVF_RETURN_IF_ERROR(ValidateStepBatch(batch, options_, pools_, config_.vocab_size, max_context_));
  for (const SequenceStep& s : batch.seqs) {
    if (s.lora_slot >= 0 && lora_slots_[s.lora_slot] == nullptr) {
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
  for (const auto& layer : adapter.layers) {
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
  lora_slots_[slot] = std::make_unique<model::LoraAdapter>(adapter);
  return Status::Ok();
}

void CpuBackend::AddLora(const StepBatch& batch, int64_t layer, model::LoraTarget t, const float* x,
                         int64_t x_stride, float* y, int64_t y_stride, int64_t y_offset) {
  const model::LoraDims d = model::LoraTargetDims(config_, t);
  const int64_t T = static_cast<int64_t>(rows_.size());
  pool_->ParallelFor((T + 15) / 16, [&](int64_t chunk) {
    thread_local std::vector<float> scratch;
    scratch.resize(model::kMaxLoraRank);
    for (int64_t r = chunk * 16; r < std::min(T, chunk * 16 + 16); ++r) {
      const int32_t slot = batch.seqs[rows_[r].seq].lora_slot;
      if (slot < 0) continue;
      const model::LoraAdapter& a = *lora_slots_[slot];
      const model::LoraMatrices& m = a.layers[layer][static_cast<int>(t)];
      if (m.empty()) continue;
      LoraAddRow(x + r * x_stride, d.in, m.a.data(), m.b.data(), a.rank, d.out, a.scaling, scratch.data(),
                 y + r * y_stride + y_offset);
    }
  });
}

void CpuBackend::Attention(const StepBatch& batch, int64_t layer) {
  const model::ModelConfig& c = config_;
  const size_t pi = static_cast<size_t>(layer_pool_[layer]);
  const KvPoolInfo& pool = pools_[pi];
  const int64_t li = layer_index_[layer];
  const int64_t B = options_.block_size, hd = c.head_dim, kvh = c.num_kv_heads, nh = c.num_heads;
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
  const int64_t k_off = c.q_size(), v_off = c.q_size() + c.kv_size();
  // Element offsets inside a block: [layers_in_pool][2][kv_heads][B][head_dim].
  auto k_at = [&](int64_t g) { return ((li * 2 + 0) * kvh + g) * B * hd; };
  auto v_at = [&](int64_t g) { return ((li * 2 + 1) * kvh + g) * B * hd; };

  // 1. Write this step's K and V.
  const int64_t T = static_cast<int64_t>(rows_.size());
  pool_->ParallelFor((T + 63) / 64, [&](int64_t chunk) {
    for (int64_t r = chunk * 64; r < std::min(T, chunk * 64 + 64); ++r) {
      const Row& row = rows_[r];
      const auto& table = batch.seqs[row.seq].block_tables[pi];
      float* base = KvBase(pi, table[row.position / B]);
      const int64_t off = (row.position % B) * hd;
      const float* src = qkv_.data() + r * qkv_width;
      for (int64_t g = 0; g < kvh; ++g) {
        std::memcpy(base + k_at(g) + off, src + k_off + g * hd, hd * sizeof(float));
        std::memcpy(base + v_at(g) + off, src + v_off + g * hd, hd * sizeof(float));
      }
    }
  });

  // 2. Attention: one task per (sequence, head, block of query rows).
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
  // YaRN scales cos and sin by attention_scaling (HF), so q·k by its square.
  const double rope_scale = rope_->attention_scaling();
  const float scale = static_cast<float>(rope_scale * rope_scale / std::sqrt(static_cast<double>(hd)));
  const int64_t group = nh / kvh;
  pool_->ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
    const Task& task = tasks[ti];
    const auto& table = batch.seqs[task.seq].block_tables[pi];
    const int64_t context_end = batch.seqs[task.seq].context_end;
    const int64_t g = task.head / group;
    thread_local std::vector<float> scores, q_shift, acc, cs;
    q_shift.resize(hd);
    acc.resize(hd);
    cs.resize(hd);
    for (int64_t r = task.row0; r < task.row0 + task.rows; ++r) {
      const int64_t q = rows_[r].position;
      const float* qv = qkv_.data() + r * qkv_width + task.head * hd;
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
      // Visits positions [lo, hi) block run by block run: fn(first score index, K or V
      // pointer of the run's first token, run length).
      auto for_runs = [&](int64_t lo, int64_t hi, int64_t score0, bool values, auto&& fn) {
        for (int64_t t = lo; t < hi;) {
          const int64_t off = t % B, len = std::min(hi - t, B - off);
          const float* base = KvBase(pi, table[t / B]) + (values ? v_at(g) : k_at(g)) + off * hd;
          fn(score0 + (t - lo), base, len);
          t += len;
        }
      };
      auto score_run = [&](const float* qq) {
        return [&, qq](int64_t s0, const float* k, int64_t len) {
          for (int64_t j = 0; j < len; ++j) scores[s0 + j] = Dot(qq, k + j * hd, hd) * scale;
        };
      };
      for_runs(vis.sink_lo, vis.sink_hi, 0, false, score_run(q_sink));
      for_runs(vis.lo, q + 1, n_sink, false, score_run(qv));
      float m = -INFINITY;
      for (float s : scores) m = std::max(m, s);
      double sum = 0.0;
      for (float& s : scores) {
        s = std::exp(s - m);
        sum += s;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      auto value_run = [&](int64_t s0, const float* v, int64_t len) {
        for (int64_t j = 0; j < len; ++j) Axpy(scores[s0 + j], v + j * hd, acc.data(), hd);
      };
      for_runs(vis.sink_lo, vis.sink_hi, 0, true, value_run);
      for_runs(vis.lo, q + 1, n_sink, true, value_run);
      const float inv = static_cast<float>(1.0 / sum);
      float* out = attn_.data() + r * c.q_size() + task.head * hd;
      for (int64_t d = 0; d < hd; ++d) out[d] = acc[d] * inv;
    }
  });
}

Status CpuBackend::Execute(const StepBatch& batch, StepOutput* out) {
  KVF_RETURN_IF_ERROR(Validate(batch));
  const model::ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, hd = c.head_dim;
  const int64_t qkv_width = c.q_size() + 2 * c.kv_size();
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
  const int64_t T = static_cast<int64_t>(rows_.size());
  x_.resize(T * H);
  xn_.resize(T * H);
  qkv_.resize(T * qkv_width);
  attn_.resize(T * c.q_size());
  mlp_.resize(T * 2 * I);
  act_.resize(T * I);
  cos_.resize(T * hd / 2);
  sin_.resize(T * hd / 2);
  // Dynamic NTK: each sequence's frequencies for its length at the end of this step.
  seq_inv_freq_.resize(nseq);
  for (size_t s = 0; s < nseq && rope_->depends_on_length(); ++s) {
    const SequenceStep& step = batch.seqs[s];
    seq_inv_freq_[s] = rope_->InvFreqFor(step.start_position + static_cast<int64_t>(step.tokens.size()));
  }
  for (int64_t r = 0; r < T; ++r) {
    const TokenId tok = batch.seqs[rows_[r].seq].tokens[rows_[r].index];
    std::memcpy(&x_[r * H], &w_.embed[static_cast<size_t>(tok) * H], H * sizeof(float));
    const float* inv = rope_->depends_on_length() ? seq_inv_freq_[rows_[r].seq].data() : rope_->inv_freq().data();
    rope_->Angles(inv, static_cast<double>(rows_[r].position), &cos_[r * hd / 2], &sin_[r * hd / 2]);
  }

  // Parallel over rows in chunks, for the per-row elementwise stages.
  auto per_row = [&](auto&& fn) {
    pool_->ParallelFor((T + 15) / 16, [&](int64_t chunk) {
      for (int64_t r = chunk * 16; r < std::min(T, chunk * 16 + 16); ++r) fn(r);
    });
  };
  auto add_residual = [&] {
    per_row([&](int64_t r) {
      for (int64_t i = 0; i < H; ++i) x_[r * H + i] += xn_[r * H + i];
    });
  };
  auto or_null = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
  bool lora = false;
  for (const SequenceStep& s : batch.seqs) lora |= s.lora_slot >= 0;
  using model::LoraTarget;
  auto add_lora = [&](int64_t l, LoraTarget t, const float* x, int64_t x_stride, float* y, int64_t y_stride,
                      int64_t y_offset) {
    if (lora) AddLora(batch, l, t, x, x_stride, y, y_stride, y_offset);
  };

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const CpuLayerWeights& lw = w_.layers[l];
    per_row([&](int64_t r) { RmsNorm(&x_[r * H], lw.input_norm.data(), H, c.rms_norm_eps, &xn_[r * H]); });
    MatMul(*pool_, xn_.data(), T, H, lw.qkv.data(), qkv_width, or_null(lw.qkv_bias), qkv_.data());
    add_lora(l, LoraTarget::kQ, xn_.data(), H, qkv_.data(), qkv_width, 0);
    add_lora(l, LoraTarget::kK, xn_.data(), H, qkv_.data(), qkv_width, c.q_size());
    add_lora(l, LoraTarget::kV, xn_.data(), H, qkv_.data(), qkv_width, c.q_size() + c.kv_size());
    per_row([&](int64_t r) {
      float* row = &qkv_[r * qkv_width];
      if (c.qk_norm) {  // Qwen3: RMSNorm over each q and k head, before RoPE
        for (int64_t h = 0; h < c.num_heads + c.num_kv_heads; ++h) {
          const float* w = h < c.num_heads ? lw.q_norm.data() : lw.k_norm.data();
          RmsNorm(row + h * hd, w, hd, c.rms_norm_eps, row + h * hd);
        }
      }
      const float* cs = &cos_[r * hd / 2];
      const float* sn = &sin_[r * hd / 2];
      for (int64_t h = 0; h < c.num_heads + c.num_kv_heads; ++h) rope_->Apply(cs, sn, row + h * hd);
    });
    Attention(batch, l);
    MatMul(*pool_, attn_.data(), T, c.q_size(), lw.o.data(), H, or_null(lw.o_bias), xn_.data());
    add_lora(l, LoraTarget::kO, attn_.data(), c.q_size(), xn_.data(), H, 0);
    add_residual();
    per_row([&](int64_t r) { RmsNorm(&x_[r * H], lw.post_norm.data(), H, c.rms_norm_eps, &xn_[r * H]); });
    MatMul(*pool_, xn_.data(), T, H, lw.gate_up.data(), 2 * I, or_null(lw.gate_up_bias), mlp_.data());
    add_lora(l, LoraTarget::kGate, xn_.data(), H, mlp_.data(), 2 * I, 0);
    add_lora(l, LoraTarget::kUp, xn_.data(), H, mlp_.data(), 2 * I, I);
    per_row([&](int64_t r) { SiluMul(&mlp_[r * 2 * I], &mlp_[r * 2 * I + I], I, &act_[r * I]); });
    MatMul(*pool_, act_.data(), T, I, lw.down.data(), H, or_null(lw.down_bias), xn_.data());
    add_lora(l, LoraTarget::kDown, act_.data(), I, xn_.data(), H, 0);
    add_residual();
  }

  // LM head for the rows that need logits.
  head_.resize(static_cast<size_t>(logit_rows) * H);
  for (int64_t r = 0; r < T; ++r) {
    if (rows_[r].logits_row >= 0) {
      RmsNorm(&x_[r * H], w_.final_norm.data(), H, c.rms_norm_eps, &head_[rows_[r].logits_row * H]);
    }
  }
  logits_.resize(static_cast<size_t>(logit_rows) * V);
  if (logit_rows > 0) MatMul(*pool_, head_.data(), logit_rows, H, w_.lm_head_data(), V, nullptr, logits_.data());

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
    const int32_t top = std::max(step.sampling.logprobs, 0);
    if (step.sample) {
      const std::span<const float> row(&logits_[last.logits_row * V], V);
      BuildLogitAdjusts(step.sampling, step.history, static_cast<size_t>(step.prompt_len), &adjust_);
      out->tokens[s] = sampler_.Sample(row, step.sampling, step.rng_counter, adjust_);
      if (step.sampling.logprobs >= 0) out->logprobs[s] = ComputeLogprobs(row, out->tokens[s], top);
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
