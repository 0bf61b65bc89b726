#include "kernels/sampling.cuh"

namespace kvfleet::kernels {

cudaError_t LaunchSampling(const SamplingParams& p, cudaStream_t stream) {
  if (p.num_seqs <= 0) return cudaSuccess;
  if (p.vocab <= 0) return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(sample::SamplingKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       sample::kHistBytes);
  if (e != cudaSuccess) return e;
  return LaunchKernel(sample::SamplingKernel, p.num_seqs, sample::kThreads, sample::kHistBytes, stream, p);
}

}  // namespace kvfleet::kernels
