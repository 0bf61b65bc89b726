#include "router/fleet/poll_loop.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "common/check.h"

namespace kvfleet::router {

class PollLoop::WatchImpl final : public LaneLoop::Watch {
 public:
  WatchImpl(PollLoop* loop, std::shared_ptr<std::function<void()>> fn) : loop_(loop), fn_(std::move(fn)) {}
  ~WatchImpl() override {
    std::erase_if(loop_->entries_, [&](const Entry& e) { return e.on_readable == fn_; });
  }

 private:
  PollLoop* loop_;
  std::shared_ptr<std::function<void()>> fn_;
};

PollLoop::PollLoop() {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  KVF_CHECK(wake_fd_ >= 0);
  thread_ = std::thread([this] { Loop(); });
}

PollLoop::~PollLoop() {
  Post([this] {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  });
  thread_.join();
  ::close(wake_fd_);
}

void PollLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

std::unique_ptr<LaneLoop::Watch> PollLoop::WatchReadable(int fd, std::function<void()> on_readable) {
  auto fn = std::make_shared<std::function<void()>>(std::move(on_readable));
  entries_.push_back({fd, fn});
  return std::make_unique<WatchImpl>(this, fn);
}

void PollLoop::Loop() {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<std::function<void()>>> ready;
  while (true) {
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    for (const Entry& e : entries_) fds.push_back({e.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof(v));
    }
    // Callbacks may add or remove watches: take the ready ones first, and skip any whose
    // watch went away meanwhile.
    ready.clear();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0 && i - 1 < entries_.size()) ready.push_back(entries_[i - 1].on_readable);
    }
    for (auto& fn : ready) {
      bool live = std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.on_readable == fn; });
      if (live) (*fn)();
    }
    std::vector<std::function<void()>> posted;
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted.swap(posted_);
    }
    for (auto& fn : posted) fn();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop = stopping_;
    }
    if (stop) return;
  }
}

void ThreadLane::Submit(uint64_t handle, ForwardRequest request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (loop_ == nullptr) {
    if (fleet_->Stopping()) {
      request.sink->OnError(request.worker, Unavailable("the router is shutting down"), false);
      return;
    }
    loop_ = std::make_unique<PollLoop>();
    PollLoop* loop = loop_.get();
    loop->Post([this, loop] { lane_ = std::make_unique<Lane>(fleet_, loop); });
  }
  auto shared = std::make_shared<ForwardRequest>(std::move(request));
  loop_->Post([this, handle, shared] { lane_->Submit(handle, std::move(*shared)); });
}

void ThreadLane::Cancel(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (loop_) loop_->Post([this, handle] { lane_->Cancel(handle); });
}

void ThreadLane::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (loop_) {
    loop_->Post([this] { lane_.reset(); });
    loop_.reset();  // runs the posted reset, then joins
  }
}

}  // namespace kvfleet::router
