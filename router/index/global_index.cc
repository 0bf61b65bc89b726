#include "router/index/global_index.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <thread>

#include "common/check.h"
#include "router/index/retention_estimate.h"
#include "router/index/shard_table.h"

namespace kvfleet::router {

// An internal op: a BlockOp or a prediction, with the hash's mix computed once.
struct GlobalIndex::Op {
  BlockHash hash;
  uint64_t mix;
  uint32_t expiry_ms;  // kPredict only
  uint8_t kind;        // BlockOp::Kind or kPredict
  uint8_t tier_bit;
  static constexpr uint8_t kPredict = 3;
};


GlobalIndex::GlobalIndex(const GlobalIndexOptions& options, Clock* clock)
    : options_(options),
      clock_(clock),
      base_ns_(clock->Now()),
      shards_(new Shard[config::kShards]),
      retention_(std::make_unique<RetentionEstimate>(clock)) {}

GlobalIndex::~GlobalIndex() {
  for (Table* t : retired_) delete t;
}

GlobalIndex::Shard& GlobalIndex::ShardAt(int i) const { return shards_[i]; }

uint32_t GlobalIndex::NowMs() const {
  // +1 so that 0 (an unused slot) never is a stamp.
  return static_cast<uint32_t>((clock_->Now() - base_ns_) / kNsPerMs) + 1;
}

void GlobalIndex::Retire(Table* table) {
  std::lock_guard lock(retired_mu_);
  retired_.push_back(table);
  has_retired_.store(true, std::memory_order_relaxed);
}

void GlobalIndex::ReclaimRetired() {
  if (!has_retired_.load(std::memory_order_relaxed)) return;
  std::vector<Table*> doomed;
  {
    std::lock_guard lock(retired_mu_);
    // Every table in retired_ was replaced (seq_cst) before this load; a reader that
    // registers after it sees only the replacements.
    if (readers_.load(std::memory_order_seq_cst) != 0) return;
    doomed.swap(retired_);
    has_retired_.store(false, std::memory_order_relaxed);
  }
  for (Table* t : doomed) delete t;
}

// ---- Queries ---------------------------------------------------------------------------

uint64_t GlobalIndex::BlockCount(WorkerId worker, kv::Tier tier) const {
  if (worker >= config::kMaxWorkers) return 0;
  uint64_t n = 0;
  for (int i = 0; i < config::kShards; ++i)
    n += shards_[i].workers[worker].tier_count[static_cast<int>(tier)].load(std::memory_order_relaxed);
  return n;
}

uint64_t GlobalIndex::EntryCount() const {
  uint64_t n = 0;
  for (int i = 0; i < config::kShards; ++i) n += shards_[i].entries.load(std::memory_order_relaxed);
  return n;
}

uint64_t GlobalIndex::HashCount() const {
  uint64_t n = 0;
  for (int i = 0; i < config::kShards; ++i) {
    std::lock_guard lock(shards_[i].mu);
    n += shards_[i].used;
  }
  return n;
}

uint64_t GlobalIndex::MemoryBytes() const {
  // boost::unordered_flat_* keep one metadata byte per slot (groups of 15 slots + 1 byte).
  constexpr double kMetaPerSlot = 16.0 / 15.0;
  double bytes = 0;
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::lock_guard lock(shard.mu);
    bytes += static_cast<double>(shard.T()->bytes + sizeof(Table));
    bytes += static_cast<double>(shard.overflow.Bytes());
    bytes += static_cast<double>(shard.predicted.bucket_count()) *
             (sizeof(std::pair<BlockHash, PredList>) + kMetaPerSlot);
    for (const auto& [h, list] : shard.predicted) {
      if (list.capacity() > kInlineHolders) bytes += static_cast<double>(list.capacity() * sizeof(PredHolder));
    }
    for (WorkerId w = 0; w < config::kMaxWorkers; ++w)
      bytes += static_cast<double>(shard.workers[w].blocks.capacity() * sizeof(BlockHash));
  }
  return static_cast<uint64_t>(bytes);
}

