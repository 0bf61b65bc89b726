// CudaBackend, step metadata: a step's shape (its decode-graph bucket, invariant 4) and the
// packing of its token ids, positions, KV slots, block tables, sequence lengths, logits rows
// and sampling settings into the pinned staging buffer, uploaded in one copy; and the
// constrained rows' token bitmasks, filled and uploaded once the logits are queued (10).
// Thread-compatible, as CudaBackend: the engine thread calls it.
#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "common/check.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {
namespace {

// Bump allocation of one step's metadata in the pinned staging buffer; each array's
// device address is the same offset in the device mirror.
class Packer {
 public:
  Packer(std::byte* host, std::byte* dev, size_t capacity) : host_(host), dev_(dev), capacity_(capacity) {}
  template <typename T>
  std::pair<T*, T*> Take(size_t n) {  // (host, device)
    used_ = (used_ + config::kStagingAlign - 1) / config::kStagingAlign * config::kStagingAlign;
    KVF_CHECK(used_ + n * sizeof(T) <= capacity_) << "cuda backend: step metadata exceeds its staging buffer";
    std::pair<T*, T*> p{reinterpret_cast<T*>(host_ + used_), reinterpret_cast<T*>(dev_ + used_)};
    used_ += n * sizeof(T);
    return p;
  }
  size_t used() const { return used_; }

