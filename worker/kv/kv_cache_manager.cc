#include "worker/kv/kv_cache_manager.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/event_list.h"
#include "worker/kv/sequence_state.h"

namespace kvfleet::kv {

struct KvCacheManager::Plan {
  struct PoolPlan {
    std::vector<NodeId> chain;    // matched full blocks (may run past `full`)
    uint32_t device_prefix = 0;   // leading chain nodes on the device
    NodeId partial_src = kNoNode;
  };
  std::vector<PoolPlan> pools;
  // What the plan was computed for: reused while none of it changed (Match, CanAllocate
  // and Allocate of one sequence in a row walk the tree once).
  SequenceId id = 0;
  size_t num_tokens = 0;
  std::vector<uint64_t> versions;
  bool valid = false;
  uint32_t full = 0;     // full blocks every pool matched
  uint32_t partial = 0;  // tokens of block `full` every pool can copy
  uint32_t device_full = 0;
};

namespace {
uint32_t CeilDiv(uint64_t a, uint64_t b) { return static_cast<uint32_t>((a + b - 1) / b); }
}  // namespace

Result<std::unique_ptr<KvCacheManager>> KvCacheManager::Make(const KvCacheConfig& config, BlockCopier* copier,
                                                             const Clock* clock, KvTestHooks hooks) {
  KVF_RETURN_IF_ERROR(config.Validate());
  if (copier == nullptr || clock == nullptr) return InvalidArgument("kv: copier and clock are required");
  KVF_ASSIGN_OR_RETURN(std::vector<PoolLayout> layouts, ComputePools(config));
  return std::unique_ptr<KvCacheManager>(new KvCacheManager(config, std::move(layouts), copier, clock, hooks));
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config, std::vector<PoolLayout> layouts, BlockCopier* copier,
                               const Clock* clock, KvTestHooks hooks)
    : config_(config),
      layouts_(std::move(layouts)),
      copier_(copier),
      clock_(clock),
      hooks_(hooks),
      events_(std::make_unique<EventList>(config.event_buffer_max_size)),
      muted_events_(std::make_unique<EventList>(0)),
      scratch_(std::make_unique<Plan>()) {
  auto log = Logger("kv");
  // Reuse stays on with StreamingLLM sinks (TensorRT-LLM turns it off): a model with sinks has a
  // windowed pool, so only blocks within its first window W are stored and matched (every
  // pool must match), and a query at q < W sees [0, q] at its own position under every mask
  // (window, sinks, dense context, position shift): their KV is what a fresh run computes.
  reuse_enabled_ = config.enable_block_reuse;
  group_blocks_ = config.EventBlockSize() / config.block_size;
  BlockPool::Options opts;
  opts.block_size = config.block_size;
  opts.group_blocks = group_blocks_;
  opts.enable_offload = config.enable_offload;
  opts.offload_min_priority = config.offload_min_priority;
  opts.include_tokens = config.events_include_tokens;
  opts.partial_reuse_max_candidates = config.partial_reuse_max_candidates;
  opts.vocab_size = config.vocab_size;
  opts.epoch = clock->Now();
  opts.first_lru_tick = hooks.first_lru_tick;
  // Of pools sharing a window, those storing the shortest prefix (ReuseLimit 0: no limit)
  // publish; a pool storing more (Llama 4's full-attention NoPE layers beside its chunked
  // ones) would announce blocks no hit can use. Pools storing as much (KV-head groups) all
  // publish, as they always have.
  auto stored = [this](uint32_t p) { return ReuseLimit(p) == 0 ? UINT64_MAX : uint64_t{ReuseLimit(p)}; };
  publishes_.assign(layouts_.size(), true);
  for (uint32_t i = 0; i < layouts_.size(); ++i) {
    for (uint32_t j = 0; j < layouts_.size(); ++j) {
      if (j != i && layouts_[j].window == layouts_[i].window && stored(j) < stored(i)) publishes_[i] = false;
    }
  }
  for (uint32_t i = 0; i < layouts_.size(); ++i) {
    const PoolLayout& l = layouts_[i];
    pools_.push_back(std::make_unique<BlockPool>(i, l, opts, publishes_[i] ? events_.get() : muted_events_.get()));
    std::string window = l.window == 0 ? std::string("full") : std::to_string(l.window);
    if (l.sink_tokens > 0) window += " + " + std::to_string(l.sink_tokens) + " sinks";
    if (l.dense_context) window += " (StreamingLLM: dense context, position shift)";
    log->info("pool {}: window {} kv_heads {} layers {}: {} device blocks ({} tokens), {} host blocks ({} tokens), "
              "{} bytes per block",
              i, window, l.num_kv_heads, l.layers.size(),
              l.device_blocks, uint64_t{l.device_blocks} * config.block_size, l.host_blocks,
              uint64_t{l.host_blocks} * config.block_size, l.bytes_per_block);
    if (reuse_enabled_ && l.windowed()) {
      log->info("pool {}: blocks past the first {} tokens are not reused (the window makes the cache cyclic)", i,
                l.window);
    }
    if (reuse_enabled_ && l.attention_chunk != 0 && (!l.windowed() || l.attention_chunk < l.window)) {
      log->info("pool {}: blocks past the first {} tokens are not reused (chunked attention drops earlier chunks)", i,
                l.attention_chunk);
    }
    // Routers count and hash event blocks of G tokens.
    if (publishes_[i]) events_->Push(KvEvent{l.window, CreatedEvent{{l.device_blocks / group_blocks_, l.host_blocks / group_blocks_},
                                                 config.EventBlockSize()}});
  }
  scratch_->pools.resize(pools_.size());
  scratch_->versions.resize(pools_.size());
}

KvCacheManager::~KvCacheManager() = default;

// ---------------------------------------------------------------- sequences

KvCacheManager::Sequence& KvCacheManager::Seq(SequenceId id) {
  const uint32_t slot = static_cast<uint32_t>(id);
  KVF_CHECK(slot < seqs_.size() && seqs_[slot]->live && seqs_[slot]->generation == (id >> 32))
      << "unknown sequence " << id;
  return *seqs_[slot];
}

const KvCacheManager::Sequence& KvCacheManager::Seq(SequenceId id) const {
  return const_cast<KvCacheManager*>(this)->Seq(id);
}

BlockHash KvCacheManager::HashAt(const Sequence& s, uint32_t i) const {
  return hooks_.hash_override != nullptr ? hooks_.hash_override(s.raw_hashes[i]) : s.raw_hashes[i];
}

void KvCacheManager::ExtendHashes(Sequence& s) {
  const uint32_t B = config_.block_size;
  const size_t full = s.tokens.size() / B;
  const std::span<const TokenId> tokens(s.tokens);
  if (group_blocks_ == 1) {
    uint64_t parent = s.raw_hashes.empty() ? s.seed : s.raw_hashes.back();
    for (size_t i = s.raw_hashes.size(); i < full; ++i) {
      parent = ChainBlockHash(parent, LocalBlockHash(tokens.subspan(i * B, B), s.seed));
      s.raw_hashes.push_back(parent);
    }
    return;
  }
  // Routing groups of R = G / B blocks: the last block of group k carries Contract 1's hash
  // of the prefix at block size G (chained from the previous group's last block), so its
  // events are the ones a G-block worker would send; the blocks inside a group chain from
  // their predecessor. Every key is still a function of the whole prefix.
  const size_t R = group_blocks_;
  for (size_t i = s.raw_hashes.size(); i < full; ++i) {
    BlockHash h;
    if (i % R == R - 1) {
      const uint64_t parent = i >= R ? s.raw_hashes[i - R] : s.seed;
      h = ChainBlockHash(parent, LocalBlockHash(tokens.subspan((i + 1 - R) * B, R * B), s.seed));
    } else {
      const uint64_t parent = i > 0 ? s.raw_hashes[i - 1] : s.seed;
      h = ChainBlockHash(parent, LocalBlockHash(tokens.subspan(i * B, B), s.seed));
    }
    s.raw_hashes.push_back(h);
  }
}

Result<SequenceId> KvCacheManager::AddSequence(SequenceSpec spec) {
  if (spec.prompt.empty()) return InvalidArgument("kv: empty prompt");
  if (spec.prompt.size() > config_.max_seq_len) {
    return OutOfRange("kv: prompt of " + std::to_string(spec.prompt.size()) + " tokens exceeds max_seq_len " +
                      std::to_string(config_.max_seq_len));
  }
  KVF_RETURN_IF_ERROR(spec.retention.Validate());
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(seqs_.size());
    seqs_.push_back(std::make_unique<Sequence>());
  }
  Sequence& s = *seqs_[slot];
  s.live = true;
  s.allocated = false;
  s.prompt_len = static_cast<uint32_t>(spec.prompt.size());
  s.tokens = std::move(spec.prompt);
  s.seed = HashSeed(HashNamespace{spec.model, spec.lora, spec.cache_salt});
  s.lora_id = LoraId(spec.lora);
  s.raw_hashes.clear();
  s.retention = std::move(spec.retention);
  s.match_cached = spec.match_cached;
  s.num_computed = 0;
  s.pools.assign(pools_.size(), {});
  if (reuse_enabled_) ExtendHashes(s);
  return (SequenceId{s.generation} << 32) | slot;
}

