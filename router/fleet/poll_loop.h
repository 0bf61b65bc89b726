// PollLoop: a thread running poll(2) over watched file descriptors and posted functions,
// a LaneLoop for lanes that have no HTTP I/O thread to live on (Fleet::Submit, tests).
// ThreadLane: such a lane on a PollLoop of its own, started by its first Submit; the fleet
// owns one for Fleet::Submit.
//
// Thread safety: PollLoop: Post() and the destructor from any thread but the loop's own;
// watches are made and destroyed on the loop thread (or before Start-up work runs, from a
// posted fn). ThreadLane: thread-safe; its sinks are called on its loop's thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "router/fleet/lane.h"

namespace kvfleet::router {

class PollLoop final : public LaneLoop {
 public:
  PollLoop();   // starts the thread
  ~PollLoop() override;  // runs what was posted before it, then joins
  PollLoop(const PollLoop&) = delete;
  PollLoop& operator=(const PollLoop&) = delete;

  void Post(std::function<void()> fn) override;
  std::unique_ptr<Watch> WatchReadable(int fd, std::function<void()> on_readable) override;

 private:
  struct Entry {
    int fd;
    std::shared_ptr<std::function<void()>> on_readable;  // null once the watch is gone
  };
  class WatchImpl;
  void Loop();

  int wake_fd_ = -1;
  std::mutex mu_;
  std::vector<std::function<void()>> posted_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                      // GUARDED_BY(mu_)
  std::vector<Entry> entries_;                 // loop thread only
  std::thread thread_;
};

class ThreadLane {
 public:
  // REQUIRES: `fleet` outlives the ThreadLane.
  explicit ThreadLane(LaneFleet* fleet) : fleet_(fleet) {}
  ~ThreadLane() { Stop(); }
  ThreadLane(const ThreadLane&) = delete;
  ThreadLane& operator=(const ThreadLane&) = delete;

  // Lane::Submit on the lane's thread, starting it first if need be. Once the fleet is
  // stopping and the lane never started, the sink fails at once.
  void Submit(uint64_t handle, ForwardRequest request);
  void Cancel(uint64_t handle);
  // Ends what the lane has in flight, on its own thread, and joins it. Idempotent.
  void Stop();

 private:
  LaneFleet* const fleet_;
  std::mutex mu_;
  std::unique_ptr<PollLoop> loop_;  // GUARDED_BY(mu_)
  std::unique_ptr<Lane> lane_;      // loop_'s thread only
};

}  // namespace kvfleet::router
