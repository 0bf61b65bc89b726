// RankGroup: N tensor-parallel ranks as threads of one process, and the collectives they
// meet at. Rank 0 is the calling (engine) thread; ranks 1..N-1 are threads the group owns,
// asleep between steps. It stands in for one GPU per rank with an NCCL communicator, so the
// cpu backend runs the sharded forward pass exactly as a multi-GPU backend would.
//
// AllReduce is deterministic: every element is summed in rank order 0, 1, ..., N-1 whatever
// the threads' timing, so a step's result never depends on scheduling. Each rank reduces a
// 1/N slice of the elements (a reduce-scatter), then every rank copies the slices back (an
// all-gather), as NCCL's ring algorithm divides the work.
//
// Thread safety: Run is called by one thread at a time. Inside Run, every rank must make the
// same sequence of collective calls with the same sizes (as with NCCL); a rank that skips
// one deadlocks the group.
#pragma once

#include <barrier>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace kvfleet::backend::cpu {

class RankGroup {
 public:
  // REQUIRES: ranks >= 1.
  explicit RankGroup(int ranks);
  ~RankGroup();
  RankGroup(const RankGroup&) = delete;
  RankGroup& operator=(const RankGroup&) = delete;

  int size() const { return ranks_; }
  // Runs fn(r) for every rank r at once, rank 0 on the calling thread; returns when all are done.
  void Run(const std::function<void(int)>& fn);
  // Inside Run, called by every rank with its own data[0, n) and the same n: afterwards each
  // rank's data holds the element-wise sum over the ranks, added in rank order.
  void AllReduce(int rank, float* data, int64_t n);
  // Inside Run: returns when every rank has called it.
  void Barrier() { barrier_.arrive_and_wait(); }

 private:
  void RankLoop(int rank);

  const int ranks_;
  std::barrier<> barrier_;
  const std::function<void(int)>* fn_ = nullptr;  // the current Run's; read by ranks after the start barrier
  bool stop_ = false;                              // set before the last start barrier
  std::vector<float*> data_;                       // [rank]: its AllReduce buffer
  std::vector<std::vector<float>> slice_;          // [rank]: the sums of its slice
  std::vector<std::thread> threads_;               // ranks 1..N-1
};

}  // namespace kvfleet::backend::cpu
