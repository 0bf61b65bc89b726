// Kernels of tensor parallelism (worker/backend/tensor_parallel.h): the vocab-parallel
// embedding lookup and logits gather, and the pieces of the same-device communicator
// (worker/backend/cuda/cuda_comm.h), which puts several ranks on one GPU for tests: a
// barrier between the ranks' streams and the rank-ordered sum.
// Framework-free: raw pointers, every shape in a comment. Each launcher takes a stream and
// returns cudaError_t; every launch is a plain one (no PDL), so it starts after the work
// before it on its stream has finished, and it can be captured in a CUDA graph.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvfleet::kernels {

// Most ranks a launch takes (--tensor-parallel's largest N).
constexpr int32_t kMaxTensorRanks = 8;

// out[t] = table[ids[t] - vocab_begin] when the id is in [vocab_begin, vocab_begin + vocab),
// else a zero row (the rows other ranks hold; the all-reduce adds them in exactly).
//   ids: [tokens]; table: [vocab][hidden] (this rank's rows); out: [tokens][hidden].
// REQUIRES: hidden % 8 == 0.
cudaError_t LaunchEmbeddingSlice(const int32_t* ids, const __nv_bfloat16* table, int32_t vocab_begin, int32_t vocab,
                                 __nv_bfloat16* out, int32_t tokens, int32_t hidden, cudaStream_t stream);

// Rearranges the gathered vocab slices into whole rows:
//   out[r][begin_k + c] = gathered[k][r][c] for c < width_k, where rank k's slice begins at
//   k * slice and is width_k = min(slice, vocab - k * slice) wide (tensor_parallel.h).
//   gathered: [ranks][rows][slice] fp32; out: [rows][vocab] fp32.
cudaError_t LaunchGatherVocabSlices(const float* gathered, float* out, int32_t ranks, int32_t rows, int32_t slice,
                                    int32_t vocab, cudaStream_t stream);

// A barrier between the streams of `ranks` ranks on one device: rank `rank`'s launch
// increments counters[rank], publishes it in flags[rank] and spins until every rank's flag
// has reached it. Every rank must launch the same number of barriers. A rank missing for
// about ten seconds traps (a CUDA error on every stream), never a silent hang.
//   flags, counters: [ranks] device memory, zeroed before the first barrier.
cudaError_t LaunchRankBarrier(unsigned long long* flags, unsigned long long* counters, int32_t rank, int32_t ranks,
                              cudaStream_t stream);

// out[i] = bf16(sum over k = 0, 1, ..., ranks - 1 of in[k][i]), added in fp32 in rank order
// (the same bits whatever the timing). out may be one of the inputs.
//   in: ranks pointers to [count] bf16; out: [count].
struct RankInputs {
  const __nv_bfloat16* in[kMaxTensorRanks] = {};
};
cudaError_t LaunchSumRanks(const RankInputs& in, int32_t ranks, __nv_bfloat16* out, int64_t count,
                           cudaStream_t stream);

}  // namespace kvfleet::kernels
