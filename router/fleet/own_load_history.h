// OwnLoadHistory: a router's own in-flight counts on one worker after each of their last
// changes, so that a worker's load report can be set against what this router had in flight
// there when the report was written (Fleet::OwnLoadAt, router/routing/README.md).
// OwnLoadCounter: those counts themselves, with their history, as the fleet keeps them per
// worker (the lanes change them; the routing step reads them).
//
// Thread safety: OwnLoadHistory is thread-compatible; OwnLoadCounter is thread-safe.
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
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "common/clock.h"

namespace kvfleet::router {

struct OwnLoadCounts {
  double requests = 0;
  double prefill_tokens = 0;  // tokens expected uncached, for requests without a first token
  double prompt_tokens = 0;   // their whole prompts
  double waiting = 0;         // requests without a first token
  bool operator==(const OwnLoadCounts&) const = default;
};

// A change of the counts: a request sent (+1 request, +1 waiting, + its tokens), its first
// token (−1 waiting, − its tokens), its end (−1 request, and the rest if still waiting).
struct OwnLoadDelta {
  int64_t requests = 0;
  int64_t waiting = 0;
  int64_t prefill_tokens = 0;
  int64_t prompt_tokens = 0;
};

template <size_t N>
class OwnLoadHistory {
 public:
  // REQUIRES: `at` >= every earlier Record's.
  void Record(TimeNs at, const OwnLoadCounts& counts) {
    newest_ = Sample{at, counts};
    ring_[recorded_++ % N] = newest_;
  }

  OwnLoadCounts At(TimeNs at, const OwnLoadCounts& current) const {
    if (recorded_ == 0) return OwnLoadCounts{};
    // Most reads ask of a time after the last change (a worker's report is newer than this
    // router's last request there): answered from newest_, beside recorded_, without touching
    // the ring, whose lines routing would otherwise miss on for each of 1,000 workers.
    if (newest_.at <= at) return newest_.counts;
    const uint64_t kept = std::min<uint64_t>(recorded_, N);
    for (uint64_t k = 1; k < kept; ++k) {
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
  uint64_t recorded_ = 0;  // samples ever recorded; the newest is ring_[(recorded_ - 1) % N]
  Sample newest_;          // a copy of that newest sample
  std::array<Sample, N> ring_;
};

// One worker's own counts and the history of their changes. Now() reads the counts without
// a lock (the routing step's hot path); Add() and At() order changes with their samples.
template <size_t N>
class OwnLoadCounter {
 public:
  OwnLoadCounts Now() const {
    OwnLoadCounts c;
    c.requests = static_cast<double>(requests_.load(std::memory_order_relaxed));
    c.prefill_tokens = static_cast<double>(prefill_tokens_.load(std::memory_order_relaxed));
    c.prompt_tokens = static_cast<double>(prompt_tokens_.load(std::memory_order_relaxed));
    c.waiting = static_cast<double>(waiting_.load(std::memory_order_relaxed));
    return c;
  }
  // The counts after the last change at or before `at` (OwnLoadHistory::At).
  OwnLoadCounts At(TimeNs at) const {
    std::lock_guard<std::mutex> lock(mu_);
    return history_.At(at, Now());
  }
  // Changes the counts by the deltas, recording a sample stamped by `clock` before the
  // change: whoever sees the new counts sees a sample no later than now.
  void Add(const Clock* clock, const OwnLoadDelta& d) {
    std::lock_guard<std::mutex> lock(mu_);
    const TimeNs now = clock->Now();
    const int64_t requests = d.requests, prefill_tokens = d.prefill_tokens, prompt_tokens = d.prompt_tokens;
    OwnLoadCounts after;
    after.requests = static_cast<double>(requests_.fetch_add(requests, std::memory_order_relaxed) + requests);
    after.waiting = static_cast<double>(waiting_.fetch_add(d.waiting, std::memory_order_relaxed) + d.waiting);
    after.prefill_tokens =
        static_cast<double>(prefill_tokens_.fetch_add(prefill_tokens, std::memory_order_relaxed) + prefill_tokens);
    after.prompt_tokens =
        static_cast<double>(prompt_tokens_.fetch_add(prompt_tokens, std::memory_order_relaxed) + prompt_tokens);
    history_.Record(now, after);
  }
  int64_t requests() const { return requests_.load(); }
  int64_t prefill_tokens() const { return prefill_tokens_.load(); }

 private:
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> prefill_tokens_{0};  // expected uncached, requests without a first token
  std::atomic<int64_t> prompt_tokens_{0};   // their whole prompts
  std::atomic<int64_t> waiting_{0};         // requests without a first token
  mutable std::mutex mu_;                   // orders the counts' changes with their samples
  OwnLoadHistory<N> history_;               // GUARDED_BY(mu_)
};

}  // namespace kvfleet::router
