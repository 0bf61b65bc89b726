// What the engine reports about itself after each step: the load a router weighs and the
// counters the worker's /metrics exports.
//
// Thread safety: values.
#pragma once

#include <array>
#include <cstdint>

#include "common/clock.h"
#include "schema/load_report.h"

namespace kvfleet::engine {

constexpr int kNumTiers = kLoadTiers;  // device, host (kv::Tier order)

// Contract 2's Load: what the event publisher sends with every batch.
using LoadReport = kvfleet::LoadReport;

// One step, for metrics; its load goes out with the step's KV events.
struct StepReport {
  DurationNs duration = 0;          // schedule + execute + postprocess
  uint32_t batch_sequences = 0;
  uint32_t batch_tokens = 0;        // tokens computed
  uint32_t prefill_tokens = 0;      // of batch_tokens, prompt (or recompute) tokens
  uint32_t decode_sequences = 0;
  uint32_t preemptions = 0;         // requests preempted by this step's schedule
  bool kv_short = false;            // a waiting request did not fit in the KV cache (ScheduledBatch)
  uint32_t finished = 0;
  bool time_bounded = false;        // the step bound (max_step_ms) cut its prefill
  bool prefill_limited = false;     // more prefill was ready than the step took
  LoadReport load;
};

// Running totals since the engine started.
struct EngineCounters {
  uint64_t steps = 0;
  uint64_t requests_added = 0;
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t preemptions = 0;
  uint64_t generated_tokens = 0;
  // Constrained decoding: next-token masks filled (one per constrained sampled row) and the
  // engine thread's time in them (the Clock's; while the backend's forward pass runs).
  uint64_t masks_filled = 0;
  uint64_t mask_fill_ns = 0;
};

}  // namespace kvfleet::engine
