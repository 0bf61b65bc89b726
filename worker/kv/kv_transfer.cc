// KvCacheManager's side of KV transfer between workers (Contract 4, schema/README.md): the
// holder finds and pins a chain by hash while its bytes are copied out (ExportChain), or
// until a receiver on the same host has copied them device to device (PinChain, UnpinChain); the
// receiver registers the chain's tokens as a sequence, gets device blocks for what it does
// not hold, and stores them once their bytes are written (BeginImport, EndImport), so the
// usual stored events tell every router of the second holder. kv_cache_manager.h describes
// the manager.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#include <algorithm>
#include <utility>

#include "worker/kv/block_pool.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/kv/sequence_state.h"

namespace kvfleet::kv {

uint32_t KvCacheManager::FindRun(BlockHash parent, std::span<const BlockHash> hashes, std::vector<NodeId>* nodes) const {
  nodes->clear();
  // A grouped manager's nodes carry block hashes at B, its events group hashes at G: the
  // hashes a router names are not the ones its tree is indexed by.
  if (group_blocks_ > 1 || !reuse_enabled_ || hashes.empty()) return 0;
  const size_t P = pools_.size();
  std::vector<NodeId> prev(P, kNoNode);
  if (parent != 0) {
    for (size_t p = 0; p < P; ++p) {
      prev[p] = pools_[p]->FindHash(parent);
      if (prev[p] == kNoNode) return 0;
    }
  }
  std::vector<NodeId> found(P);
  uint32_t n = 0;
  for (const BlockHash h : hashes) {
    bool held = true;
    for (size_t p = 0; p < P && held; ++p) {
      found[p] = pools_[p]->FindHash(h);
      held = found[p] != kNoNode && pools_[p]->parent(found[p]) == prev[p];
    }
    if (!held) break;
    nodes->insert(nodes->end(), found.begin(), found.end());
    prev.swap(found);
    ++n;
  }
  return n;
}

uint32_t KvCacheManager::HeldRun(BlockHash parent, std::span<const BlockHash> hashes) const {
  std::vector<NodeId> nodes;
  return FindRun(parent, hashes, &nodes);
}

uint32_t KvCacheManager::LiveRun(BlockHash parent, std::span<const BlockHash> hashes) const {
  if (group_blocks_ > 1 || !reuse_enabled_ || hashes.empty()) return 0;
  const uint32_t B = config_.block_size;
  uint32_t best = 0;
  for (const auto& seq : seqs_) {
    const Sequence& s = *seq;
    if (!s.live) continue;
    // Blocks it stores: its prompt's full blocks (an import's chain is its whole prompt but
    // the one token past it).
    const uint32_t full = std::min<uint32_t>(static_cast<uint32_t>(s.raw_hashes.size()), s.prompt_len / B);
    uint32_t k = 0;  // the block of `s` that hashes[0] would be
    if (parent != 0) {
      while (k < full && HashAt(s, k) != parent) ++k;
      if (k == full) continue;
      ++k;
    }
    uint32_t n = 0;
    while (n < hashes.size() && k + n < full && HashAt(s, k + n) == hashes[n]) ++n;
    best = std::max(best, n);
  }
  return best;
}

std::vector<ExportedBlock> KvCacheManager::PinChain(BlockHash parent, std::span<const BlockHash> hashes) {
  std::vector<ExportedBlock> run;
  if (group_blocks_ > 1 || !reuse_enabled_ || hashes.empty()) return run;
  Tick();
  std::vector<NodeId> nodes;
  const uint32_t n = FindRun(parent, hashes, &nodes);
  if (n == 0) {
    FinishCall();
    return run;
  }
  const TimeNs now = clock_->Now();
  const size_t P = pools_.size();
  run.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const std::span<const NodeId> found(nodes.data() + size_t{i} * P, P);
    ExportedBlock b;
    b.hash = hashes[i];
    b.pools.resize(P);
    for (size_t p = 0; p < P; ++p) {
      b.pools[p] = BlockLocation{pools_[p]->tier(found[p]), pools_[p]->block(found[p])};
      pools_[p]->Pin(found[p], now);
      ++export_pins_[{static_cast<uint32_t>(p), b.pools[p].tier, b.pools[p].block}];
    }
    pools_[0]->Tokens(found[0], &b.tokens);
    run.push_back(std::move(b));
  }
  FinishCall();
  return run;
}

void KvCacheManager::UnpinChain(std::span<const ExportedBlock> run) {
  const TimeNs now = clock_->Now();
  for (const ExportedBlock& b : run) {
    for (size_t p = 0; p < b.pools.size(); ++p) {
      pools_[p]->Unpin(b.pools[p].tier, b.pools[p].block, now);
      auto it = export_pins_.find({static_cast<uint32_t>(p), b.pools[p].tier, b.pools[p].block});
      if (it != export_pins_.end() && --it->second == 0) export_pins_.erase(it);
    }
  }
  FinishCall();
}

Result<std::vector<ExportedBlock>> KvCacheManager::ExportChain(
    BlockHash parent, std::span<const BlockHash> hashes,
    const std::function<Status(std::span<const ExportedBlock>)>& copy) {
  std::vector<ExportedBlock> run = PinChain(parent, hashes);
  if (run.empty()) return run;
  const Status copied = copy(run);
  UnpinChain(run);
  if (!copied.ok()) return copied;
  return run;
}

Result<ImportPlan> KvCacheManager::BeginImport(SequenceSpec spec) {
  if (group_blocks_ > 1) {
    return FailedPrecondition("this worker groups its KV blocks for routing (token-level KV): it imports no chain by block");
  }
  if (!reuse_enabled_) return FailedPrecondition("prefix reuse is off on this worker: an imported chain would not be kept");
  const uint32_t B = config_.block_size;
  if (spec.prompt.empty() || spec.prompt.size() % B != 0) {
    return InvalidArgument("an imported chain is whole blocks of " + std::to_string(B) + " tokens, not " +
                           std::to_string(spec.prompt.size()));
  }
  const uint32_t n = static_cast<uint32_t>(spec.prompt.size() / B);
  // One token past the chain, so Match can find its last block (the last token of a
  // sequence is always computed); EndImport commits the chain's tokens only.
  spec.prompt.push_back(spec.prompt.back());
  spec.match_cached = true;
  KVF_ASSIGN_OR_RETURN(const SequenceId id, AddSequence(std::move(spec)));
  Match(id);
  if (!CanAllocate(id)) {
    Release(id);
    return ResourceExhausted("no room for " + std::to_string(n) + " imported blocks");
  }
  if (Status st = Allocate(id); !st.ok()) {
    Release(id);
    return st;
  }
  ++live_imports_;
  return ImportPlan{id, std::min(n, NumComputedTokens(id) / B), n};
}

void KvCacheManager::EndImport(const ImportPlan& plan, uint32_t written) {
  StoreImport(plan, written);
  ReleaseImport(plan);
}

void KvCacheManager::StoreImport(const ImportPlan& plan, uint32_t written) {
  // Blocks before first_block were held already; a partly reused one after them (computed
  // tokens past first_block · B) is overwritten whole by the first written block.
  const uint32_t end = std::min(plan.num_blocks, plan.first_block + written);
  if (written > 0) Commit(plan.seq, end * config_.block_size);
}

void KvCacheManager::ReleaseImport(const ImportPlan& plan) {
  Release(plan.seq);
  --live_imports_;
}

}  // namespace kvfleet::kv