void KvCacheManager::PlanMatch(SequenceId id, const Sequence& s, Plan* plan) const {
  bool fresh = plan->valid && plan->id == id && plan->num_tokens == s.tokens.size();
  for (uint32_t p = 0; fresh && p < pools_.size(); ++p) fresh = plan->versions[p] == pools_[p]->version();
  if (fresh) return;
  plan->valid = true;
  plan->id = id;
  plan->num_tokens = s.tokens.size();
  plan->versions.resize(pools_.size());
  for (uint32_t p = 0; p < pools_.size(); ++p) plan->versions[p] = pools_[p]->version();
  plan->full = plan->partial = plan->device_full = 0;
  for (auto& pp : plan->pools) {
    pp.chain.clear();
    pp.device_prefix = 0;
    pp.partial_src = kNoNode;
  }
  if (!reuse_enabled_ || !s.match_cached) return;
  const uint32_t B = config_.block_size;
  const uint32_t len = static_cast<uint32_t>(s.tokens.size());
  const std::span<const TokenId> tokens(s.tokens);
  // The last token is always computed, so a full hit still produces logits.
  uint32_t full = (len - 1) / B;
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    const BlockPool& pool = *pools_[p];
    Plan::PoolPlan& pp = plan->pools[p];
    NodeId parent = kNoNode;
    bool on_device = true;
    // Lookups are cache misses on a large tree: prefetch index slots kSlotAhead blocks
    // ahead and nodes kNodeAhead blocks ahead so the misses overlap.
    constexpr uint32_t kSlotAhead = 16;
    constexpr uint32_t kNodeAhead = 6;
    for (uint32_t i = 0; i < std::min(full, kSlotAhead); ++i) pool.PrefetchSlot(HashAt(s, i));
    for (uint32_t i = 0; i < full; ++i) {
      if (i + kSlotAhead < full) pool.PrefetchSlot(HashAt(s, i + kSlotAhead));
      if (i + kNodeAhead < full) {
        // A hash with no index candidate is certainly absent: the chain ends there at the latest.
        if (!pool.PrefetchCandidate(HashAt(s, i + kNodeAhead))) full = std::min(full, i + kNodeAhead);
      }
      const NodeId n = pool.Find(parent, HashAt(s, i), tokens.subspan(size_t{i} * B, B));
      if (n == kNoNode) break;
      pp.chain.push_back(n);
      on_device = on_device && pool.tier(n) == Tier::kDevice;
      if (on_device) ++pp.device_prefix;
      parent = n;
    }
    full = std::min<uint32_t>(full, static_cast<uint32_t>(pp.chain.size()));
  }
  plan->full = full;
  plan->device_full = full;
  for (const auto& pp : plan->pools) plan->device_full = std::min(plan->device_full, pp.device_prefix);
  if (!config_.enable_partial_reuse) return;
  const uint32_t want_end = std::min(len - 1, (full + 1) * B);
  if (want_end <= full * B) return;
  const std::span<const TokenId> want = tokens.subspan(size_t{full} * B, want_end - full * B);
  uint32_t partial = static_cast<uint32_t>(want.size());
  for (uint32_t p = 0; p < pools_.size() && partial > 0; ++p) {
    Plan::PoolPlan& pp = plan->pools[p];
    if (pp.chain.size() > full) {
      pp.partial_src = pp.chain[full];  // the whole block matches; the last token is recomputed
      continue;
    }
    const NodeId parent = full == 0 ? kNoNode : pp.chain[full - 1];
    partial = std::min(partial, pools_[p]->BestPartial(parent, want, s.seed, &pp.partial_src));
  }
  plan->partial = partial;
}

