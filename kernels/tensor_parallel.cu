// Kernels of tensor parallelism: see tensor_parallel.h.
#include "kernels/tensor_parallel.h"

#include <algorithm>

namespace kvfleet::kernels {
namespace {

__global__ void EmbeddingSliceKernel(const int32_t* ids, const __nv_bfloat16* table, int32_t vocab_begin,
                                     int32_t vocab, __nv_bfloat16* out, int32_t hidden) {
  const int32_t t = blockIdx.x;
  const int32_t id = ids[t] - vocab_begin;
  const bool held = id >= 0 && id < vocab;
  const uint4* src = reinterpret_cast<const uint4*>(table + (held ? static_cast<int64_t>(id) * hidden : 0));
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(t) * hidden);
  for (int32_t i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = held ? src[i] : make_uint4(0, 0, 0, 0);
}

__global__ void GatherVocabKernel(const float* gathered, float* out, int32_t ranks, int32_t rows, int32_t slice,
                                  int32_t vocab) {
  const int32_t r = blockIdx.y;
  for (int32_t v = blockIdx.x * blockDim.x + threadIdx.x; v < vocab; v += gridDim.x * blockDim.x) {
    const int32_t k = v / slice, c = v - k * slice;
    out[static_cast<int64_t>(r) * vocab + v] = gathered[(static_cast<int64_t>(k) * rows + r) * slice + c];
  }
}

// One thread. About ten seconds of spinning at ~2 GHz before giving up.
constexpr long long kBarrierSpinCycles = 20'000'000'000LL;

__global__ void RankBarrierKernel(unsigned long long* flags, unsigned long long* counters, int32_t rank,
                                  int32_t ranks) {
  const unsigned long long epoch = ++counters[rank];
  __threadfence_system();  // this stream's writes before the flag
  atomicExch(&flags[rank], epoch);
  const long long start = clock64();
  for (int32_t k = 0; k < ranks; ++k) {
    while (atomicAdd(&flags[k], 0ull) < epoch) {
      if (clock64() - start > kBarrierSpinCycles) __trap();
    }
  }
  __threadfence_system();
}

__global__ void SumRanksKernel(RankInputs in, int32_t ranks, __nv_bfloat16* out, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int32_t k = 0; k < ranks; ++k) s += __bfloat162float(in.in[k][i]);
    out[i] = __float2bfloat16(s);
  }
}

}  // namespace

cudaError_t LaunchEmbeddingSlice(const int32_t* ids, const __nv_bfloat16* table, int32_t vocab_begin, int32_t vocab,
                                 __nv_bfloat16* out, int32_t tokens, int32_t hidden, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  if (hidden % 8 != 0) return cudaErrorInvalidValue;
  EmbeddingSliceKernel<<<tokens, 256, 0, stream>>>(ids, table, vocab_begin, vocab, out, hidden);
  return cudaGetLastError();
}

cudaError_t LaunchGatherVocabSlices(const float* gathered, float* out, int32_t ranks, int32_t rows, int32_t slice,
                                    int32_t vocab, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (ranks < 1 || slice <= 0 || static_cast<int64_t>(slice) * ranks < vocab || rows > 65535) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((vocab + 255) / 256, 1024)), static_cast<unsigned>(rows));
  GatherVocabKernel<<<grid, 256, 0, stream>>>(gathered, out, ranks, rows, slice, vocab);
  return cudaGetLastError();
}

cudaError_t LaunchRankBarrier(unsigned long long* flags, unsigned long long* counters, int32_t rank, int32_t ranks,
                              cudaStream_t stream) {
  if (ranks < 1 || ranks > kMaxTensorRanks || rank < 0 || rank >= ranks) return cudaErrorInvalidValue;
  RankBarrierKernel<<<1, 1, 0, stream>>>(flags, counters, rank, ranks);
  return cudaGetLastError();
}

cudaError_t LaunchSumRanks(const RankInputs& in, int32_t ranks, __nv_bfloat16* out, int64_t count,
                           cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (ranks < 1 || ranks > kMaxTensorRanks) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 4096);
  SumRanksKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(in, ranks, out, count);
  return cudaGetLastError();
}

}  // namespace kvfleet::kernels
