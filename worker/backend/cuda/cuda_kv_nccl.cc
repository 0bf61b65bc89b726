// CudaKvNccl (cuda_kv_nccl.h): the cuda backend's NCCL point-to-point transfers of KV blocks.
//
// Invariants:
//   1. Transfers run one at a time, in submission order, on the object's thread: both sides
//      of a communicator issue its sends and receives in the same order.
//   2. A transfer that fails, or does not finish by its timeout, aborts its communicator and
//      removes it: no later transfer uses it (CommFor says 0 unless a newer one was submitted).
//   3. Every Submit ends in exactly one Done.
#include "worker/backend/cuda/cuda_kv_nccl.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/log.h"
#include "worker/backend/cuda/cuda_util.h"

#ifdef KVFLEET_HAVE_NCCL
#include <nccl.h>
#endif

namespace kvfleet::backend::cuda {

#ifdef KVFLEET_HAVE_NCCL
namespace {

namespace config {
// The thread's sleep between polls of a set-up or a transfer in flight: short next to a
// transfer of one block (4 MiB at ~200 GB/s: 20 us), cheap on a host core.
constexpr auto kPollSleep = std::chrono::microseconds(20);
}  // namespace config

using SteadyClock = std::chrono::steady_clock;

Status NcclError(ncclResult_t r, const std::string& what) {
  return Internal(what + ": NCCL: " + ncclGetErrorString(r) + (r == ncclRemoteError ? " (the peer failed)" : ""));
}

class CudaKvNccl final : public KvNccl {
 public:
  CudaKvNccl(KvNcclPools pools, std::function<void()> on_done)
      : pools_(std::move(pools)), on_done_(std::move(on_done)), thread_([this] { Loop(); }) {}

  ~CudaKvNccl() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Result<std::string> NewUniqueId() override {
    ncclUniqueId id;
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
    return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
  }

  uint64_t CommFor(const std::string& peer) const override {
    std::lock_guard lock(mu_);
    auto it = next_comm_.find(peer);
    return it == next_comm_.end() ? 0 : it->second;
  }

