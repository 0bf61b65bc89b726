// PollLoop: a thread running poll(2) over watched file descriptors and posted functions,
// a LaneLoop for lanes that have no HTTP I/O thread to live on (Fleet::Submit, tests).
//
// Thread safety: Post() and the destructor from any thread but the loop's own; watches are
// made and destroyed on the loop thread (or before Start-up work runs, from a posted fn).
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

}  // namespace kvfleet::router
