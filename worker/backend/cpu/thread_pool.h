// ThreadPool: a fixed set of std::threads that run one parallel loop at a time, the
// calling thread included. The cpu backend splits matrix rows and attention heads over it.
//
// The caller never waits for a worker that has not joined the loop: on a busy machine a
// late worker finds the work taken and goes back to sleep, so a loop costs what the
// threads that were running did, not a wake-up of every thread.
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
  // One loop. Lives on the caller's stack; workers touch it only between joining (under
  // mu_, while it is current) and leaving (joined decremented under mu_).
  struct Job {
    const std::function<void(int64_t)>* fn;
    int64_t n;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    int joined = 0;  // GUARDED_BY(mu_): workers inside this job
  };
  void WorkerLoop();
  static void RunItems(Job* job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  Job* job_ = nullptr;       // GUARDED_BY(mu_): the current loop, null between loops
  uint64_t generation_ = 0;  // GUARDED_BY(mu_): bumped per loop
  bool stop_ = false;        // GUARDED_BY(mu_)
};

}  // namespace kvfleet::backend::cpu
