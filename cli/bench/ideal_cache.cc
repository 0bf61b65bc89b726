#include "cli/bench/ideal_cache.h"

#include <unordered_set>

namespace kvfleet::bench {

namespace {
// Identity of a prefix: a chained mix of its block ids (the same idea as Contract 1's
// sequence hash, over trace ids instead of tokens).
uint64_t ChainId(uint64_t parent, uint64_t id) {
  uint64_t z = parent ^ (id + 0x9E3779B97F4A7C15ull + (parent << 6) + (parent >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

IdealReuse ComputeIdealReuse(const std::vector<ScaledRequest>& requests, uint32_t block_tokens,
                             double measured_from_s) {
  IdealReuse out;
  std::unordered_set<uint64_t> seen;
  std::vector<uint64_t> chain;
  for (const ScaledRequest& r : requests) {
    const bool measured = r.arrival_s >= measured_from_s;
    const uint32_t full_blocks = r.input_length / block_tokens;
    chain.clear();
    uint64_t prefix = 0;
    for (uint32_t b = 0; b < full_blocks; ++b) {
      prefix = ChainId(prefix, r.source->hash_ids[b]);
      chain.push_back(prefix);
    }
    uint32_t hits = 0;
    while (hits < full_blocks && seen.count(chain[hits])) ++hits;
    if (measured) {
      out.prompt_tokens += r.input_length;
      out.block_refs += full_blocks;
      out.hit_blocks += hits;
      out.hit_tokens += uint64_t{hits} * block_tokens;
    }
    seen.insert(chain.begin(), chain.end());  // after matching: no self-hits
  }
  return out;
}

}  // namespace kvfleet::bench
