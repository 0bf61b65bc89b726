#include "cli/simulate/sim_kv_cache.h"

#include <algorithm>

#include "common/check.h"

namespace kvfleet::sim {

namespace {

// A block's stand-in for the local hash of its tokens: distinct per (seed, index).
uint64_t LocalHash(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (index + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Shared prefixes are retained, as a system prompt is (Contract 3's retention).
constexpr uint8_t kPrefixPriority = 100;

kv::KvEvent StoredChain(BlockHash parent, std::span<const BlockHash> hashes, uint8_t priority) {
  kv::StoredEvent stored;
  stored.parent_hash = parent;
  stored.blocks.reserve(hashes.size());
  for (BlockHash h : hashes) stored.blocks.push_back(kv::StoredBlock{h, {}, kv::Tier::kDevice, priority, 0});
  return kv::KvEvent{0, std::move(stored), 0};
}

}  // namespace

SimKvCache::SimKvCache(const SimKvCacheOptions& options, uint64_t seed)
    : options_(options), rng_(seed), hash_seed_(HashSeed({options.model, "", ""})) {
  KVF_CHECK(options.min_turn_blocks >= 1 && options.min_turn_blocks <= options.max_turn_blocks);
  KVF_CHECK(options.shared_prefixes >= 1 && options.prefix_blocks >= 1);
  KVF_CHECK(options.capacity_blocks >
            uint64_t{options.shared_prefixes} * options.prefix_blocks + options.max_conversation_blocks +
                options.max_turn_blocks)
      << "a simulated cache of " << options.capacity_blocks
      << " blocks cannot hold its shared prefixes and a whole conversation";
  for (uint32_t p = 0; p < options.shared_prefixes; ++p) {
    std::vector<BlockHash> chain;
    BlockHash parent = hash_seed_;  // Contract 1: seq_0 chains from the namespace seed
    for (uint32_t b = 0; b < options.prefix_blocks; ++b) {
      parent = ChainBlockHash(parent, LocalHash(hash_seed_ ^ (0x5157ull << 32 | p), b));
      chain.push_back(parent);
    }
    prefix_hashes_.push_back(std::move(chain));
  }
  prefix_held_.assign(options.shared_prefixes, false);
}

std::vector<BlockHash> SimKvCache::Hashes(const Conversation& c, uint32_t n) const {
  std::vector<BlockHash> out;
  out.reserve(n);
  BlockHash parent = PrefixTail(c.prefix);
  for (uint32_t b = 0; b < n; ++b) {
    parent = ChainBlockHash(parent, LocalHash(c.seed, b));
    out.push_back(parent);
  }
  return out;
}

uint32_t SimKvCache::TurnBlocks() {
  std::uniform_int_distribution<uint32_t> d(options_.min_turn_blocks, options_.max_turn_blocks);
  return d(rng_);
}

size_t SimKvCache::EnsurePrefix(uint32_t p, std::vector<kv::KvEvent>* out) {
  if (prefix_held_[p]) return 0;
  prefix_held_[p] = true;
  held_ += options_.prefix_blocks;
  if (out != nullptr) out->push_back(StoredChain(0, prefix_hashes_[p], kPrefixPriority));
  return options_.prefix_blocks;
}

size_t SimKvCache::MakeRoom(uint64_t need, std::vector<kv::KvEvent>* out) {
  size_t removed = 0;
  while (held_ + need > options_.capacity_blocks && !lru_.empty()) {
    Conversation& c = lru_.front();
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(c.blocks, held_ + need - options_.capacity_blocks));
    std::vector<BlockHash> chain = Hashes(c, c.blocks);
    if (out != nullptr) {
      kv::RemovedEvent ev;
      ev.tier = kv::Tier::kDevice;
      ev.hashes.assign(chain.rbegin(), chain.rbegin() + n);  // children before parents
      out->push_back(kv::KvEvent{0, std::move(ev), 0});
    }
    c.blocks -= n;
    held_ -= n;
    removed += n;
    if (c.blocks == 0) {
      lru_.pop_front();
    } else {
      c.last = chain[c.blocks - 1];
    }
  }
  return removed;
}

size_t SimKvCache::Extend(Conversation* c, uint32_t n, std::vector<kv::KvEvent>* out) {
  std::vector<BlockHash> added;
  added.reserve(n);
  BlockHash parent = c->blocks == 0 ? PrefixTail(c->prefix) : c->last;
  for (uint32_t b = 0; b < n; ++b) {
    parent = ChainBlockHash(parent, LocalHash(c->seed, c->blocks + b));
    added.push_back(parent);
  }
  if (out != nullptr) out->push_back(StoredChain(c->blocks == 0 ? PrefixTail(c->prefix) : c->last, added,
                                                 kv::kDefaultPriority));
  c->blocks += n;
  c->last = added.back();
  held_ += n;
  return n;
}

void SimKvCache::Fill(double fraction) {
  KVF_CHECK(held_ == 0 && fraction >= 0 && fraction <= 1);
  for (uint32_t p = 0; p < options_.shared_prefixes; ++p) EnsurePrefix(p, nullptr);
  const auto target = static_cast<uint64_t>(fraction * static_cast<double>(options_.capacity_blocks));
  while (held_ + options_.max_turn_blocks <= target) {
    Conversation c{static_cast<uint32_t>(rng_() % options_.shared_prefixes), rng_(), 0, 0};
    Extend(&c, TurnBlocks(), nullptr);
    lru_.push_back(c);
  }
}

size_t SimKvCache::Request(std::vector<kv::KvEvent>* out) {
  const uint32_t n = TurnBlocks();
  std::uniform_real_distribution<double> coin(0, 1);
  Conversation c;
  if (!lru_.empty() && coin(rng_) < options_.continue_probability) {
    // One of the most recent conversations: taken out so eviction cannot touch it.
    const size_t k = std::min<size_t>(lru_.size(), std::max<uint32_t>(1, options_.recent_conversations));
    auto it = lru_.end() - 1 - static_cast<std::ptrdiff_t>(rng_() % k);
    if (it->blocks + n <= options_.max_conversation_blocks) {
      c = *it;
      lru_.erase(it);
    }
  }
  if (c.blocks == 0) c = Conversation{static_cast<uint32_t>(rng_() % options_.shared_prefixes), rng_(), 0, 0};
  size_t events = 0;
  // The conversation itself is out of the LRU list while room is made: its blocks count.
  held_ -= c.blocks;
  events += MakeRoom(n + c.blocks + (prefix_held_[c.prefix] ? 0 : options_.prefix_blocks), out);
  held_ += c.blocks;
  events += EnsurePrefix(c.prefix, out);
  events += Extend(&c, n, out);
  lru_.push_back(c);
  return events;
}

std::vector<kv::KvEvent> SimKvCache::Snapshot() const {
  std::vector<kv::KvEvent> out;
  out.reserve(options_.shared_prefixes + lru_.size());
  for (uint32_t p = 0; p < options_.shared_prefixes; ++p) {
    if (prefix_held_[p]) out.push_back(StoredChain(0, prefix_hashes_[p], kPrefixPriority));
  }
  for (const Conversation& c : lru_) out.push_back(StoredChain(PrefixTail(c.prefix), Hashes(c, c.blocks),
                                                               kv::kDefaultPriority));
  return out;
}

void SimKvCache::CheckInvariants() const {
  uint64_t sum = 0;
  for (uint32_t p = 0; p < options_.shared_prefixes; ++p) sum += prefix_held_[p] ? options_.prefix_blocks : 0;
  for (const Conversation& c : lru_) {
    KVF_CHECK(c.blocks > 0) << "an empty conversation is dropped";
    KVF_CHECK(prefix_held_[c.prefix]) << "a conversation's prefix is held";
    sum += c.blocks;
  }
  KVF_CHECK(sum == held_) << sum << " blocks counted, " << held_ << " held";
  KVF_CHECK(held_ <= options_.capacity_blocks) << held_ << " blocks held over a capacity of " << options_.capacity_blocks;
}

}  // namespace kvfleet::sim
