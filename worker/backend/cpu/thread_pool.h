// ThreadPool: a fixed set of std::threads that run one parallel loop at a time, the
// calling thread included. The cpu backend splits matrix rows and attention heads over it.
//
// Thread safety: ParallelFor is called by one thread at a time (the engine thread); the
// work items run concurrently and must not share written memory.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvfleet::backend::cpu {

class ThreadPool {
 public:
  // `threads` counts the caller: 1 runs everything inline. REQUIRES: threads >= 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(i) for every i in [0, n) and returns when all are done.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunItems();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // GUARDED_BY(mu_): bumped per loop
  int busy_ = 0;             // GUARDED_BY(mu_): workers still in the current loop
  bool stop_ = false;        // GUARDED_BY(mu_)
  // The current loop; written under mu_ before generation_ is bumped.
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace kvfleet::backend::cpu
