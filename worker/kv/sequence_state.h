// KvCacheManager::Sequence: the manager's state of one sequence (its tokens, hashes and
// per-pool block tables), shared by the manager's sources (kv_cache_manager.cc and
// block_tables.cc). Internal to worker/kv: nothing outside the manager includes it.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#pragma once

#include <cstdint>
#include <vector>

#include "common/block_hash.h"
#include "worker/kv/hash_index.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/kv/retention.h"

namespace kvfleet::kv {

struct KvCacheManager::Sequence {
  struct PoolState {
    std::vector<BlockId> table;  // kept blocks, logical order
    std::vector<BlockId> linear; // logical block j -> its block, kNoBlock where dropped (View)
    std::vector<BlockId> held;   // stored blocks the window dropped, held until no stored block is left
    uint32_t num_sink_blocks = 0;
    uint32_t first_window_block = 0;
    uint32_t num_stored = 0;     // logical blocks [0, num_stored) are tree nodes
    NodeId last_node = kNoNode;  // node of logical block num_stored - 1
    bool storing = true;
  };
  uint32_t generation = 0;
  bool live = false;
  bool allocated = false;
  std::vector<TokenId> tokens;
  uint32_t prompt_len = 0;
  uint64_t seed = 0;
  uint64_t lora_id = 0;  // LoraId(spec.lora): its stored blocks' events carry it
  std::vector<BlockHash> raw_hashes;  // Contract 1 hashes of every full block
  KvCacheRetentionConfig retention;
  bool match_cached = true;  // SequenceSpec::match_cached
  uint32_t num_computed = 0;
  std::vector<PoolState> pools;
};

}  // namespace kvfleet::kv