  void Submit(Transfer t) override {
    Queued q;
    q.start = SteadyClock::now();
    // The blocks' bytes as the engine's stream leaves them: the transfer waits for this event.
    if (cudaSetDevice(pools_.device) != cudaSuccess ||
        cudaEventCreateWithFlags(&q.ready, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(q.ready, pools_.engine_stream) != cudaSuccess) {
      q.early = Internal(std::string("KV transfer by NCCL: an event on the engine's stream: ") +
                         cudaGetErrorString(cudaGetLastError()));
    }
    {
      std::lock_guard lock(mu_);
      if (!t.unique_id.empty()) next_comm_[t.peer] = t.comm;
      q.t = std::move(t);
      queue_.push_back(std::move(q));
    }
    cv_.notify_all();
  }

  std::vector<Done> TakeDone() override {
    std::lock_guard lock(mu_);
    std::vector<Done> out;
    out.swap(done_);
    return out;
  }

  void Forget(const std::string& peer) override {
    {
      std::lock_guard lock(mu_);
      next_comm_.erase(peer);
      Queued marker;
      marker.forget = true;
      marker.t.peer = peer;
      queue_.push_back(std::move(marker));
    }
    cv_.notify_all();
  }

 private:
  struct Queued {
    Transfer t;
    bool forget = false;  // Forget(t.peer): abort its communicator here in the order
    cudaEvent_t ready = nullptr;
    SteadyClock::time_point start;
    Status early;  // failed before it was queued
  };
  struct Comm {
    uint64_t number = 0;
    ncclComm_t comm = nullptr;
  };

  void Loop() {
    Status setup = CudaStatus(cudaSetDevice(pools_.device), "cudaSetDevice");
    if (setup.ok()) setup = CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    // Timed events: the debug log says how long a transfer waited for the engine's stream and
    // how long NCCL then took.
    if (setup.ok()) setup = CudaStatus(cudaEventCreate(&begin_event_), "cudaEventCreate");
    if (setup.ok()) setup = CudaStatus(cudaEventCreate(&ready_event_), "cudaEventCreate");
    if (setup.ok()) setup = CudaStatus(cudaEventCreate(&done_event_), "cudaEventCreate");
    while (true) {
      Queued q;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) break;
        q = std::move(queue_.front());
        queue_.pop_front();
      }
      if (q.forget) {
        Drop(q.t.peer);
        continue;
      }
      Done d;
      d.id = q.t.id;
      if (!q.early.ok()) {
        d.status = q.early;
      } else if (!setup.ok()) {
        d.status = setup;
      } else if (Stopping()) {
        d.status = Status{StatusCode::kCancelled, "the worker is stopping"};
      } else {
        d.status = Run(q, &d.bytes);
      }
      d.seconds = std::chrono::duration<double>(SteadyClock::now() - q.start).count();
      if (!d.status.ok()) {
        d.bytes = 0;
        Drop(q.t.peer);
        // A send or receive the abort left on the stream must not hold up the next transfer:
        // a fresh stream (the old one's resources go once its work ends).
        if (stream_ != nullptr) {
          cudaStreamDestroy(stream_);
          stream_ = nullptr;
          setup = CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
        }
        std::lock_guard lock(mu_);
        if (auto c = next_comm_.find(q.t.peer); c != next_comm_.end() && c->second == q.t.comm) next_comm_.erase(c);
      }
      if (q.ready != nullptr) cudaEventDestroy(q.ready);
      {
        std::lock_guard lock(mu_);
        done_.push_back(std::move(d));
      }
      if (on_done_) on_done_();
    }
    for (auto& [peer, c] : comms_) ncclCommAbort(c.comm);
    comms_.clear();
    for (cudaEvent_t e : {begin_event_, ready_event_, done_event_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  bool Stopping() const {
    std::lock_guard lock(mu_);
    return stop_;
  }

  // Aborts and forgets `peer`'s communicator, if any.
  void Drop(const std::string& peer) {
    auto it = comms_.find(peer);
    if (it == comms_.end()) return;
    ncclCommAbort(it->second.comm);
    comms_.erase(it);
  }

  // Polls `comm` until its pending operation (set-up, group) is done, or fails; aborts
  // nothing itself (the caller's Drop does).
  Status AwaitComm(ncclComm_t comm, SteadyClock::time_point deadline, const char* what) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return NcclError(r, what);
      if (state == ncclSuccess) return Status::Ok();
      if (state != ncclInProgress) return NcclError(state, what);
      if (SteadyClock::now() > deadline || Stopping()) {
        return Status{StatusCode::kDeadlineExceeded, std::string(what) + ": not done by the transfer's deadline (the peer did not join)"};
      }
      std::this_thread::sleep_for(config::kPollSleep);
    }
  }

