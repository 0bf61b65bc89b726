#include "worker/backend/cpu/thread_pool.h"

#include "common/check.h"

namespace kvfleet::backend::cpu {

ThreadPool::ThreadPool(int threads) {
  KVF_CHECK(threads >= 1) << "threads = " << threads;
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunItems(Job* job) {
  for (int64_t i = job->next.fetch_add(1, std::memory_order_relaxed); i < job->n;
       i = job->next.fetch_add(1, std::memory_order_relaxed)) {
    (*job->fn)(i);
    job->done.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Job job;
  job.fn = &fn;
  job.n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    ++generation_;
  }
  start_cv_.notify_all();
  RunItems(&job);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = nullptr;  // no worker joins from now on
  done_cv_.wait(lock, [&] { return job.joined == 0 && job.done.load(std::memory_order_acquire) == n; });
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || (job_ != nullptr && generation_ != seen); });
      if (stop_) return;
      seen = generation_;
      job = job_;
      ++job->joined;
    }
    RunItems(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --job->joined;
    }
    done_cv_.notify_one();
  }
}

}  // namespace kvfleet::backend::cpu
