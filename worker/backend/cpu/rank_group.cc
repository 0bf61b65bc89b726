#include "worker/backend/cpu/rank_group.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace kvfleet::backend::cpu {

RankGroup::RankGroup(int ranks)
    : ranks_(ranks), barrier_(ranks), data_(static_cast<size_t>(ranks)), slice_(static_cast<size_t>(ranks)) {
  KVF_CHECK(ranks >= 1);
  for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { RankLoop(r); });
}

RankGroup::~RankGroup() {
  stop_ = true;
  if (ranks_ > 1) barrier_.arrive_and_wait();  // the start barrier the ranks sleep at
  for (auto& t : threads_) t.join();
}

void RankGroup::RankLoop(int rank) {
  for (;;) {
    barrier_.arrive_and_wait();  // start: fn_ and stop_ are published by the barrier
    if (stop_) return;
    (*fn_)(rank);
    barrier_.arrive_and_wait();  // done
  }
}

void RankGroup::Run(const std::function<void(int)>& fn) {
  if (ranks_ == 1) {
    fn(0);
    return;
  }
  fn_ = &fn;
  barrier_.arrive_and_wait();
  fn(0);
  barrier_.arrive_and_wait();
  fn_ = nullptr;
}

void RankGroup::AllReduce(int rank, float* data, int64_t n) {
  if (ranks_ == 1) return;
  // 1. Publish the buffer. A rank writes data_[rank] only here, after everyone left the
  //    previous call's reduce phase (its second barrier).
  data_[rank] = data;
  barrier_.arrive_and_wait();
  // 2. Reduce-scatter: this rank sums its slice over every rank's buffer, in rank order.
  const int64_t per = (n + ranks_ - 1) / ranks_;
  const int64_t lo = std::min(n, rank * per), hi = std::min(n, lo + per);
  std::vector<float>& out = slice_[rank];
  out.assign(data_[0] + lo, data_[0] + hi);
  for (int src = 1; src < ranks_; ++src) {
    const float* in = data_[src] + lo;
    for (int64_t i = 0; i < hi - lo; ++i) out[i] += in[i];
  }
  barrier_.arrive_and_wait();
  // 3. All-gather into this rank's own buffer. slice_[s] is rewritten only in the next
  //    call's step 2, after its first barrier, which this rank reaches only when done here.
  for (int s = 0; s < ranks_; ++s) {
    const int64_t slo = std::min(n, s * per), shi = std::min(n, slo + per);
    if (shi > slo) std::memcpy(data + slo, slice_[s].data(), static_cast<size_t>(shi - slo) * sizeof(float));
  }
}

}  // namespace kvfleet::backend::cpu
