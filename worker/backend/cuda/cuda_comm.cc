// CudaComm's two implementations (NCCL, same device), the choice of the ranks' devices, and
// RankThreads. See cuda_comm.h.
#include "worker/backend/cuda/cuda_comm.h"

#include <array>
#include <barrier>
#include <cstdlib>
#include <set>

#include "kernels/tensor_parallel.h"
#include "worker/backend/cuda/cuda_util.h"

#ifdef KVFLEET_HAVE_NCCL
#include <nccl.h>
#endif

namespace kvfleet::backend::cuda {
namespace {

using bf16 = __nv_bfloat16;

// All ranks on one device: staging areas, flags and counters in its memory.
class SameDeviceComm final : public CudaComm {
 public:
  static Result<std::unique_ptr<CudaComm>> Make(int ranks, int device, int64_t max_reduce, int64_t max_gather) {
    std::unique_ptr<SameDeviceComm> c(new SameDeviceComm(ranks, device, max_reduce, max_gather));
    KVF_CUDA_RETURN(cudaSetDevice(device));
    KVF_CUDA_RETURN(cudaMalloc(&c->reduce_stage_, static_cast<size_t>(ranks * max_reduce) * sizeof(bf16)));
    KVF_CUDA_RETURN(cudaMalloc(&c->gather_stage_, static_cast<size_t>(ranks * max_gather) * sizeof(float)));
    KVF_CUDA_RETURN(cudaMalloc(&c->sync_, 2 * static_cast<size_t>(ranks) * sizeof(unsigned long long)));
    KVF_CUDA_RETURN(cudaMemset(c->sync_, 0, 2 * static_cast<size_t>(ranks) * sizeof(unsigned long long)));
    for (auto& phase : c->events_) {
      phase.resize(static_cast<size_t>(ranks));
      for (cudaEvent_t& e : phase) KVF_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    KVF_CUDA_RETURN(cudaDeviceSynchronize());
    return std::unique_ptr<CudaComm>(std::move(c));
  }
  ~SameDeviceComm() override {
    cudaSetDevice(device_);
    cudaFree(reduce_stage_);
    cudaFree(gather_stage_);
    cudaFree(sync_);
    for (auto& phase : events_) {
      for (cudaEvent_t e : phase) {
        if (e != nullptr) cudaEventDestroy(e);
      }
    }
  }
  const char* kind() const override { return "same-device"; }

  Status AllReduceSum(int rank, bf16* buf, int64_t count, cudaStream_t stream) override {
    if (count > max_reduce_) return Internal("same-device all-reduce of " + std::to_string(count) + " elements");
    bf16* mine = reduce_stage_ + rank * max_reduce_;
    KVF_CUDA_RETURN(cudaMemcpyAsync(mine, buf, count * sizeof(bf16), cudaMemcpyDeviceToDevice, stream));
    KVF_RETURN_IF_ERROR(Barrier(rank, stream, 0));
    kernels::RankInputs in;
    for (int k = 0; k < ranks_; ++k) in.in[k] = reduce_stage_ + k * max_reduce_;
    KVF_CUDA_RETURN(kernels::LaunchSumRanks(in, ranks_, buf, count, stream));
    return Barrier(rank, stream, 1);  // every rank has read the staging areas
  }

  Status AllGather(int rank, const float* send, float* recv, int64_t count, cudaStream_t stream) override {
    if (count > max_gather_) return Internal("same-device all-gather of " + std::to_string(count) + " floats");
    KVF_CUDA_RETURN(cudaMemcpyAsync(gather_stage_ + rank * max_gather_, send, count * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream));
    KVF_RETURN_IF_ERROR(Barrier(rank, stream, 0));
    KVF_CUDA_RETURN(cudaMemcpy2DAsync(recv, count * sizeof(float), gather_stage_, max_gather_ * sizeof(float),
                                      count * sizeof(float), ranks_, cudaMemcpyDeviceToDevice, stream));
    return Barrier(rank, stream, 1);
  }

 private:
  SameDeviceComm(int ranks, int device, int64_t max_reduce, int64_t max_gather)
      : CudaComm(ranks), device_(device), max_reduce_(max_reduce), max_gather_(max_gather) {}
  // Holds `stream` until every rank's stream has reached this point. Captured into a graph:
  // the device-side barrier kernel (graph instantiation loads every kernel, so it never
  // waits on a lazily loaded one). Eagerly: events and a host barrier between the rank
  // threads, no spinning kernel (a spinning kernel could deadlock against the context
  // synchronisation of CUDA's lazy module loading, the CUDA guide's "Lazy Loading").
  // `phase` 0 / 1: the barrier before / after the ranks read each other's staging areas.
  Status Barrier(int rank, cudaStream_t stream, int phase) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    KVF_CUDA_RETURN(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusActive) {
      return CudaStatus(kernels::LaunchRankBarrier(sync_, sync_ + ranks_, rank, ranks_, stream),
                        "LaunchRankBarrier");
    }
    std::vector<cudaEvent_t>& ev = events_[static_cast<size_t>(phase)];
    KVF_CUDA_RETURN(cudaEventRecord(ev[static_cast<size_t>(rank)], stream));
    HostBarrier();  // every rank's record is in before anyone waits on it
    for (int k = 0; k < ranks_; ++k) {
      if (k != rank) KVF_CUDA_RETURN(cudaStreamWaitEvent(stream, ev[static_cast<size_t>(k)], 0));
    }
    return Status::Ok();
  }

