// CudaBackend, sampling and the step's outputs: the LM head over the rows that need logits,
// the sampling kernel, and the copy of tokens and logits back into the StepOutput.
// Thread-compatible, as CudaBackend: the engine thread calls it.
#include <algorithm>
#include <cstring>

#include "kernels/gemv.h"
#include "kernels/sampling.h"
#include "kernels/small_kernels.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {

int64_t CudaBackend::ShapeOutput(const StepBatch& batch, const StepMeta& m, StepOutput* out) const {
  const int64_t V = config_.vocab_size;
  const int32_t S_real = static_cast<int32_t>(batch.seqs.size());
  // Output rows of logits, per sequence.
  out->tokens.assign(S_real, kNoToken);
  out->logits_offset.assign(S_real, -1);
  out->logprobs.assign(S_real, {});
  out->prompt_logprobs.assign(S_real, {});
  int64_t out_rows = 0;
  for (int32_t s = 0; s < S_real; ++s) {
    const SequenceStep& st = batch.seqs[s];
    if (st.logits == LogitsRequest::kNone) continue;
    out->logits_offset[s] = out_rows;
    out_rows += st.logits == LogitsRequest::kAll ? m.row0[s + 1] - m.row0[s] : 1;
  }
  out->logits.resize(static_cast<size_t>(out_rows * V));
  return out_rows;
}

Status CudaBackend::LmHead(const StepMeta& m, const int32_t* rows_dev, int32_t n) {
  const int64_t H = config_.hidden_size, V = config_.vocab_size;
  const int32_t Hi = static_cast<int32_t>(H);
  KVF_CUDA_RETURN(kernels::LaunchEmbedding(rows_dev, xn_, head_in_, n, m.num_tokens, Hi, stream_));
  if (comm_ != nullptr) {  // (8) vocab-parallel: this rank's slice of every row, then gathered
    const int64_t Vr = vocab_rows_;
    if (n <= tuning_.gemv_max_rows) {
      KVF_RETURN_IF_ERROR(CudaStatus(kernels::LaunchGemv(lm_head_, head_in_, nullptr, vocab_local_, /*out_f32=*/true,
                                                         static_cast<int32_t>(Vr), n, Hi, stream_),
                                     "LaunchGemv"));
    } else {
      KVF_RETURN_IF_ERROR(gemm_->Run(lm_head_, head_in_, nullptr, vocab_local_, LtGemm::Out::kF32, Vr, n, H, stream_));
    }
    return GatherLogits(n);
  }
  if (n <= tuning_.gemv_max_rows) {  // (5)
    return CudaStatus(kernels::LaunchGemv(lm_head_, head_in_, nullptr, logits_, /*out_f32=*/true,
                                          static_cast<int32_t>(V), n, Hi, stream_),
                      "LaunchGemv");
  }
  return gemm_->Run(lm_head_, head_in_, nullptr, logits_, LtGemm::Out::kF32, V, n, H, stream_);
}

