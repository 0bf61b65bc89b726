// Contract 5, router gossip (schema/gossip.capnp) as plain structs, and its one encoding.
// Each router of a fleet publishes a RouterGossip, its own in-flight counts per worker and
// its routed work per model, and reads its peers' (router/fleet/gossip.h); both ends use
// this codec. A frame is untrusted: DecodeGossip checks every field against the bounds of
// schema/limits.h, so a garbage or forged frame is an error, never a crash.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvfleet {

// One worker's requests from the sender (schema/gossip.capnp WorkerInflight).
struct GossipWorker {
  std::string worker;           // its workerId
  uint32_t requests = 0;        // in flight
  uint32_t waiting = 0;         // of those, without a first token; <= requests
  uint64_t prefill_tokens = 0;  // expected uncached, for the waiting ones
  uint64_t prompt_tokens = 0;   // the waiting ones' whole prompts
  bool operator==(const GossipWorker&) const = default;
};

// The sender's routed work on one model (schema/gossip.capnp ModelWork).
struct GossipModel {
  std::string model;
  double prefill_tokens_per_second = 0;  // finite, >= 0
  bool operator==(const GossipModel&) const = default;
};

struct RouterGossip {
  std::string router_id;  // 1..256 bytes, no control characters
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  std::vector<GossipWorker> workers;  // at most limits::kMaxGossipWorkers, names distinct
  std::vector<GossipModel> models;    // at most limits::kMaxGossipModels, names distinct
  bool operator==(const RouterGossip&) const = default;
};

std::string EncodeGossip(const RouterGossip& gossip);
// An untrusted frame: DataLoss when it does not decode as a RouterGossip; InvalidArgument
// when it decodes but breaks a bound above (an empty or overlong name, a name twice, more
// waiting than requests, a count past what a worker could hold, a rate not finite).
Result<RouterGossip> DecodeGossip(const void* data, size_t size);

}  // namespace kvfleet