MatchInfo KvCacheManager::Match(SequenceId id) const {
  const Sequence& s = Seq(id);
  KVF_CHECK(!s.allocated) << "Match() on an allocated sequence";
  PlanMatch(id, s, scratch_.get());
  const uint32_t B = config_.block_size;
  return MatchInfo{scratch_->device_full * B, (scratch_->full - scratch_->device_full) * B, scratch_->partial};
}

uint32_t KvCacheManager::BlocksNeeded(const Sequence& s, uint32_t p, const Plan& plan) const {
  const uint32_t total = CeilDiv(s.tokens.size(), config_.block_size);
  return total - std::min(plan.full, plan.pools[p].device_prefix);
}

bool KvCacheManager::Fits(const Sequence& s, const Plan& plan) const {
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    const BlockPool& pool = *pools_[p];
    const Plan::PoolPlan& pp = plan.pools[p];
    // Matched device blocks nobody holds count as reclaimable now but will be held.
    uint32_t claimed = 0;
    for (uint32_t i = 0; i < std::min(plan.full, pp.device_prefix); ++i) {
      if (pool.refcount(Tier::kDevice, pool.block(pp.chain[i])) == 0) ++claimed;
    }
    if (plan.partial > 0 && pool.tier(pp.partial_src) == Tier::kDevice &&
        pool.refcount(Tier::kDevice, pool.block(pp.partial_src)) == 0) {
      ++claimed;
    }
    const uint64_t available = pool.num_free_or_evictable(Tier::kDevice) - claimed;
    if (BlocksNeeded(s, p, plan) > available) return false;
  }
  return true;
}