 private:
  std::byte* host_;
  std::byte* dev_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace

void CudaBackend::PackStep(const StepBatch& batch, StepMeta* meta) {
  StepMeta& m = *meta;
  const int32_t S_real = static_cast<int32_t>(batch.seqs.size());
  const int64_t B = options_.block_size;
  const size_t P = pools_.size();

  // A decode step that only samples runs as a CUDA graph of its shape bucket (4): the batch
  // padded to a power of two, lengths rounded up to a power of two.
  bool graph = tuning_.use_graphs;
  bool dense_pool = false;  // a prompt row of a dense context pool attends with its own mask
  for (const KvPoolInfo& p : pools_) dense_pool = dense_pool || p.dense_context;
  int32_t max_end = 0;
  for (const SequenceStep& st : batch.seqs) {
    graph = graph && st.tokens.size() == 1 && st.sample && st.logits == LogitsRequest::kNone;
    graph = graph && !(dense_pool && st.start_position < st.context_end);
    // Logprobs and adjustments are sized per step: eager steps only.
    graph = graph && st.sampling->logprobs < 0 && !st.prompt_logprobs && !st.sampling->penalized();
    graph = graph && (st.lora_slot < 0 || !lora_debug_.time_kernels);  // timed LoRA steps run eagerly
    // (8) Timed collectives run eagerly, and so do steps without them (an ablation): the
    // cached graphs hold the collectives.
    graph = graph && !comm_debug_.time_collectives && comm_debug_.run_collectives;
    max_end = std::max(max_end, static_cast<int32_t>(st.start_position + static_cast<int64_t>(st.tokens.size())));
  }
  int32_t S = S_real, bucket_len = 0;
  if (graph) {
    S = 1;
    while (S < S_real) S *= 2;
    S = std::min({S, options_.max_batch_size, options_.max_num_tokens});
    bucket_len = config::kMinGraphLength;
    while (bucket_len < max_end) bucket_len *= 2;
    bucket_len = static_cast<int32_t>(std::min<int64_t>(bucket_len, max_context_));
    graph = S >= S_real;
  }
  if (!graph) S = S_real;
  m.graph = graph;
  m.bucket_len = bucket_len;

  // ---- Rows of each sequence ----
  m.num_seqs = S;
  m.row0.assign(S + 1, 0);
  m.end_pos.assign(S, 0);
  m.all_decode = true;
  size_t stride = 1;
  for (int32_t s = S_real; s < S; ++s) {  // padding rows: one token at position 0
    m.row0[s + 1] = s + 1;
    m.end_pos[s] = 1;
  }
  for (int32_t s = 0; s < S_real; ++s) {
    const SequenceStep& st = batch.seqs[s];
    const int32_t n = static_cast<int32_t>(st.tokens.size());
    m.row0[s + 1] = m.row0[s] + n;
    m.end_pos[s] = static_cast<int32_t>(st.start_position + n);
    m.all_decode = m.all_decode && n == 1;
    m.max_q_len = std::max(m.max_q_len, n);
    m.max_seq_len = std::max(m.max_seq_len, m.end_pos[s]);
    for (const auto& t : st.block_tables) stride = std::max(stride, t.size());
  }
  if (graph) {
    m.row0[S] = S;
    m.max_seq_len = bucket_len;
    stride = static_cast<size_t>((bucket_len + B - 1) / B);  // entries past the bucket are never read
  }
  const int32_t T = m.row0[S];
  m.num_tokens = T;
  m.table_stride = static_cast<int32_t>(stride);

  // Rows that need logits (StepMeta: parts A and B).
  std::vector<int32_t>& part_a_seq = m.part_a_seq;
  std::vector<std::pair<int32_t, int32_t>>& part_b = m.part_b;
  for (int32_t s = 0; s < S; ++s) {
    if (s >= S_real) {
      part_a_seq.push_back(s);  // padding: sampled greedily, ignored
      continue;
    }
    const SequenceStep& st = batch.seqs[s];
    if (st.sample || st.logits != LogitsRequest::kNone) part_a_seq.push_back(s);
    // Part B: the other rows of a kAll sequence, and rows whose next prompt token's logprob
    // is asked for (a non-final chunk's last row too, though part A may hold it for its logits).
    const PromptLogprobRows prompt_rows = PromptLogprobRowsOf(st);
    if (st.prompt_logprobs) m.prompt_top = std::max(m.prompt_top, st.sampling->logprobs);
    for (int32_t r = m.row0[s]; r < m.row0[s + 1]; ++r) {
      const bool logits = st.logits == LogitsRequest::kAll && r < m.row0[s + 1] - 1;
      const int64_t pos = st.start_position + (r - m.row0[s]);
      const bool logprob = pos >= prompt_rows.first && pos < prompt_rows.end;
      if (!logits && !logprob) continue;
      part_b.emplace_back(s, r);
      m.part_b_logits.push_back(logits ? 1 : 0);
      m.part_b_target.push_back(logprob ? static_cast<int32_t>(st.history[pos + 1]) : -1);
    }
  }
  const int32_t na = static_cast<int32_t>(part_a_seq.size());
  const int32_t nb = static_cast<int32_t>(part_b.size());

  // ---- Packed into the pinned staging buffer ----
  Packer pack(staging_host_, staging_dev_, staging_bytes_);
  auto [ids_h, ids_d] = pack.Take<int32_t>(T);
  auto [pos_h, pos_d] = pack.Take<int32_t>(T);
  auto [len_h, len_d] = pack.Take<int32_t>(T);
  auto [rseq_h, rseq_d] = pack.Take<int32_t>(T);
  auto [cu_h, cu_d] = pack.Take<int32_t>(S + 1);
  auto [sl_h, sl_d] = pack.Take<int32_t>(S);
  auto [rows_h, rows_d] = pack.Take<int32_t>(static_cast<size_t>(na + nb));
  auto [temp_h, temp_d] = pack.Take<float>(na);
  auto [topk_h, topk_d] = pack.Take<int32_t>(na);
  auto [topp_h, topp_d] = pack.Take<float>(na);
  auto [seed_h, seed_d] = pack.Take<uint64_t>(na);
  auto [ctr_h, ctr_d] = pack.Take<uint64_t>(na);
  auto [minp_h, minp_d] = pack.Take<float>(na);
  auto [lpn_h, lpn_d] = pack.Take<int32_t>(na);
  auto [tgt_h, tgt_d] = pack.Take<int32_t>(nb);
  auto [allow_h, allow_d] = pack.Take<int32_t>(na);
  m.allowed_rows = allow_d;
  m.min_p = minp_d;
  m.logprobs = lpn_d;
  m.part_b_target_dev = tgt_d;
  std::copy(m.part_b_target.begin(), m.part_b_target.end(), tgt_h);
  m.ids = ids_d;
  m.positions = pos_d;
  m.row_lens = len_d;
  m.row_seq = rseq_d;
  m.cu_q_lens = cu_d;
  m.seq_lens = sl_d;
  m.head_rows = rows_d;
  m.temperature = temp_d;
  m.top_k = topk_d;
  m.top_p = topp_d;
  m.seed = seed_d;
  m.rng_counter = ctr_d;
  for (int32_t s = 0; s < S; ++s) {
    cu_h[s] = m.row0[s];
    sl_h[s] = m.end_pos[s];
    if (s >= S_real) {
      ids_h[s] = 0;
      pos_h[s] = 0;
      len_h[s] = 1;
      rseq_h[s] = s;
      continue;
    }
    const SequenceStep& st = batch.seqs[s];
    for (int32_t i = 0; i < m.row0[s + 1] - m.row0[s]; ++i) {
      const int32_t r = m.row0[s] + i;
      ids_h[r] = static_cast<int32_t>(st.tokens[i]);
      pos_h[r] = static_cast<int32_t>(st.start_position + i);
      len_h[r] = pos_h[r] + 1;
      rseq_h[r] = s;
    }
  }
  cu_h[S] = T;
  for (size_t pi = 0; pi < P; ++pi) {
    auto [slot_h, slot_d] = pack.Take<int32_t>(T);
    auto [tab_h, tab_d] = pack.Take<int32_t>(static_cast<size_t>(S) * stride);
    m.slots.push_back(slot_d);
    m.tables.push_back(tab_d);
    for (int32_t s = 0; s < S; ++s) {
      int32_t* row = tab_h + static_cast<size_t>(s) * stride;
      if (s >= S_real) {  // padding reads position 0 of block 0 and writes nothing
        for (size_t j = 0; j < stride; ++j) row[j] = j == 0 ? 0 : -1;
        slot_h[s] = -1;
        continue;
      }
      const auto& table = batch.seqs[s].block_tables[pi];
      for (size_t j = 0; j < stride; ++j) {
        row[j] = j < table.size() && table[j] != kNoBlock ? static_cast<int32_t>(table[j]) : -1;
      }
      for (int32_t r = m.row0[s]; r < m.row0[s + 1]; ++r) {
        const int64_t pos = pos_h[r];
        slot_h[r] = static_cast<int32_t>(static_cast<int64_t>(table[pos / B]) * B + pos % B);
      }
    }
  }
  for (int32_t a = 0; a < na; ++a) {
    rows_h[a] = m.row0[part_a_seq[a] + 1] - 1;
    if (part_a_seq[a] >= S_real) {
      temp_h[a] = 0.0f;
      topk_h[a] = 0;
      topp_h[a] = 1.0f;
      seed_h[a] = 0;
      ctr_h[a] = 0;
      minp_h[a] = 0.0f;
      lpn_h[a] = -1;
      allow_h[a] = 0;
      continue;
    }
    const SequenceStep& st = batch.seqs[part_a_seq[a]];
    const bool sample = st.sample;
    const SamplingParams& sp = *st.sampling;
    temp_h[a] = sample ? sp.temperature : 0.0f;
    topk_h[a] = sample ? sp.top_k : 0;
    topp_h[a] = sample ? sp.top_p : 1.0f;
    seed_h[a] = st.seed;
    ctr_h[a] = st.rng_counter;
    minp_h[a] = sample ? sp.min_p : 0.0f;
    lpn_h[a] = sample ? sp.logprobs : -1;
    // Constrained: the row's mask is written into allowed_host_ once the logits are queued
    // (FillAndUploadMasks), not here.
    allow_h[a] = HasTokenBitmask(st) ? 1 : 0;
    if (allow_h[a] != 0) {
      m.masked_rows.push_back(a);
      m.allowed_upload = a + 1;
    }
    m.want_logprobs = m.want_logprobs || lpn_h[a] >= 0;
  }
  // Logit adjustments of the sampled rows (penalties, logit_bias); none in a graphed step.
  adjust_scratch_.clear();
  bool any_adjust = false;
  for (int32_t a = 0; a < na && !any_adjust; ++a) {
    const int32_t s = part_a_seq[a];
    any_adjust = s < S_real && batch.seqs[s].sample && batch.seqs[s].sampling->penalized();
  }
  if (any_adjust) {
    auto [begin_h, begin_d] = pack.Take<int32_t>(static_cast<size_t>(na) + 1);
    m.adjust_begin = begin_d;
    begin_h[0] = 0;
    for (int32_t a = 0; a < na; ++a) {
      const int32_t s = part_a_seq[a];
      if (s < S_real && batch.seqs[s].sample) {
        const SequenceStep& st = batch.seqs[s];
        BuildLogitAdjusts(*st.sampling, st.history, static_cast<size_t>(st.prompt_len), &adjust_row_);
        adjust_scratch_.insert(adjust_scratch_.end(), adjust_row_.begin(), adjust_row_.end());
      }
      begin_h[a + 1] = static_cast<int32_t>(adjust_scratch_.size());
    }
    m.adjust_entries = static_cast<int32_t>(adjust_scratch_.size());
  }
  for (int32_t j = 0; j < nb; ++j) rows_h[na + j] = part_b[j].second;
  if (kernels::RopeDependsOnLength(rope_)) {  // each sequence's frequencies at its new length
    const size_t half = inv_freq_host_.size();
    auto [freq_h, freq_d] = pack.Take<float>(static_cast<size_t>(S) * half);
    m.seq_inv_freq = freq_d;
    for (int32_t s = 0; s < S; ++s) {
      const bool grown = s < S_real && m.end_pos[s] > rope_.max_position_embeddings;
      const std::vector<float> inv = grown ? kernels::RopeInvFreq(rope_, m.end_pos[s]) : std::vector<float>();
      std::copy_n(grown ? inv.data() : inv_freq_host_.data(), half, freq_h + static_cast<size_t>(s) * half);
    }
  }
  size_t used = pack.used();
  if (options_.max_loras > 0) PackLora(batch, &m, staging_host_, staging_dev_, &used);
  m.staging_used = used;
}

Status CudaBackend::FillAndUploadMasks(const StepBatch& batch, const StepMeta& m) {
  if (m.masked_rows.empty()) return Status::Ok();
  // The previous step's upload of these rows has completed: Execute returned after it (3).
  const size_t words = static_cast<size_t>(allowed_words_);
  for (int32_t a : m.masked_rows) {
    const std::span<uint32_t> row(allowed_host_ + static_cast<size_t>(a) * words, words);
    const Status st = FillStepTokenBitmask(batch, static_cast<size_t>(m.part_a_seq[a]), row);
    if (!st.ok()) {
      cudaStreamSynchronize(stream_);  // the step's queued work ends before the error goes out
      return st;
    }
  }
  // On the copy stream: the upload overlaps what remains of the logits' work (the host is
  // usually done first), and the sampling kernel waits for it. The previous step's kernel,
  // the last reader of allowed_dev_, has completed (3).
  const size_t bytes = static_cast<size_t>(m.allowed_upload) * words * sizeof(uint32_t);
  KVF_CUDA_RETURN(cudaMemcpyAsync(allowed_dev_, allowed_host_, bytes, cudaMemcpyHostToDevice, mask_stream_));
  KVF_CUDA_RETURN(cudaEventRecord(masks_uploaded_, mask_stream_));
  KVF_CUDA_RETURN(cudaStreamWaitEvent(stream_, masks_uploaded_, 0));
  return Status::Ok();
}

Status CudaBackend::UploadMeta(const StepMeta& m) {
  KVF_CUDA_RETURN(cudaMemcpyAsync(staging_dev_, staging_host_, m.staging_used, cudaMemcpyHostToDevice, stream_));
  if (m.adjust_entries > 0) {
    const size_t n = static_cast<size_t>(m.adjust_entries);
    KVF_RETURN_IF_ERROR(ReserveAdjust(n));
    std::copy(adjust_scratch_.begin(), adjust_scratch_.end(), adjust_host_);
    KVF_CUDA_RETURN(cudaMemcpyAsync(adjust_dev_, adjust_host_, n * sizeof(kernels::LogitAdjust), cudaMemcpyHostToDevice,
                                    stream_));
  }
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
