// OwnLoadHistory: a router's own in-flight counts on one worker after each of their last
// changes, so that a worker's load report can be set against what this router had in flight
// there when the report was written (Fleet::OwnLoadAt, router/routing/README.md).
//
// Thread safety: thread-compatible (the fleet guards each worker's history with a mutex).
//
// Invariants:
//   1. Samples are recorded in time order; At(t) returns the counts of the last sample at or
//      before t.
//   2. Only the last N samples are kept. Before the first kept sample, the counts were zero
//      if no sample was ever dropped; otherwise unknown, and At returns the caller's current
//      counts (a report that old is stale anyway).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "common/clock.h"

namespace kvfleet::router {

struct OwnLoadCounts {
  double requests = 0;
  double prefill_tokens = 0;  // tokens expected uncached, for requests without a first token
  double prompt_tokens = 0;   // their whole prompts
  bool operator==(const OwnLoadCounts&) const = default;
};

template <size_t N>
class OwnLoadHistory {
 public:
  // REQUIRES: `at` >= every earlier Record's.
  void Record(TimeNs at, const OwnLoadCounts& counts) { ring_[recorded_++ % N] = Sample{at, counts}; }

  OwnLoadCounts At(TimeNs at, const OwnLoadCounts& current) const {
    const uint64_t kept = std::min<uint64_t>(recorded_, N);
    for (uint64_t k = 0; k < kept; ++k) {
      const Sample& sample = ring_[(recorded_ - 1 - k) % N];
      if (sample.at <= at) return sample.counts;
    }
    return recorded_ <= N ? OwnLoadCounts{} : current;
  }

 private:
  struct Sample {
    TimeNs at = 0;
    OwnLoadCounts counts;
  };
  std::array<Sample, N> ring_;
  uint64_t recorded_ = 0;  // samples ever recorded; the newest is ring_[(recorded_ - 1) % N]
};

}  // namespace kvfleet::router