bool KvCacheManager::CanAllocate(SequenceId id) const {
  const Sequence& s = Seq(id);
  if (s.allocated) return false;
  PlanMatch(id, s, scratch_.get());
  return Fits(s, *scratch_);
}

Status KvCacheManager::Allocate(SequenceId id) {
  Sequence& s = Seq(id);
  if (s.allocated) return FailedPrecondition("kv: sequence already holds blocks");
  Tick();
  Plan& plan = *scratch_;
  PlanMatch(id, s, &plan);
  if (!Fits(s, plan)) {
    FinishCall();
    return ResourceExhausted("kv: not enough free or evictable blocks for " + std::to_string(s.tokens.size()) +
                             " tokens");
  }
  const TimeNs now = clock_->Now();
  const uint32_t B = config_.block_size;
  const uint32_t len = static_cast<uint32_t>(s.tokens.size());
  const uint32_t total = CeilDiv(len, B);
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    BlockPool& pool = *pools_[p];
    Plan::PoolPlan& pp = plan.pools[p];
    Sequence::PoolState& st = s.pools[p];
    st = {};
    st.table.reserve(total);
    for (uint32_t i = 0; i < plan.full; ++i) {
      pool.Pin(pp.chain[i], now);
      pool.Raise(pp.chain[i], RetentionForBlock(s.retention, s.prompt_len, i * B, (i + 1) * B), now);
    }
    const NodeId src = plan.partial > 0 ? pp.partial_src : kNoNode;
    if (src != kNoNode) pool.Pin(src, now);  // so eviction below cannot take it
    KVF_CHECK(pool.EnsureDeviceFree(BlocksNeeded(s, p, plan), &copies_)) << "Fits() promised blocks";
    for (uint32_t i = 0; i < plan.full; ++i) {
      NodeId& n = pp.chain[i];
      if (pool.tier(n) == Tier::kHost) n = pool.Onboard(n, &copies_);  // a new id on the device
      st.table.push_back(pool.block(n));
    }
    if (src != kNoNode) {
      // Partial reuse: copy the whole block; the sequence recomputes and overwrites the rest.
      pool.AllocateDevice(1, &st.table);
      copies_.push_back({p, pool.tier(src), pool.block(src), Tier::kDevice, st.table.back()});
      pool.Unpin(pool.tier(src), pool.block(src), now);
      pool.CountPartialCopy();
    }
    pool.AllocateDevice(total - static_cast<uint32_t>(st.table.size()), &st.table);
    st.linear = st.table;  // nothing dropped yet: logical block j is table[j]
    st.num_stored = plan.full;
    st.last_node = plan.full > 0 ? pp.chain[plan.full - 1] : kNoNode;
    st.storing = reuse_enabled_;
    if (layouts_[p].windowed()) st.num_sink_blocks = CeilDiv(config_.sink_tokens, B);
    st.first_window_block = st.num_sink_blocks;
  }
  s.allocated = true;
  s.num_computed = plan.full * B + plan.partial;
  reused_tokens_ += s.num_computed;
  missed_tokens_ += len - s.num_computed;
  TrimWindows(s);
  FinishCall();
  return Status::Ok();
}