  const int device_;
  const int64_t max_reduce_, max_gather_;
  bf16* reduce_stage_ = nullptr;        // [ranks][max_reduce]
  float* gather_stage_ = nullptr;       // [ranks][max_gather]
  unsigned long long* sync_ = nullptr;  // flags [ranks], then counters [ranks]: the captured barrier
  // The eager barrier: [phase][rank] events, each re-recorded only after every rank has
  // waited on its previous record (the next phase's host barrier orders it).
  std::array<std::vector<cudaEvent_t>, 2> events_;
};

#ifdef KVFLEET_HAVE_NCCL
Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return Internal(std::string(what) + ": NCCL: " + ncclGetErrorString(r));
}
#define KVF_NCCL_RETURN(call) KVF_RETURN_IF_ERROR(NcclStatus((call), #call))

class NcclComm final : public CudaComm {
 public:
  static Result<std::unique_ptr<CudaComm>> Make(std::span<const int> devices) {
    // NVLink multicast (NVLS) stays off unless the environment asks for it: on a host whose GPUs
    // others share, a program that uses it can take them out of service.
    ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    const int n = static_cast<int>(devices.size());
    std::unique_ptr<NcclComm> c(new NcclComm(n));
    c->comms_.resize(static_cast<size_t>(n));
    std::vector<int> devs(devices.begin(), devices.end());
    KVF_NCCL_RETURN(ncclCommInitAll(c->comms_.data(), n, devs.data()));
    return std::unique_ptr<CudaComm>(std::move(c));
  }
  ~NcclComm() override {
    // One thread holds every rank's communicator: finalize them as a group (NCCL's
    // documented order for that case), then destroy each.
    ncclGroupStart();
    for (ncclComm_t comm : comms_) {
      if (comm != nullptr) ncclCommFinalize(comm);
    }
    ncclGroupEnd();
    for (ncclComm_t comm : comms_) {
      if (comm != nullptr) ncclCommDestroy(comm);
    }
  }
  const char* kind() const override { return "nccl"; }
  Status AllReduceSum(int rank, bf16* buf, int64_t count, cudaStream_t stream) override {
    KVF_NCCL_RETURN(ncclAllReduce(buf, buf, static_cast<size_t>(count), ncclBfloat16, ncclSum, comms_[rank], stream));
    return Status::Ok();
  }
  Status AllGather(int rank, const float* send, float* recv, int64_t count, cudaStream_t stream) override {
    KVF_NCCL_RETURN(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, comms_[rank], stream));
    return Status::Ok();
  }

