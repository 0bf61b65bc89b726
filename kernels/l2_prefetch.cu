#include "kernels/l2_prefetch.h"

#include <algorithm>
#include <cstdint>

namespace kvfleet::kernels {
namespace {

constexpr uint32_t kChunkBytes = 16 * 1024;
// Enough issuing threads to keep the TMA units of a few SMs busy, few enough that the
// prefetch takes no SM time from the kernels it overlaps.
constexpr int kPrefetchBlocks = 16;
constexpr int kPrefetchThreads = 32;

__global__ void L2PrefetchKernel(const char* p, size_t chunks, uint32_t tail_bytes, bool evict_last) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t policy = 0;
  if (evict_last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < chunks; i += stride) {
    const char* a = p + i * kChunkBytes;
    const uint32_t n = i + 1 == chunks && tail_bytes != 0 ? tail_bytes : kChunkBytes;
    if (evict_last) {
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(a), "r"(n), "l"(policy)
                   : "memory");
    } else {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
    }
  }
#endif
}

}  // namespace

cudaError_t LaunchL2Prefetch(const void* p, size_t bytes, bool evict_last, cudaStream_t stream) {
  bytes &= ~size_t{15};
  if (p == nullptr || bytes == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return cudaErrorInvalidValue;
  const size_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  const uint32_t tail = static_cast<uint32_t>(bytes % kChunkBytes);
  const int blocks = static_cast<int>(std::min<size_t>(kPrefetchBlocks, (chunks + kPrefetchThreads - 1) / kPrefetchThreads));
  L2PrefetchKernel<<<blocks, kPrefetchThreads, 0, stream>>>(static_cast<const char*>(p), chunks, tail, evict_last);
  return cudaGetLastError();
}

}  // namespace kvfleet::kernels
