#include "kernels/sampling.cuh"

namespace kvfleet::kernels {

cudaError_t LaunchSampling(const SamplingParams& p, cudaStream_t stream) {
  if (p.num_seqs <= 0) return cudaSuccess;
  if (p.vocab <= 0) return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(sample::SamplingKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       sample::kHistBytes);
  if (e != cudaSuccess) return e;
  sample::SamplingKernel<<<p.num_seqs, sample::kThreads, sample::kHistBytes, stream>>>(p);
  KVF_RETURN_LAUNCH_ERROR();
  return cudaSuccess;
}

}  // namespace kvfleet::kernels
