// Contract 2's Load as plain C++: one struct for the engine that computes a worker's load,
// the event codec that carries it in every EventBatch, and the router that weighs it.
//
// Thread safety: a value.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvfleet {

// Tiers in kv::Tier order: device, host.
constexpr int kLoadTiers = 2;

// LoadReport::pulled_wait_us from a worker older than the field (events.capnp's default).
constexpr uint64_t kPulledWaitUnknown = ~uint64_t{0};

// A worker's KV pulls from one holder (Contract 4), totals since the worker started.
struct PullTotals {
  std::string source;  // the holder's transfer endpoint
  uint64_t pulls = 0;  // pulls that brought blocks
  uint64_t bytes = 0;
  double seconds = 0;  // from each pull's request to its blocks in place
  uint64_t failed = 0;  // pulls that brought no block: the request computed its whole prefix
  double failed_seconds = 0;  // from each failed pull's request to its fallback
  bool operator==(const PullTotals&) const = default;
};

struct LoadReport {
  uint32_t active_requests = 0;        // running: scheduled at least once and not finished
  uint32_t queued_requests = 0;        // waiting for their first (or, after preemption, next) step
  uint64_t active_prefill_tokens = 0;  // prompt tokens still to compute, queued requests included
  uint64_t active_decode_blocks = 0;   // blocks held by decoding sequences
  std::array<uint64_t, kLoadTiers> free_blocks{};   // free or evictable, by tier
  std::array<uint64_t, kLoadTiers> total_blocks{};  // by tier
  float prefill_tokens_per_second = 0;  // capacity: smoothed over steps mostly spent on prefill; 0 = not yet measured
  float decode_tokens_per_second = 0;
  // Microseconds a request arriving now waits before its prefill starts: the prefill ahead
  // at prefill_tokens_per_second (none while that is 0) plus the admission wait when the
  // batch or the KV cache is full (schema/README.md, "Load"). 0 from older workers.
  uint64_t predicted_wait_us = 0;
  // Microseconds a prompt that arrives with all but at most a block pulled waits to be
  // admitted: on a worker that admits such prompts ahead of its queue (a decode-role worker),
  // for a batch slot and a KV block only; elsewhere predicted_wait_us. kPulledWaitUnknown from
  // older workers.
  uint64_t pulled_wait_us = kPulledWaitUnknown;
  // LoraId (common/block_hash.h) of each LoRA adapter on the device now; the others the
  // worker serves (its Hello's loras) must be loaded first. Empty from older workers.
  std::vector<uint64_t> resident_loras;
  // The holders whose pull totals changed since the worker's previous batch. Empty from older
  // workers, and in a batch after which nothing was pulled.
  std::vector<PullTotals> pulls;
};

}  // namespace kvfleet