void KvCacheManager::Commit(SequenceId id, uint32_t n) {
  Sequence& s = Seq(id);
  KVF_CHECK(s.allocated) << "Commit() before Allocate()";
  KVF_CHECK(n >= s.num_computed && n <= s.tokens.size()) << "Commit(" << n << ") with " << s.num_computed
                                                          << " computed of " << s.tokens.size();
  Tick();
  s.num_computed = n;
  StoreFullBlocks(s);
  TrimWindows(s);
  FinishCall();
}

void KvCacheManager::StoreFullBlocks(Sequence& s) {
  if (!reuse_enabled_) return;
  const uint32_t B = config_.block_size;
  const uint32_t full = s.num_computed / B;
  const TimeNs now = clock_->Now();
  const std::span<const TokenId> tokens(s.tokens);
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    BlockPool& pool = *pools_[p];
    Sequence::PoolState& st = s.pools[p];
    const uint32_t limit = ReuseLimit(p);
    constexpr uint32_t kSlotAhead = 8;  // see PlanMatch
    for (uint32_t i = st.num_stored; st.storing && i < std::min(full, st.num_stored + kSlotAhead); ++i) {
      pool.PrefetchSlot(HashAt(s, i));
    }
    while (st.storing && st.num_stored < full) {
      const uint32_t i = st.num_stored;
      if (i + kSlotAhead < full) pool.PrefetchSlot(HashAt(s, i + kSlotAhead));
      constexpr uint32_t kEntryAhead = 4;  // the block Store will write a few blocks on
      const uint32_t ahead_block = i + kEntryAhead;
      const uint32_t ahead = ahead_block < st.num_sink_blocks ? ahead_block
                             : ahead_block >= st.first_window_block
                                 ? st.num_sink_blocks + (ahead_block - st.first_window_block)
                                 : UINT32_MAX;
      if (i + kEntryAhead < full && ahead < st.table.size()) pool.PrefetchDeviceEntry(st.table[ahead]);
      // A windowed (chunked) pool stores only blocks within its first window (chunk): past
      // it the cache is cyclic and its blocks would pin their dropped ancestors.
      if (limit != 0 && (i + 1) * B > limit) {
        st.storing = false;
        break;
      }
      // Sink blocks keep their table entries; the window's follow them.
      KVF_CHECK(i < st.num_sink_blocks || i >= st.first_window_block) << "a block left the window before it was stored";
      const uint32_t j = i < st.num_sink_blocks ? i : st.num_sink_blocks + (i - st.first_window_block);
      const BlockHash h = HashAt(s, i);
      const std::span<const TokenId> block_tokens = tokens.subspan(size_t{i} * B, B);
      const BlockRetention r = RetentionForBlock(s.retention, s.prompt_len, i * B, (i + 1) * B);
      const NodeId existing = pool.FindHash(h);
      if (existing != kNoNode) {
        if (!pool.SameBlock(existing, st.last_node, block_tokens) || pool.tier(existing) != Tier::kDevice) {
          st.storing = false;  // a hash collision, or a copy on the host: keep this block private
          break;
        }
        // Another sequence stored the same block first: share it and free our copy.
        pool.Pin(existing, now);
        pool.Unpin(Tier::kDevice, st.table[j], now);
        st.table[j] = pool.block(existing);
        st.linear[i] = st.table[j];
        pool.Raise(existing, r, now);
        st.last_node = existing;
      } else {
        const NodeId stored =
            pool.Store(st.last_node, h, block_tokens, st.table[j], r, now, i % group_blocks_ == group_blocks_ - 1,
                       s.lora_id, s.seed);
        if (stored == kNoNode) {
          st.storing = false;  // a token outside the vocabulary: keep this block private
          break;
        }
        st.last_node = stored;
      }
      ++st.num_stored;
    }
  }
}

bool KvCacheManager::CanAppend(SequenceId id, uint32_t n) const {
  const Sequence& s = Seq(id);
  if (!s.allocated) return false;
  const uint32_t B = config_.block_size;
  const uint32_t more = CeilDiv(s.tokens.size() + n, B) - CeilDiv(s.tokens.size(), B);
  for (const auto& pool : pools_) {
    if (more > pool->num_free_or_evictable(Tier::kDevice)) return false;
  }
  return true;
}

