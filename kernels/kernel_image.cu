#include "kernels/kernel_image.h"

namespace kvfleet::kernels {
namespace {
__global__ void ProbeKernel() {}
}  // namespace

cudaError_t CheckKernelImage(int device) {
  cudaFuncAttributes attributes{};
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attributes, ProbeKernel);
  return e;
}

}  // namespace kvfleet::kernels
