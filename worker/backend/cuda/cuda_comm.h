// CudaComm: the collectives of the cuda backend's tensor-parallel ranks (tensor_parallel.h),
// one object for the N ranks of one worker process, each rank a thread with its own stream.
//
// Two implementations, chosen by the ranks' devices (CudaComm::Make):
//   - NCCL over N distinct GPUs: ncclCommInitAll from this one process (worker/backend/README.md: one
//     worker process, one thread per GPU). NCCL_NVLS_ENABLE is set to 0 unless the
//     environment sets it: NVLink multicast stays off.
//   - Same device, for tests on one GPU (NCCL refuses two ranks on one device): each rank
//     copies its buffer into its own staging area, the ranks' streams meet at a barrier,
//     every rank sums the staging areas in rank order 0..N-1 (deterministic), and a second
//     barrier frees the staging areas for the next call. Eagerly the barrier is events and
//     a host barrier between the rank threads; captured in a graph, a device-side barrier
//     kernel (kernels/tensor_parallel.h).
// Both enqueue asynchronously on the caller's stream and both can be captured in a CUDA
// graph (NCCL supports capture; the same-device path is copies and plain kernels).
//
// RankThreads runs one function per rank at once: rank 0 on the calling (engine) thread,
// ranks 1..N-1 on threads it owns, asleep between steps.
//
// Thread safety: a rank's calls come from its own thread; every rank makes the same sequence
// of collective calls with the same counts (as with NCCL), or the group deadlocks (the
// same-device barrier traps after about ten seconds instead).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <barrier>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace kvfleet::backend::cuda {

class CudaComm {
 public:
  // devices[r]: rank r's CUDA device. All equal: the same-device implementation; all
  // distinct: NCCL (Unimplemented in a build without NCCL). max_reduce: the most elements
  // one AllReduceSum takes; max_gather: the most floats one rank sends in one AllGather.
  static Result<std::unique_ptr<CudaComm>> Make(std::span<const int> devices, int64_t max_reduce,
                                                int64_t max_gather);
  virtual ~CudaComm() = default;

  int ranks() const { return ranks_; }
  // "nccl" or "same-device".
  virtual const char* kind() const = 0;
  // buf[0, count) = the element-wise sum of every rank's buf, on `stream`.
  // REQUIRES: count <= max_reduce; stream is the rank's stream on its device.
  virtual Status AllReduceSum(int rank, __nv_bfloat16* buf, int64_t count, cudaStream_t stream) = 0;
  // recv[k][0, count) = rank k's send[0, count), for every k, on `stream`.
  // REQUIRES: count <= max_gather; recv holds ranks() * count floats.
  virtual Status AllGather(int rank, const float* send, float* recv, int64_t count, cudaStream_t stream) = 0;
  // Returns when every rank's thread has called it (no device work). The backend calls it
  // between instantiating new CUDA graphs and launching them, so no rank's collective is
  // waiting on the device while another rank's instantiation loads kernels (which may
  // synchronise the context).
  void HostBarrier() { host_barrier_.arrive_and_wait(); }

 protected:
  explicit CudaComm(int ranks) : ranks_(ranks), host_barrier_(ranks) {}
  const int ranks_;
  std::barrier<> host_barrier_;
};

// Parses extra["tp_devices"] ("0,0": two ranks on GPU 0) into one device per rank; without
// it, ranks take devices first_device, first_device + 1, .... Checks there are that many
// GPUs and that the devices are all equal or all distinct; errors name the flag.
Result<std::vector<int>> TensorParallelDevices(int32_t ranks, int first_device, const std::string* tp_devices);

class RankThreads {
 public:
  explicit RankThreads(int ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  // Runs fn(r) for every rank r at once, rank 0 on the calling thread; returns the first
  // error in rank order when all are done.
  Status Run(const std::function<Status(int)>& fn);

 private:
  void Loop(int rank);

  const int ranks_;
  std::barrier<> start_, done_;
  const std::function<Status(int)>* fn_ = nullptr;  // the current Run's; read after the start barrier
  bool stop_ = false;                                // set before the last start barrier
  std::vector<Status> results_;                      // [rank]
  std::vector<std::thread> threads_;                 // ranks 1..N-1
};

}  // namespace kvfleet::backend::cuda