Status KvCacheManager::Append(SequenceId id, std::span<const TokenId> tokens) {
  Sequence& s = Seq(id);
  if (!s.allocated) return FailedPrecondition("kv: Append() before Allocate()");
  if (!CanAppend(id, static_cast<uint32_t>(tokens.size()))) {
    return ResourceExhausted("kv: no block for " + std::to_string(tokens.size()) + " more tokens");
  }
  Tick();
  const uint32_t B = config_.block_size;
  for (const TokenId t : tokens) {
    if (s.tokens.size() % B == 0) {
      for (auto& pool : pools_) {
        KVF_CHECK(pool->EnsureDeviceFree(1, &copies_)) << "CanAppend() promised a block";
        Sequence::PoolState& st = s.pools[pool->index()];
        if (!st.table.empty() && st.table.back() != kNoBlock) {
          st.table.push_back(pool->AllocateDeviceAfter(st.table.back()));  // keep the run going
        } else {
          pool->AllocateDevice(1, &st.table);
        }
        st.linear.push_back(st.table.back());
      }
    }
    s.tokens.push_back(t);
  }
  if (reuse_enabled_) ExtendHashes(s);
  FinishCall();
  return Status::Ok();
}

void KvCacheManager::FreeBlocks(Sequence& s) {
  if (!s.allocated) return;
  const TimeNs now = clock_->Now();
  for (uint32_t p = 0; p < pools_.size(); ++p) {
    Sequence::PoolState& st = s.pools[p];
    // Deepest first, so a chain's leaf is queued before its ancestors become leaves.
    for (auto it = st.table.rbegin(); it != st.table.rend(); ++it) pools_[p]->Unpin(Tier::kDevice, *it, now);
    for (auto it = st.held.rbegin(); it != st.held.rend(); ++it) pools_[p]->Unpin(Tier::kDevice, *it, now);
    st = {};
  }
  s.allocated = false;
  s.num_computed = 0;
}

void KvCacheManager::Release(SequenceId id) {
  Sequence& s = Seq(id);
  Tick();
  FreeBlocks(s);
  s.live = false;
  ++s.generation;
  s.tokens = {};
  s.raw_hashes = {};
  s.pools = {};
  free_slots_.push_back(static_cast<uint32_t>(id));
  FinishCall();
}

void KvCacheManager::Preempt(SequenceId id) {
  Sequence& s = Seq(id);
  Tick();
  FreeBlocks(s);
  FinishCall();
}

// ---------------------------------------------------------------- cache-wide

std::vector<EvictedBlock> KvCacheManager::Evict(uint32_t pool, uint32_t n) {
  KVF_CHECK_LT(pool, pools_.size());
  Tick();
  std::vector<EvictedBlock> out;
  pools_[pool]->EvictDevice(n, &copies_, &out);
  FinishCall();
  return out;
}

void KvCacheManager::Clear() {
  for (const auto& s : seqs_) KVF_CHECK(!s->live || !s->allocated) << "Clear() while a sequence holds blocks";
  for (auto& pool : pools_) pool->Clear();
  FinishCall();
}

void KvCacheManager::Tick() {
  const TimeNs now = clock_->Now();
  for (auto& pool : pools_) pool->ProcessExpired(now);
}

void KvCacheManager::FinishCall() {
  if (!copies_.empty()) {
    copier_->Copy(copies_);
    copies_.clear();
  }
  for (auto& pool : pools_) pool->CloseEvents();
}

std::vector<KvEvent> KvCacheManager::TakeEvents() {
  for (auto& pool : pools_) pool->CloseEvents();
  return events_->Take();
}

uint64_t KvCacheManager::events_dropped() const { return events_->dropped(); }

std::vector<KvEvent> KvCacheManager::Snapshot() const {
  std::vector<KvEvent> out;
  for (size_t p = 0; p < pools_.size(); ++p) {
    if (publishes_[p]) pools_[p]->Snapshot(&out);
  }
  return out;
}

KvStats KvCacheManager::Stats() const {
  KvStats st;
  st.pools.resize(pools_.size());
  for (size_t p = 0; p < pools_.size(); ++p) pools_[p]->FillStats(&st.pools[p]);
  st.reused_tokens = reused_tokens_;
  st.missed_tokens = missed_tokens_;
  st.events_dropped = events_->dropped();
  return st;
}

uint64_t KvCacheManager::FreeBlocks(Tier tier) const {
  uint64_t n = 0;
  for (const auto& pool : pools_) n += pool->num_free_or_evictable(tier);
  return n;
}

uint64_t KvCacheManager::TotalBlocks(Tier tier) const {
  uint64_t n = 0;
  for (const auto& pool : pools_) n += pool->num_blocks(tier);
  return n;
}

size_t KvCacheManager::MemoryBytes() const {
  size_t n = 0;
  for (const auto& pool : pools_) n += pool->MemoryBytes();
  return n;
}

}  // namespace kvfleet::kv
