// FaultInjector: disturbs live event batches between the router's SUB socket and the
// subscriber state machines, as a lossy network would: drops, duplicates, and reorders
// within a window. Set through EventPlaneOptions::fault_injector by tests, and by the
// router's --debug-drop-events F (drops only); null otherwise.
//
// Held batches are released after max_hold even when no more traffic comes, so a test that
// stops its traffic still sees every batch that was not dropped.
//
// Thread safety: Process/Release from one thread (the event plane's event thread); the
// counters from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <random>
#include <vector>

#include "common/clock.h"
#include "router/index/global_index.h"
#include "schema/event_codec.h"

namespace kvfleet::router {

struct FaultOptions {
  double drop_rate = 0.10;       // fraction of batches dropped
  double duplicate_rate = 0.05;  // fraction delivered twice
  size_t reorder_window = 8;     // batches held back and released in random order; 0 = in order
  DurationNs max_hold = 20 * kNsPerMs;  // a held batch is released after this long
  uint64_t seed = 1;
};

class FaultInjector {
 public:
  explicit FaultInjector(const FaultOptions& options) : options_(options), rng_(options.seed) {}

  using Delivery = std::pair<WorkerId, events::DecodedBatch>;
  // Takes one received batch; appends what is to be delivered now to *out.
  void Process(WorkerId worker, events::DecodedBatch batch, TimeNs now, std::vector<Delivery>* out);
  // Releases held batches older than max_hold (all of them when `all`).
  void Release(TimeNs now, bool all, std::vector<Delivery>* out);

  // Readable from any thread.
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t duplicated() const { return duplicated_.load(std::memory_order_relaxed); }
  uint64_t reordered() const { return reordered_.load(std::memory_order_relaxed); }

 private:
  struct Held {
    Delivery delivery;
    TimeNs since;
  };
  FaultOptions options_;
  std::mt19937_64 rng_;
  std::vector<Held> held_;
  std::atomic<uint64_t> dropped_{0}, duplicated_{0}, reordered_{0};
};

}  // namespace kvfleet::router
