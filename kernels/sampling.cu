#include "kernels/sampling.cuh"

namespace kvfleet::kernels {

cudaError_t LaunchSampling(const SamplingParams& p, cudaStream_t stream) {
  if (p.num_seqs <= 0) return cudaSuccess;
  if (p.vocab <= 0) return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(sample::SamplingKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       sample::kHistBytes);
  if (e != cudaSuccess) return e;
  if (p.logprobs && (!p.token_logprob || !p.top_tokens || !p.top_logprobs)) return cudaErrorInvalidValue;
  if (p.adjust_begin && (!p.adjust || !p.adjust_raw)) return cudaErrorInvalidValue;
  return LaunchKernel(sample::SamplingKernel, p.num_seqs, sample::kThreads, sample::kHistBytes, stream, p);
}

cudaError_t LaunchLogprobs(const LogprobsParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.vocab <= 0 || p.top < 0 || p.top > kMaxTopLogprobs) return cudaErrorInvalidValue;
  return LaunchKernel(sample::LogprobsKernel, p.rows, sample::kThreads, 0, stream, p);
}

}  // namespace kvfleet::kernels