 private:
  explicit NcclComm(int ranks) : CudaComm(ranks) {}
  std::vector<ncclComm_t> comms_;  // [rank]
};
#endif

}  // namespace

Result<std::unique_ptr<CudaComm>> CudaComm::Make(std::span<const int> devices, int64_t max_reduce,
                                                 int64_t max_gather) {
  const std::set<int> distinct(devices.begin(), devices.end());
  if (distinct.size() == 1) {
    return SameDeviceComm::Make(static_cast<int>(devices.size()), devices[0], max_reduce, max_gather);
  }
#ifdef KVFLEET_HAVE_NCCL
  return NcclComm::Make(devices);
#else
  return Unimplemented("--tensor-parallel " + std::to_string(devices.size()) +
                       " over several GPUs needs NCCL, and this build has none (cmake/KvfleetDeps.cmake)");
#endif
}

Result<std::vector<int>> TensorParallelDevices(int32_t ranks, int first_device, const std::string* tp_devices) {
  std::vector<int> devices;
  if (tp_devices != nullptr) {
    size_t at = 0;
    while (at <= tp_devices->size()) {
      const size_t comma = std::min(tp_devices->find(',', at), tp_devices->size());
      const std::string item = tp_devices->substr(at, comma - at);
      char* end = nullptr;
      const long d = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || d < 0 || d > 1024) {
        return InvalidArgument("cuda backend: tp_devices must be a comma-separated list of device indices, got '" +
                               *tp_devices + "'");
      }
      devices.push_back(static_cast<int>(d));
      at = comma + 1;
    }
    if (static_cast<int32_t>(devices.size()) != ranks) {
      return InvalidArgument("cuda backend: tp_devices '" + *tp_devices + "' names " + std::to_string(devices.size()) +
                             " devices for --tensor-parallel " + std::to_string(ranks));
    }
    const std::set<int> distinct(devices.begin(), devices.end());
    if (distinct.size() != 1 && distinct.size() != devices.size()) {
      return InvalidArgument("cuda backend: tp_devices '" + *tp_devices +
                             "' must put every rank on one device (tests) or each on its own");
    }
  } else {
    for (int32_t r = 0; r < ranks; ++r) devices.push_back(first_device + r);
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) count = 0;
  for (int d : devices) {
    if (d >= count) {
      return InvalidArgument("--tensor-parallel " + std::to_string(ranks) + " needs CUDA device " + std::to_string(d) +
                             " (ranks on devices " + (tp_devices != nullptr ? *tp_devices : "from --device on") +
                             "), but this machine has " + std::to_string(count) + " GPU" + (count == 1 ? "" : "s") +
                             (e != cudaSuccess ? std::string(" (") + cudaGetErrorString(e) + ")" : ""));
    }
  }
  return devices;
}

RankThreads::RankThreads(int ranks)
    : ranks_(ranks), start_(ranks), done_(ranks), results_(static_cast<size_t>(ranks)) {
  for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  stop_ = true;
  start_.arrive_and_wait();
  for (std::thread& t : threads_) t.join();
}

Status RankThreads::Run(const std::function<Status(int)>& fn) {
  fn_ = &fn;
  start_.arrive_and_wait();
  results_[0] = fn(0);
  done_.arrive_and_wait();
  fn_ = nullptr;
  for (const Status& s : results_) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

void RankThreads::Loop(int rank) {
  for (;;) {
    start_.arrive_and_wait();
    if (stop_) return;
    results_[static_cast<size_t>(rank)] = (*fn_)(rank);
    done_.arrive_and_wait();
  }
}

}  // namespace kvfleet::backend::cuda