Status CudaBackend::CopyLogprobsBack(int32_t rows) {
  const size_t n = static_cast<size_t>(rows), top = n * kernels::kMaxTopLogprobs;
  KVF_CUDA_RETURN(cudaMemcpyAsync(lp_token_host_, lp_token_dev_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  KVF_CUDA_RETURN(
      cudaMemcpyAsync(lp_top_tok_host_, lp_top_tok_dev_, top * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  KVF_CUDA_RETURN(
      cudaMemcpyAsync(lp_top_val_host_, lp_top_val_dev_, top * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  return Status::Ok();
}

TokenLogprobs CudaBackend::LogprobsOfRow(int32_t row, TokenId token, int32_t top) const {
  TokenLogprobs lp{token, lp_token_host_[row], {}};
  for (int32_t k = 0; k < top; ++k) {
    const size_t i = static_cast<size_t>(row) * kernels::kMaxTopLogprobs + k;
    lp.top.emplace_back(static_cast<TokenId>(lp_top_tok_host_[i]), lp_top_val_host_[i]);
  }
  return lp;
}

Status CudaBackend::Sample(const StepMeta& m) {
  const int32_t na = static_cast<int32_t>(m.part_a_seq.size());
  if (na > 0) {  // part A's logits are queued (EnqueueLogits)
    kernels::SamplingParams sp;
    sp.logits = logits_;
    sp.temperature = m.temperature;
    sp.top_k = m.top_k;
    sp.top_p = m.top_p;
    sp.seed = m.seed;
    sp.step = m.rng_counter;
    sp.tokens = tokens_dev_;
    sp.num_seqs = na;
    sp.vocab = static_cast<int32_t>(config_.vocab_size);
    sp.min_p = m.min_p;
    sp.allowed_rows = m.allowed_rows;
    sp.allowed = allowed_dev_;
    sp.allowed_words = allowed_words_;
    if (m.adjust_entries > 0) {
      sp.adjust_begin = m.adjust_begin;
      sp.adjust = adjust_dev_;
      sp.adjust_raw = adjust_raw_dev_;
    }
    if (m.want_logprobs) {
      sp.logprobs = m.logprobs;
      sp.token_logprob = lp_token_dev_;
      sp.top_tokens = lp_top_tok_dev_;
      sp.top_logprobs = lp_top_val_dev_;
    }
    KVF_CUDA_RETURN(kernels::LaunchSampling(sp, stream_));
    KVF_CUDA_RETURN(cudaMemcpyAsync(tokens_host_, tokens_dev_, na * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    if (m.want_logprobs) KVF_RETURN_IF_ERROR(CopyLogprobsBack(na));
  }
  return Status::Ok();
}

Status CudaBackend::CollectOutput(const StepBatch& batch, const StepMeta& m, int64_t out_rows, StepOutput* out) {
  const int64_t V = config_.vocab_size;
  const int32_t S_real = static_cast<int32_t>(batch.seqs.size());
  const std::vector<int32_t>& part_a_seq = m.part_a_seq;
  const std::vector<std::pair<int32_t, int32_t>>& part_b = m.part_b;
  const int32_t na = static_cast<int32_t>(part_a_seq.size());
  const int32_t nb = static_cast<int32_t>(part_b.size());
  if (na > 0 && out_rows > 0) {
    KVF_CUDA_RETURN(cudaMemcpyAsync(logits_host_, logits_, static_cast<size_t>(na) * V * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  }
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));  // (3)
  for (int32_t a = 0; a < na; ++a) {
    const int32_t s = part_a_seq[a];
    if (s >= S_real) continue;
    const SequenceStep& st = batch.seqs[s];
    if (st.sample) out->tokens[s] = static_cast<TokenId>(tokens_host_[a]);
    if (st.sample && st.sampling->logprobs >= 0) out->logprobs[s] = LogprobsOfRow(a, out->tokens[s], st.sampling->logprobs);
    if (st.logits != LogitsRequest::kNone) {
      const int64_t dst = out->logits_offset[s] + (st.logits == LogitsRequest::kAll ? m.row0[s + 1] - m.row0[s] - 1 : 0);
      std::memcpy(&out->logits[dst * V], logits_host_ + static_cast<size_t>(a) * V, V * sizeof(float));
    }
  }
  for (int32_t j0 = 0; j0 < nb; j0 += static_cast<int32_t>(logits_rows_)) {
    const int32_t n = std::min<int32_t>(static_cast<int32_t>(logits_rows_), nb - j0);
    KVF_RETURN_IF_ERROR(LmHead(m, m.head_rows + na + j0, n));
    const bool logits = std::any_of(m.part_b_logits.begin() + j0, m.part_b_logits.begin() + j0 + n, [](uint8_t x) { return x; });
    const bool logprobs = std::any_of(m.part_b_target.begin() + j0, m.part_b_target.begin() + j0 + n, [](int32_t t) { return t >= 0; });
    if (logits) {
      KVF_CUDA_RETURN(cudaMemcpyAsync(logits_host_, logits_, static_cast<size_t>(n) * V * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream_));
    }
    if (logprobs) {  // prompt logprobs of the chunk's rows (the others skipped)
      kernels::LogprobsParams lp;
      lp.logits = logits_;
      lp.target = m.part_b_target_dev + j0;
      lp.top = m.prompt_top;
      lp.token_logprob = lp_token_dev_;
      lp.top_tokens = lp_top_tok_dev_;
      lp.top_logprobs = lp_top_val_dev_;
      lp.rows = n;
      lp.vocab = static_cast<int32_t>(V);
      KVF_CUDA_RETURN(kernels::LaunchLogprobs(lp, stream_));
      KVF_RETURN_IF_ERROR(CopyLogprobsBack(n));
    }
    KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
    for (int32_t j = j0; j < j0 + n; ++j) {
      const auto [s, r] = part_b[j];
      if (m.part_b_logits[j]) {
        const int64_t dst = out->logits_offset[s] + (r - m.row0[s]);
        std::memcpy(&out->logits[dst * V], logits_host_ + static_cast<size_t>(j - j0) * V, V * sizeof(float));
      }
      if (m.part_b_target[j] >= 0) {
        out->prompt_logprobs[s].push_back(LogprobsOfRow(j - j0, static_cast<TokenId>(m.part_b_target[j]),
                                                        batch.seqs[s].sampling->logprobs));
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