  Status Run(Queued& q, uint64_t* bytes) {
    const Transfer& t = q.t;
    const auto deadline = q.start + std::chrono::nanoseconds(t.timeout);
    if (t.blocks.size() != pools_.pools.size()) {
      return InvalidArgument("KV transfer by NCCL: blocks for " + std::to_string(t.blocks.size()) + " pools, not " +
                             std::to_string(pools_.pools.size()));
    }
    for (size_t p = 0; p < t.blocks.size(); ++p) {
      if (t.blocks[p].size() != t.blocks[0].size()) return InvalidArgument("KV transfer by NCCL: pools of unequal runs");
      for (const kv::BlockId b : t.blocks[p]) {
        if (int64_t{b} >= pools_.device_blocks[p]) {
          return InvalidArgument("KV transfer by NCCL: no device block " + std::to_string(b) + " in pool " +
                                 std::to_string(p));
        }
      }
    }
    KVF_CUDA_RETURN(cudaSetDevice(pools_.device));
    const SteadyClock::time_point dequeued = SteadyClock::now();
    if (!t.unique_id.empty()) {
      Drop(t.peer);  // the peer's side replaced it too
      ncclUniqueId id;
      if (t.unique_id.size() != sizeof(id)) return InvalidArgument("an ncclUniqueId of " + std::to_string(t.unique_id.size()) + " bytes");
      std::memcpy(&id, t.unique_id.data(), sizeof(id));
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // returns at once; AwaitComm polls it, bounded by the deadline
      ncclComm_t comm = nullptr;
      const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, id, t.send ? 0 : 1, &config);
      if (comm != nullptr) comms_[t.peer] = Comm{t.comm, comm};
      if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "ncclCommInitRankConfig");
      KVF_RETURN_IF_ERROR(AwaitComm(comm, deadline, "setting up the communicator"));
    }
    auto it = comms_.find(t.peer);
    if (it == comms_.end() || it->second.number != t.comm) {
      return FailedPrecondition("KV transfer by NCCL: no communicator " + std::to_string(t.comm) + " with this peer");
    }
    ncclComm_t comm = it->second.comm;
    const SteadyClock::time_point set_up = SteadyClock::now();
    KVF_CUDA_RETURN(cudaEventRecord(begin_event_, stream_));
    KVF_CUDA_RETURN(cudaStreamWaitEvent(stream_, q.ready, 0));
    KVF_CUDA_RETURN(cudaEventRecord(ready_event_, stream_));
    uint64_t total = 0;
    ncclResult_t first = ncclSuccess;
    ncclGroupStart();
    for (size_t p = 0; p < t.blocks.size(); ++p) {
      const uint64_t bpb = pools_.bytes_per_block[p];
      for (const kv::BlockId b : t.blocks[p]) {
        std::byte* at = pools_.pools[p] + size_t{b} * bpb;
        const ncclResult_t r = t.send ? ncclSend(at, bpb, ncclUint8, 1, comm, stream_)
                                      : ncclRecv(at, bpb, ncclUint8, 0, comm, stream_);
        if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
        total += bpb;
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (first != ncclSuccess) return NcclError(first, t.send ? "ncclSend" : "ncclRecv");
    if (end != ncclSuccess && end != ncclInProgress) return NcclError(end, "ncclGroupEnd");
    if (end == ncclInProgress) KVF_RETURN_IF_ERROR(AwaitComm(comm, deadline, "enqueueing the transfer"));
    const SteadyClock::time_point enqueued = SteadyClock::now();
    KVF_CUDA_RETURN(cudaEventRecord(done_event_, stream_));
    while (true) {
      const cudaError_t e = cudaEventQuery(done_event_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return CudaStatus(e, "the NCCL transfer");
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm, &state);
      if (state != ncclSuccess && state != ncclInProgress) return NcclError(state, "the NCCL transfer");
      if (SteadyClock::now() > deadline || Stopping()) {
        return Status{StatusCode::kDeadlineExceeded, "KV transfer by NCCL: not done by the pull's deadline (the peer did not send or receive)"};
      }
      std::this_thread::sleep_for(config::kPollSleep);
    }
    *bytes = total;
    if (auto log = Logger("transfer"); log->should_log(spdlog::level::debug)) {
      float stream_wait_ms = 0, moved_ms = 0;
      cudaEventElapsedTime(&stream_wait_ms, begin_event_, ready_event_);
      cudaEventElapsedTime(&moved_ms, ready_event_, done_event_);
      auto ms = [](SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
      log->debug("NCCL {} {} of {} bytes with {}: queued {:.2f} ms, set-up {:.2f} ms, enqueued in {:.2f} ms, waited "
                 "{:.2f} ms for the engine's stream, moved in {:.2f} ms, done {:.2f} ms after Submit",
                 t.send ? "send" : "receive", t.id, total, t.peer, ms(dequeued - q.start), ms(set_up - dequeued),
                 ms(enqueued - set_up), stream_wait_ms, moved_ms, ms(SteadyClock::now() - q.start));
    }
    return Status::Ok();
  }

  const KvNcclPools pools_;
  const std::function<void()> on_done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;                   // GUARDED_BY(mu_)
  std::vector<Done> done_;                     // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> next_comm_;  // GUARDED_BY(mu_): CommFor's answers
  bool stop_ = false;                          // GUARDED_BY(mu_)
  // The thread's own.
  std::map<std::string, Comm> comms_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t begin_event_ = nullptr, ready_event_ = nullptr, done_event_ = nullptr;
  std::thread thread_;  // last: starts once everything above is built
};

}  // namespace

Result<std::unique_ptr<KvNccl>> MakeCudaKvNccl(KvNcclPools pools, std::function<void()> on_done) {
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast stays off (cuda_comm.h)
  return std::unique_ptr<KvNccl>(std::make_unique<CudaKvNccl>(std::move(pools), std::move(on_done)));
}

#else

Result<std::unique_ptr<KvNccl>> MakeCudaKvNccl(KvNcclPools /*pools*/, std::function<void()> /*on_done*/) {
  return Unimplemented("KV transfer by NCCL needs NCCL, and this build has none (cmake/KvfleetDeps.cmake)");
}

#endif

}  // namespace kvfleet::backend::cuda
