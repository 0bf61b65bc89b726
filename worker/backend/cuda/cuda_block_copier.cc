#include "worker/backend/cuda/cuda_block_copier.h"

#include <set>
#include <utility>

#include "common/check.h"
#include "kernels/kv_block_copy.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {

Result<std::unique_ptr<CudaBlockCopier>> CudaBlockCopier::Make(std::vector<Pool> pools, cudaStream_t stream,
                                                              int device) {
  std::unique_ptr<CudaBlockCopier> c(new CudaBlockCopier());
  c->pools_ = std::move(pools);
  c->stream_ = stream;
  c->device_ = device;
  KVF_CUDA_RETURN(cudaHostAlloc(reinterpret_cast<void**>(&c->pairs_), sizeof(int32_t) * 2 * config::kMaxCopyPairs,
                                cudaHostAllocDefault));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&c->done_, cudaEventDisableTiming));
  return c;
}

CudaBlockCopier::~CudaBlockCopier() {
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (pairs_ != nullptr) cudaFreeHost(pairs_);
}

void CudaBlockCopier::Copy(std::span<const kv::BlockCopy> copies) {
  if (copies.empty()) return;
  KVF_CHECK(cudaSetDevice(device_) == cudaSuccess) << "block copy: cannot select device " << device_;
  // The previous call's kernels may still read the pairs buffer.
  KVF_CHECK(cudaEventSynchronize(done_) == cudaSuccess) << "block copy: waiting for the previous copies failed";
  int32_t used = 0;  // pairs filled in this call
  size_t i = 0;
  while (i < copies.size()) {
    const kv::BlockCopy& first = copies[i];
    KVF_CHECK(first.pool < pools_.size()) << "block copy: pool " << first.pool << " out of range";
    const Pool& pool = pools_[first.pool];
    const std::byte* src = first.src_tier == kv::Tier::kDevice ? pool.device : pool.host;
    std::byte* dst = first.dst_tier == kv::Tier::kDevice ? pool.device : pool.host;
    KVF_CHECK(src != nullptr && dst != nullptr) << "block copy: pool " << first.pool << " has no host tier";
    if (used == config::kMaxCopyPairs) {  // buffer full: wait for the launches that read it
      KVF_CHECK(cudaStreamSynchronize(stream_) == cudaSuccess) << "block copy: stream sync failed";
      used = 0;
    }
    // One run: same pool and tiers, no block read or written after an earlier write (1).
    // Within one tier the kernel needs destinations distinct from every source of the run.
    const bool same_tier = first.src_tier == first.dst_tier;
    std::set<kv::BlockId> read, written;
    const int32_t run0 = used;
    for (; i < copies.size() && used < config::kMaxCopyPairs; ++i) {
      const kv::BlockCopy& c = copies[i];
      if (c.pool != first.pool || c.src_tier != first.src_tier || c.dst_tier != first.dst_tier) break;
      if (same_tier && c.src == c.dst) continue;  // a no-op
      if (written.count(c.dst) > 0 || (same_tier && (written.count(c.src) > 0 || read.count(c.dst) > 0))) break;
      written.insert(c.dst);
      read.insert(c.src);
      pairs_[2 * used] = static_cast<int32_t>(c.src);
      pairs_[2 * used + 1] = static_cast<int32_t>(c.dst);
      ++used;
    }
    const int32_t n = used - run0;
    if (n > 0) {
      const cudaError_t e = kernels::LaunchKvBlockCopy(src, dst, pairs_ + 2 * run0, n,
                                                       static_cast<int64_t>(pool.bytes_per_block), stream_);
      KVF_CHECK(e == cudaSuccess) << "block copy launch failed: " << cudaGetErrorString(e);
    }
  }
  KVF_CHECK(cudaEventRecord(done_, stream_) == cudaSuccess) << "block copy: event record failed";
}

}  // namespace kvfleet::backend::cuda
