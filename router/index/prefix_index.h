// PrefixIndex: what routing asks of a block index. Two implement it: the event-fed
// GlobalIndex (global_index.h, the kv policy) and routing's PredictedIndex (the router's own
// decisions only, the approx policy).
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "router/core/worker.h"

namespace kvfleet::router {

// One worker's match for a request: `device_blocks` leading blocks held on the device,
// then `host_blocks` more held on the host. A predicted entry counts as a device block.
struct PrefixMatch {
  WorkerId worker = 0;
  uint32_t device_blocks = 0;  // leading blocks on the device tier
  uint32_t host_blocks = 0;    // further leading blocks on the host tier
  // Leading blocks it holds by its own events, the router's predicted entries excluded
  // (HeldRun of the matched blocks): what a pull from it can bring. <= device + host.
  uint32_t held_blocks = 0;
  // When the run has predicted entries (held_blocks < device + host): milliseconds until the
  // latest of them expires (an index without expiries: 0). A prediction lives the event lag
  // beyond the request's predicted first token (Router::Commit), so this less that lag is
  // about when the worker will have stored the run.
  uint32_t predicted_ms_left = 0;
};

class PrefixIndex {
 public:
  virtual ~PrefixIndex() = default;
  // Clears *out and fills it with, for every worker holding the first block, how many
  // leading blocks of `hashes` it holds (held_blocks included). Read-only.
  virtual void FindMatches(std::span<const BlockHash> hashes, std::vector<PrefixMatch>* out) const = 0;
  // Records that `worker` will hold `hashes` (on its device tier) for `ttl`.
  virtual void InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) = 0;
  virtual void RemoveWorker(WorkerId worker) = 0;
  // How many blocks `worker` can keep (0: unknown). An index of predictions alone uses it to
  // forget what the worker's own LRU would have evicted; an event-fed index ignores it.
  virtual void SetCapacity(WorkerId /*worker*/, uint64_t /*blocks*/) {}
  // Blocks `worker` holds on its device tier, predicted entries excluded: the size of its
  // cache as the index sees it (the sglang policy's "smallest tree"). 0 where not counted.
  virtual uint64_t CachedBlocks(WorkerId /*worker*/) const { return 0; }
  // The leading blocks of `hashes` that `worker` holds by its own events, the router's
  // predicted entries excluded: what a pull from it can bring (a block the router sent there a
  // moment ago may not be computed yet). An index of predictions alone knows nothing better
  // and answers its match. FindMatches answers it for every matching worker at once
  // (PrefixMatch::held_blocks); this is the one-worker form.
  virtual uint32_t HeldRun(WorkerId worker, std::span<const BlockHash> hashes) const {
    std::vector<PrefixMatch> matches;
    FindMatches(hashes, &matches);
    for (const PrefixMatch& m : matches) {
      if (m.worker == worker) return m.device_blocks + m.host_blocks;
    }
    return 0;
  }
};

}  // namespace kvfleet::router
