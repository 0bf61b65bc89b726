// KvCacheManager's per-sequence block tables: sliding windows and chunked attention
// (which blocks a sequence still needs, TrimWindows), and the token -> slot mapping the
// attention kernels read (View, SlotOf, CachePosition, ChunkBlocks). kv_cache_manager.h
// describes the manager; kv_cache_manager.cc holds the rest of it.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#include "worker/kv/kv_cache_manager.h"

#include <algorithm>

#include "common/check.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/sequence_state.h"

namespace kvfleet::kv {

uint32_t KvCacheManager::ReuseLimit(uint32_t pool) const {
  uint32_t limit = layouts_[pool].window;
  const uint32_t C = layouts_[pool].attention_chunk;
  if (C != 0) limit = limit == 0 ? C : std::min(limit, C);
  return limit;
}

uint32_t KvCacheManager::MaxSequenceBlocks(uint32_t pool) const {
  const uint64_t B = config_.block_size;
  const uint64_t W = layouts_[pool].window;
  const uint64_t C = layouts_[pool].attention_chunk;
  if (W == 0 && C == 0) return 0;
  // After Commit(q) and the Append of the next token: [q + 1 - W, q + 1] spans at most
  // ceil((W - 1) / B) + 1 blocks; a chunk's [q - q % C, q + 1] at most C / B + 1.
  uint64_t seen = UINT64_MAX;
  if (W != 0) seen = (W - 1 + B - 1) / B + 1;
  if (C != 0) seen = std::min(seen, C / B + 1);
  const uint64_t sinks = (layouts_[pool].sink_tokens + B - 1) / B;
  const uint64_t held = reuse_enabled_ ? ReuseLimit(pool) / B : 0;
  return static_cast<uint32_t>(sinks + seen + held);
}

void KvCacheManager::TrimWindows(Sequence& s) {
  const uint32_t B = config_.block_size;
  const TimeNs now = clock_->Now();
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    const uint32_t W = layouts_[p].window;
    const uint32_t C = layouts_[p].attention_chunk;
    if (W == 0 && C == 0) continue;
    BlockPool& pool = *pools_[p];
    Sequence::PoolState& st = s.pools[p];
    // The next query is at position q = num_computed and sees [lo, q]: lo = q - W + 1 with a
    // window, and at least the start of q's chunk with chunked attention (Llama 4). Later
    // queries see no earlier token, so a block wholly before lo is seen by no query again.
    // StreamingLLM's dense context phase: a prompt query sees the whole prompt, so nothing
    // is dropped before the prompt is computed.
    const uint64_t q = s.num_computed;
    if (layouts_[p].dense_context && q < s.prompt_len) continue;
    uint64_t lo = 0;
    if (W != 0 && q + 1 > W) lo = q + 1 - W;
    if (C != 0) lo = std::max(lo, q / C * C);
    uint32_t k = 0;
    while (st.num_sink_blocks + k < st.table.size() && uint64_t{st.first_window_block + k + 1} * B <= lo) ++k;
    if (k == 0) continue;
    for (uint32_t j = st.num_sink_blocks; j < st.num_sink_blocks + k; ++j) {
      const BlockId b = st.table[j];
      st.linear[st.first_window_block + (j - st.num_sink_blocks)] = kNoBlock;
      if (pool.node_of(Tier::kDevice, b) != kNoNode) {
        st.held.push_back(b);  // released with the last stored block, keeping invariant 6
      } else {
        pool.Unpin(Tier::kDevice, b, now);
      }
    }
    st.table.erase(st.table.begin() + st.num_sink_blocks, st.table.begin() + st.num_sink_blocks + k);
    st.first_window_block += k;
    if (!st.held.empty() && st.num_stored <= st.first_window_block) {
      for (auto it = st.held.rbegin(); it != st.held.rend(); ++it) pool.Unpin(Tier::kDevice, *it, now);
      st.held.clear();
    }
  }
}

uint32_t KvCacheManager::NumTokens(SequenceId id) const { return static_cast<uint32_t>(Seq(id).tokens.size()); }
uint32_t KvCacheManager::NumComputedTokens(SequenceId id) const { return Seq(id).num_computed; }
bool KvCacheManager::IsAllocated(SequenceId id) const { return Seq(id).allocated; }

PoolView KvCacheManager::View(SequenceId id, uint32_t pool) const {
  const Sequence::PoolState& st = Seq(id).pools.at(pool);
  return PoolView{st.table, st.num_sink_blocks, st.first_window_block, st.linear};
}

std::optional<uint32_t> KvCacheManager::TableIndex(const Sequence& s, uint32_t pool, uint32_t t) const {
  const Sequence::PoolState& st = s.pools.at(pool);
  const uint32_t b = t / config_.block_size;
  uint32_t j;
  if (b < st.num_sink_blocks) {
    j = b;
  } else if (b < st.first_window_block) {
    return std::nullopt;
  } else {
    j = st.num_sink_blocks + (b - st.first_window_block);
  }
  if (j >= st.table.size()) return std::nullopt;
  return j;
}

std::optional<uint64_t> KvCacheManager::SlotOf(SequenceId id, uint32_t pool, uint32_t t) const {
  const Sequence& s = Seq(id);
  const auto j = TableIndex(s, pool, t);
  if (!j) return std::nullopt;
  return uint64_t{s.pools[pool].table[*j]} * config_.block_size + t % config_.block_size;
}

void KvCacheManager::SlotsOf(SequenceId id, uint32_t pool, uint32_t begin, uint32_t end,
                             std::vector<int64_t>* out) const {
  const Sequence& s = Seq(id);
  KVF_CHECK(begin <= end && end <= s.tokens.size()) << "SlotsOf(" << begin << ", " << end << ")";
  const uint32_t B = config_.block_size;
  out->reserve(out->size() + (end - begin));
  for (uint32_t t = begin; t < end; ++t) {
    const auto j = TableIndex(s, pool, t);
    out->push_back(j ? static_cast<int64_t>(uint64_t{s.pools[pool].table[*j]} * B + t % B) : -1);
  }
}

std::optional<uint32_t> KvCacheManager::CachePosition(SequenceId id, uint32_t pool, uint32_t t) const {
  const auto j = TableIndex(Seq(id), pool, t);
  if (!j) return std::nullopt;
  return *j * config_.block_size + t % config_.block_size;
}

std::pair<uint32_t, uint32_t> KvCacheManager::ChunkBlocks(SequenceId id, uint32_t chunk) const {
  KVF_CHECK(config_.attention_chunk_size > 0) << "chunked attention is off";
  const uint64_t C = config_.attention_chunk_size;
  const uint64_t B = config_.block_size;
  const uint64_t len = Seq(id).tokens.size();
  const uint64_t first_token = chunk * C;
  const uint64_t end_token = std::min(len, (chunk + 1) * C);
  if (first_token >= end_token) return {0, 0};
  return {static_cast<uint32_t>(first_token / B), static_cast<uint32_t>((end_token + B - 1) / B)};
}

}  // namespace kvfleet::kv
