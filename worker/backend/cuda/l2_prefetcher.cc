#include "worker/backend/cuda/l2_prefetcher.h"

#include "kernels/l2_prefetch.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {

L2Prefetcher::~L2Prefetcher() {
  if (side_ != nullptr) cudaStreamSynchronize(side_);
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (join_ != nullptr) cudaEventDestroy(join_);
  if (side_ != nullptr) cudaStreamDestroy(side_);
}

Status L2Prefetcher::Init() {
  KVF_CUDA_RETURN(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  KVF_CUDA_RETURN(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  return Status::Ok();
}

Status L2Prefetcher::Prefetch(cudaStream_t stream, const void* p, size_t bytes, bool evict_last) {
  if (side_ == nullptr || p == nullptr || bytes == 0) return Status::Ok();
  KVF_CUDA_RETURN(cudaEventRecord(fork_, stream));
  KVF_CUDA_RETURN(cudaStreamWaitEvent(side_, fork_, 0));
  KVF_CUDA_RETURN(kernels::LaunchL2Prefetch(p, bytes, evict_last, side_));
  pending_ = true;
  return Status::Ok();
}

Status L2Prefetcher::Join(cudaStream_t stream) {
  if (!pending_) return Status::Ok();
  KVF_CUDA_RETURN(cudaEventRecord(join_, side_));
  KVF_CUDA_RETURN(cudaStreamWaitEvent(stream, join_, 0));
  pending_ = false;
  return Status::Ok();
}

}  // namespace kvfleet::backend::cuda