std::vector<BlockHash> GlobalIndex::BlocksOf(WorkerId worker, kv::Tier tier) const {
  std::vector<BlockHash> out;
  if (worker >= config::kMaxWorkers) return out;
  const uint8_t bit = TierBit(tier);
  for (int i = 0; i < config::kShards; ++i) {
    const Shard& shard = shards_[i];
    std::lock_guard lock(shard.mu);
    for (BlockHash h : shard.workers[worker].blocks) {
      const uint64_t j = shard.Find(h, Mix(h));
      if (j != kNpos && (shard.Bits(shard.T()->slots[j], h, worker) & bit)) out.push_back(h);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// ---- Updates ---------------------------------------------------------------------------

void GlobalIndex::ApplyToShard(Shard& shard, WorkerId worker, const Op* ops, size_t n, size_t ahead, uint32_t now_ms) {
  Table* retired = nullptr;
  auto& pw = shard.workers[worker];
  // The slot of op.hash, inserted if new, opened and stamped as used now. A growth replaces
  // the table; more than one per batch is possible, and each old table is retired.
  auto touch = [&](const Op& op) -> Slot& {
    Table* old = nullptr;
    const uint64_t i = shard.FindOrInsert(op.hash, op.mix, now_ms, &old);
    if (old != nullptr) {
      if (retired != nullptr) Retire(retired);
      retired = old;
    }
    Slot& s = shard.T()->slots[i];
    St(s.lru_ms, now_ms);
    return s;
  };
  // Each op opens the slots it stores to only once its lookups are done, and closes them
  // after its stores (shard_table.h, Open/Close): readers of other slots never wait. The
  // shard's mutex is taken a slice at a time, so another writer (a prediction from an HTTP
  // thread) waits for one slice, not for a 64K-block snapshot chunk.
  for (size_t begin = 0; begin < n; begin += config::kWriteSliceOps) {
    const size_t end = std::min(n, begin + config::kWriteSliceOps);
    int64_t d_entries = 0, d_tier[kv::kNumTiers] = {0, 0};
    std::lock_guard lock(shard.mu);
    for (size_t k = begin; k < end; ++k) {
      // ops[n..n + ahead) are the next shards' ops: the window runs across shards.
      if (k + kPrefetchAhead < n + ahead) Prefetch(ops[k + kPrefetchAhead]);
      const Op& op = ops[k];
      switch (op.kind) {
        case BlockOp::kStore: {
          Slot& s = touch(op);
          const uint8_t bits = shard.Bits(s, op.hash, worker);
          const bool was_predicted = shard.TakePredicted(s, op.hash, worker);  // confirms it
          if (bits == 0 && !was_predicted) {
            shard.NoteGained(worker, op.hash);
            ++d_entries;
          }
          if (!(bits & op.tier_bit)) {
            shard.SetBits(s, op.hash, worker, bits | op.tier_bit);
            ++d_tier[op.tier_bit == kDev ? 0 : 1];
          }
          break;
        }
        case BlockOp::kRemove: {
          const uint64_t i = shard.Find(op.hash, op.mix);
          if (i == kNpos) break;
          Slot& s = shard.T()->slots[i];
          const uint8_t bits = shard.Bits(s, op.hash, worker);
          if (!(bits & op.tier_bit)) break;
          shard.Open(i);
          shard.SetBits(s, op.hash, worker, bits & ~op.tier_bit);
          --d_tier[op.tier_bit == kDev ? 0 : 1];
          if ((bits & ~op.tier_bit) == 0) {
            --pw.live;  // the reverse list keeps the hash until it is compacted
            --d_entries;
            if (Shard::Empty(s)) shard.Erase(i);
          }
          break;
        }
        case BlockOp::kMove: {
          const uint64_t i = shard.Find(op.hash, op.mix);
          if (i == kNpos) break;
          Slot& s = shard.T()->slots[i];
          const uint8_t bits = shard.Bits(s, op.hash, worker);
          if (bits == 0) break;
          if (bits & kDev) --d_tier[0];
          if (bits & kHostBit) --d_tier[1];
          shard.Open(i);
          shard.SetBits(s, op.hash, worker, op.tier_bit);
          ++d_tier[op.tier_bit == kDev ? 0 : 1];
          break;
        }
        case Op::kPredict: {
          Slot& s = touch(op);
          if (shard.Bits(s, op.hash, worker) != 0) break;  // already held for real
          std::lock_guard side(shard.side_mu);
          auto& list = shard.predicted[op.hash];
          auto it = std::find_if(list.begin(), list.end(), [&](const PredHolder& p) { return p.worker == worker; });
          if (it != list.end()) {
            it->expiry_ms = op.expiry_ms;
            break;
          }
          list.push_back(PredHolder{worker, op.expiry_ms});
          St(s.predicted, static_cast<uint16_t>(Ld(s.predicted) + 1));
          shard.NoteGained(worker, op.hash);
          ++d_entries;
          break;
        }
      }
      shard.Close();
    }
    Bump(shard.entries, d_entries);
    Bump(pw.tier_count[0], d_tier[0]);
    Bump(pw.tier_count[1], d_tier[1]);
    if (end == n) shard.MaybeCompact(worker);
  }
  if (retired != nullptr) Retire(retired);
  if (options_.max_entries) TrimIfNeeded(shard);
}

void GlobalIndex::Prefetch(const Op& op) const {
  // Another shard's table may be replaced meanwhile; a prefetch into a retired one is
  // harmless. REQUIRES: a ReaderGuard is live, so no retired table is freed.
  const Table* t = shards_[ShardOfMix(op.mix)].table.load(std::memory_order_relaxed);
  __builtin_prefetch(&t->slots[op.mix & t->mask]);
}

void GlobalIndex::ApplyOps(WorkerId worker, Op* ops, size_t n) {
  KVF_CHECK(worker < config::kMaxWorkers);
  if (n == 0) return;
  const uint32_t now_ms = NowMs();
  if (n == 1) {
    ApplyToShard(shards_[ShardOfMix(ops[0].mix)], worker, ops, 1, 0, now_ms);
  } else {
    // Counting sort by shard, stable, so each block's ops keep their order.
    thread_local std::vector<Op> sorted;
    uint32_t start[config::kShards + 1] = {};
    for (size_t k = 0; k < n; ++k) ++start[ShardOfMix(ops[k].mix) + 1];
    for (int i = 0; i < config::kShards; ++i) start[i + 1] += start[i];
    sorted.resize(n);
    uint32_t fill[config::kShards];
    std::memcpy(fill, start, sizeof(fill));
    for (size_t k = 0; k < n; ++k) sorted[fill[ShardOfMix(ops[k].mix)]++] = ops[k];
    // Prefetch reads other shards' tables: registered as a reader, none is freed meanwhile.
    ReaderGuard guard(readers_);
    for (size_t k = 0; k < std::min<size_t>(n, kPrefetchAhead); ++k) Prefetch(sorted[k]);
    for (int i = 0; i < config::kShards; ++i)
      if (start[i + 1] > start[i])
        ApplyToShard(shards_[i], worker, &sorted[start[i]], start[i + 1] - start[i], n - start[i + 1], now_ms);
  }
  ReclaimRetired();
}

void GlobalIndex::Apply(WorkerId worker, std::span<const BlockOp> ops) {
  thread_local std::vector<Op> buf;
  buf.clear();
  for (const BlockOp& op : ops) {
    if (op.kind == BlockOp::kPriority) continue;  // the retention estimate's alone
    buf.push_back(Op{op.hash, Mix(op.hash), 0, static_cast<uint8_t>(op.kind), TierBit(op.tier)});
  }
  ApplyOps(worker, buf.data(), buf.size());
  retention_->Apply(worker, ops);
}

void GlobalIndex::Store(WorkerId worker, BlockHash hash, kv::Tier tier) {
  Op op{hash, Mix(hash), 0, BlockOp::kStore, TierBit(tier)};
  ApplyOps(worker, &op, 1);
}

void GlobalIndex::StoreBlocks(WorkerId worker, std::span<const kv::StoredBlock> blocks) {
  thread_local std::vector<Op> buf;
  buf.resize(blocks.size());
  for (size_t k = 0; k < blocks.size(); ++k)
    buf[k] = Op{blocks[k].hash, Mix(blocks[k].hash), 0, BlockOp::kStore, TierBit(blocks[k].tier)};
  ApplyOps(worker, buf.data(), buf.size());
}

void GlobalIndex::Remove(WorkerId worker, BlockHash hash, kv::Tier tier) {
  if (worker >= config::kMaxWorkers) return;
  Op op{hash, Mix(hash), 0, BlockOp::kRemove, TierBit(tier)};
  ApplyOps(worker, &op, 1);
}

bool GlobalIndex::Move(WorkerId worker, BlockHash hash, kv::Tier tier) {
  if (worker >= config::kMaxWorkers) return false;
  const uint64_t mix = Mix(hash);
  Shard& shard = shards_[ShardOfMix(mix)];
  std::lock_guard lock(shard.mu);
  const uint64_t i = shard.Find(hash, mix);
  if (i == kNpos) return false;
  Slot& s = shard.T()->slots[i];
  const uint8_t bits = shard.Bits(s, hash, worker);
  if (bits == 0) return false;
  auto& counts = shard.workers[worker].tier_count;
  if (bits & kDev) Bump(counts[0], -1);
  if (bits & kHostBit) Bump(counts[1], -1);
  shard.Open(i);
  shard.SetBits(s, hash, worker, TierBit(tier));
  shard.Close();
  Bump(counts[static_cast<int>(tier)], 1);
  return true;
}

void GlobalIndex::InsertPredicted(WorkerId worker, std::span<const BlockHash> hashes, DurationNs ttl) {
  KVF_CHECK(worker < config::kMaxWorkers);
  const uint32_t expiry = NowMs() + static_cast<uint32_t>(std::max<DurationNs>(ttl, 0) / kNsPerMs);
  thread_local std::vector<Op> buf;
  buf.resize(hashes.size());
  for (size_t k = 0; k < hashes.size(); ++k) buf[k] = Op{hashes[k], Mix(hashes[k]), expiry, Op::kPredict, 0};
  ApplyOps(worker, buf.data(), buf.size());
}

void GlobalIndex::RemoveWorker(WorkerId worker) { ClearWorker(worker, /*keep_predicted=*/false); }

void GlobalIndex::ForgetStored(WorkerId worker) { ClearWorker(worker, /*keep_predicted=*/true); }

void GlobalIndex::ClearWorker(WorkerId worker, bool keep_predicted) {
  if (worker >= config::kMaxWorkers) return;
  retention_->RemoveWorker(worker);
  std::vector<BlockHash> kept;  // the predicted pairs left: the new reverse list
  for (int si = 0; si < config::kShards; ++si) {
    Shard& shard = shards_[si];
    std::lock_guard lock(shard.mu);
    auto& pw = shard.workers[worker];
    if (pw.blocks.empty()) continue;
    kept.clear();
    int64_t dropped = 0;
    // One op per block (Open .. Close), as in ApplyToShard.
    for (BlockHash h : pw.blocks) {
      const uint64_t i = shard.Find(h, Mix(h));
      if (i == kNpos) continue;  // stale: removed or trimmed since
      Slot& s = shard.T()->slots[i];
      const bool held = shard.Bits(s, h, worker) != 0;
      const bool predicted = shard.IsPredicted(s, h, worker);
      if (keep_predicted && predicted) kept.push_back(h);
      const bool take_predicted = !keep_predicted && predicted;
      if (!held && !take_predicted) continue;  // nothing to drop: readers see no write
      shard.Open(i);
      if (held) {
        shard.SetBits(s, h, worker, 0);
        ++dropped;
      }
      if (take_predicted && shard.TakePredicted(s, h, worker)) ++dropped;
      if (Shard::Empty(s)) shard.Erase(i);
      shard.Close();
    }
    Bump(shard.entries, -dropped);
    // A pair lost and regained is listed twice (shard_table.h): keep each once.
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    std::vector<BlockHash>(kept.begin(), kept.end()).swap(pw.blocks);
    pw.live = kept.size();
    pw.tier_count[0].store(0, std::memory_order_relaxed);
    pw.tier_count[1].store(0, std::memory_order_relaxed);
  }
}

uint64_t GlobalIndex::SweepExpired() {
  const uint32_t now_ms = NowMs();
  uint64_t dropped = 0;
  for (int si = 0; si < config::kShards; ++si) dropped += shards_[si].SweepExpired(now_ms);
  return dropped;
}

void GlobalIndex::TrimIfNeeded(Shard& shard) {
  shard.TrimTo(std::max<uint64_t>(1, options_.max_entries / config::kShards));
}

void GlobalIndex::CheckInvariants() const {
  for (int si = 0; si < config::kShards; ++si) shards_[si].CheckInvariants(si);
}

}  // namespace kvfleet::router
