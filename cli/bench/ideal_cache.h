// The trace's ceiling on prefix reuse: what an infinite cache that never evicts would
// serve, at the scaled block granularity.
//
// Requests are taken in arrival order. A request's leading blocks whose prefix (the ids
// from the start up to and including that block) appeared in any earlier request are
// hits; the first block that misses ends the run, as a prefix cache cannot reuse past
// it. Only full blocks count; a request never hits on itself.
//
// Thread safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/bench/trace.h"

namespace kvfleet::bench {

struct IdealReuse {
  uint64_t prompt_tokens = 0;   // sum of scaled input lengths
  uint64_t hit_tokens = 0;      // tokens in hit blocks
  uint64_t block_refs = 0;      // full blocks over all requests
  uint64_t hit_blocks = 0;      // of those, hits
  double token_ratio() const { return prompt_tokens ? double(hit_tokens) / double(prompt_tokens) : 0.0; }
  double block_ratio() const { return block_refs ? double(hit_blocks) / double(block_refs) : 0.0; }
};

// Requests arriving before `measured_from_s` fill the cache but are not counted (a warm-up).
// REQUIRES: block_tokens >= 1; each request's source outlives the call.
IdealReuse ComputeIdealReuse(const std::vector<ScaledRequest>& requests, uint32_t block_tokens,
                             double measured_from_s = 0);

}  // namespace kvfleet::bench
