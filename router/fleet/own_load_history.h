// OwnLoadHistory: a router's own in-flight counts on one worker after each of their last
// changes, so that a worker's load report can be set against what this router had in flight
// there when the report was written (Fleet::OwnLoadAt, router/routing/README.md).
// OwnLoadCounter: those counts themselves, with their history, as the fleet keeps them per
// worker (the lanes change them; the routing step reads them).
//
// Thread safety: OwnLoadHistory is thread-compatible; OwnLoadCounter is thread-safe; OwnLoadSlot
// takes readers on any thread beside one writer at a time.
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
  double left_prefill_tokens = 0;  // cumulative: prefill tokens of requests that left the pending set
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

// One worker's own counts now and when they last changed, published for readers that take
// no lock: a sequence lock (one writer at a time; OwnLoadCounter's mutex orders them). The
// fleet keeps one per worker in its routing table (routing_table.h), so that a routing
// decision reads a worker's counts from one line of a dense array. 64 bytes.
class OwnLoadSlot {
 public:
  struct Snapshot {
    OwnLoadCounts counts;
    TimeNs changed_at = 0;  // the last change's time; meaningless while `changes` is 0
    uint64_t changes = 0;   // changes ever published (since Reset)
  };
  Snapshot Read() const {
    for (;;) {
      const uint64_t before = seq_.load(std::memory_order_acquire);
      Snapshot s;
      // Acquire loads, no fence (ThreadSanitizer models none): a value of a later change brings
      // that change's odd sequence number with it, so the check below sees the change.
      s.counts.requests = static_cast<double>(requests_.load(std::memory_order_acquire));
      s.counts.prefill_tokens = static_cast<double>(prefill_tokens_.load(std::memory_order_acquire));
      s.counts.prompt_tokens = static_cast<double>(prompt_tokens_.load(std::memory_order_acquire));
      s.counts.waiting = static_cast<double>(waiting_.load(std::memory_order_acquire));
      s.counts.left_prefill_tokens = static_cast<double>(left_.load(std::memory_order_acquire));
      s.changed_at = changed_at_.load(std::memory_order_acquire);
      s.changes = changes_.load(std::memory_order_acquire);
      if ((before & 1) == 0 && seq_.load(std::memory_order_relaxed) == before) return s;
    }
  }
  // The counts changed by `d` at `at`; returns them. REQUIRES: no other Add or Reset at once.
  OwnLoadCounts Add(TimeNs at, const OwnLoadDelta& d) {
    const int64_t requests = requests_.load(std::memory_order_relaxed) + d.requests;
    const int64_t waiting = waiting_.load(std::memory_order_relaxed) + d.waiting;
    const int64_t prefill = prefill_tokens_.load(std::memory_order_relaxed) + d.prefill_tokens;
    const int64_t prompt = prompt_tokens_.load(std::memory_order_relaxed) + d.prompt_tokens;
    const int64_t left = left_.load(std::memory_order_relaxed) + std::max<int64_t>(0, -d.prefill_tokens);
    Publish(at, requests, waiting, prefill, prompt, left, changes_.load(std::memory_order_relaxed) + 1);
    return OwnLoadCounts{static_cast<double>(requests), static_cast<double>(prefill), static_cast<double>(prompt),
                         static_cast<double>(waiting), static_cast<double>(left)};
  }
  // Zero counts, never changed (a new worker on a reused id). REQUIRES: no Add at once.
  void Reset() { Publish(0, 0, 0, 0, 0, 0, 0); }
  int64_t requests() const { return requests_.load(std::memory_order_relaxed); }
  int64_t prefill_tokens() const { return prefill_tokens_.load(std::memory_order_relaxed); }

 private:
  void Publish(TimeNs at, int64_t requests, int64_t waiting, int64_t prefill, int64_t prompt, int64_t left,
               uint64_t changes) {
    const uint64_t seq = seq_.load(std::memory_order_relaxed);
    seq_.store(seq + 1, std::memory_order_relaxed);  // odd: readers retry
    // Release stores: a reader that sees one also sees the odd number stored before it.
    requests_.store(requests, std::memory_order_release);
    waiting_.store(waiting, std::memory_order_release);
    prefill_tokens_.store(prefill, std::memory_order_release);
    prompt_tokens_.store(prompt, std::memory_order_release);
    left_.store(left, std::memory_order_release);
    changed_at_.store(at, std::memory_order_release);
    changes_.store(changes, std::memory_order_release);
    seq_.store(seq + 2, std::memory_order_release);
  }
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> prefill_tokens_{0};  // expected uncached, requests without a first token
  std::atomic<int64_t> prompt_tokens_{0};   // their whole prompts
  std::atomic<int64_t> waiting_{0};         // requests without a first token
  std::atomic<int64_t> left_{0};            // cumulative prefill tokens of requests that left
  std::atomic<TimeNs> changed_at_{0};
  std::atomic<uint64_t> changes_{0};
};

// One worker's own counts and the history of their changes. The counts and their newest
// sample are published in an OwnLoadSlot, its own or the one given (the fleet's routing table):
// Now() and the usual At() (a time after the last change) read it without a lock; an older
// time asks the history under the mutex. Add() orders changes with their samples.
template <size_t N>
class OwnLoadCounter {
 public:
  OwnLoadCounter() = default;
  // Publishes in `slot`, which outlives the counter and is reset here.
  explicit OwnLoadCounter(OwnLoadSlot* slot) : slot_(slot) { slot_->Reset(); }
  OwnLoadCounter(const OwnLoadCounter&) = delete;
  OwnLoadCounter& operator=(const OwnLoadCounter&) = delete;

  OwnLoadCounts Now() const { return slot_->Read().counts; }
  // The counts after the last change at or before `at` (OwnLoadHistory::At).
  OwnLoadCounts At(TimeNs at) const {
    const OwnLoadSlot::Snapshot s = slot_->Read();
    if (s.changes == 0) return OwnLoadCounts{};
    if (s.changed_at <= at) return s.counts;
    return FromHistory(at);
  }
  // At(at) as the history alone answers it, under the mutex.
  OwnLoadCounts FromHistory(TimeNs at) const {
    std::lock_guard<std::mutex> lock(mu_);
    return history_.At(at, Now());
  }
  // Changes the counts by the deltas, recording a sample stamped by `clock` before the
  // change: whoever sees the new counts sees a sample no later than now.
  void Add(const Clock* clock, const OwnLoadDelta& d) {
    std::lock_guard<std::mutex> lock(mu_);
    const TimeNs now = clock->Now();
    history_.Record(now, slot_->Add(now, d));
  }
  int64_t requests() const { return slot_->requests(); }
  int64_t prefill_tokens() const { return slot_->prefill_tokens(); }

 private:
  OwnLoadSlot own_slot_;
  OwnLoadSlot* slot_ = &own_slot_;
  mutable std::mutex mu_;      // orders the counts' changes with their samples
  OwnLoadHistory<N> history_;  // GUARDED_BY(mu_)
};

}  // namespace kvfleet::router
