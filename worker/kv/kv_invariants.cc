// KvCacheManager::CheckInvariants: the manager's invariants (kv_cache_manager.h), checked
// by the tests after every call and by the worker on demand.
//
// Thread safety: thread-compatible, as the manager.
#include <string>
#include <vector>

#include "worker/kv/block_pool.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/kv/sequence_state.h"

namespace kvfleet::kv {

Status KvCacheManager::CheckInvariants() const {
  for (const auto& pool : pools_) KVF_RETURN_IF_ERROR(pool->CheckInvariants());
  // Invariant 3: device refcounts equal the holds of live sequences and of runs pinned for a
  // transfer; host blocks are held only inside a call or by such a run.
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    const BlockPool& pool = *pools_[p];
    std::vector<uint32_t> holds(pool.num_blocks(Tier::kDevice), 0);
    for (const auto& s : seqs_) {
      if (!s->live || !s->allocated) continue;
      const Sequence::PoolState& st = s->pools[p];
      for (BlockId b : st.table) ++holds[b];
      for (BlockId b : st.held) ++holds[b];
      // Invariant 8: the linear table is the block table indexed by logical block.
      size_t kept = 0;
      for (size_t j = 0; j < st.linear.size(); ++j) {
        if (st.linear[j] == kNoBlock) continue;
        const size_t i = j < st.num_sink_blocks ? j : st.num_sink_blocks + (j - st.first_window_block);
        if (j >= st.num_sink_blocks && j < st.first_window_block) return Internal("invariant 8: a dropped block in the linear table");
        if (i >= st.table.size() || st.table[i] != st.linear[j]) return Internal("invariant 8: linear table entry " + std::to_string(j) + " is not the block table's");
        ++kept;
      }
      if (kept != st.table.size()) return Internal("invariant 8: the linear table misses kept blocks");
    }
    std::vector<uint32_t> host_holds(pool.num_blocks(Tier::kHost), 0);
    for (const auto& [where, n] : export_pins_) {
      const auto& [pool_index, tier, block] = where;
      if (pool_index != p) continue;
      (tier == Tier::kDevice ? holds : host_holds)[block] += n;
    }
    for (BlockId b = 0; b < holds.size(); ++b) {
      if (holds[b] != pool.refcount(Tier::kDevice, b)) {
        return Internal("invariant 3: pool " + std::to_string(p) + " device block " + std::to_string(b) +
                        " refcount " + std::to_string(pool.refcount(Tier::kDevice, b)) + " but " +
                        std::to_string(holds[b]) + " holds");
      }
    }
    for (BlockId b = 0; b < pool.num_blocks(Tier::kHost); ++b) {
      if (pool.refcount(Tier::kHost, b) != host_holds[b]) return Internal("invariant 3: a host block is held between calls");
    }
  }
  if (!copies_.empty()) return Internal("copies left unissued");
  return Status::Ok();
}

}  // namespace kvfleet::kv
