// HashIndex: the reuse tree's lookup table, block hash -> node, by open addressing.
//
// A slot is 8 bytes: 32 bits of the mixed hash (the tag, which also fixes the slot's home)
// and the node id. The full 64-bit hash lives in the node, so a lookup confirms a tag match
// against it (the node is read next anyway, to compare the block's tokens). The table has
// ceil(capacity / kMaxLoad) slots, not a power of two: a home slot is tag x slots / 2^32.
// Linear probing, backward-shift deletion (no tombstones).
//
// Invariants:
//   1. Every entry sits in the probe run that starts at its home slot, with no empty slot
//      between its home and itself.
//   2. size() <= capacity given at construction.
//
// Thread safety: thread-compatible; owned by its BlockPool.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/block_hash.h"
#include "worker/kv/huge_page_allocator.h"

namespace kvfleet::kv {

using NodeId = uint32_t;
constexpr NodeId kNoNode = UINT32_MAX;  // also "the root" as a parent

class HashIndex {
 public:
  // 0.8 keeps successful probes near 3 slots (half a cache line) at 10 bytes per entry.
  static constexpr double kMaxLoad = 0.8;

  explicit HashIndex(uint32_t capacity)
      : slots_(std::max<uint64_t>(2, static_cast<uint64_t>(capacity / kMaxLoad) + 1), Slot{0, kNoNode}) {}

  static uint32_t Tag(BlockHash h) { return static_cast<uint32_t>((h * 0x9E3779B97F4A7C15ull) >> 32); }
  uint64_t Home(uint32_t tag) const { return (uint64_t{tag} * slots_.size()) >> 32; }
  void Prefetch(BlockHash h) const { __builtin_prefetch(&slots_[Home(Tag(h))]); }

  // The node with hash h, or kNoNode. hash_of(node) gives a node's full hash.
  template <typename HashOf>
  NodeId Find(BlockHash h, HashOf&& hash_of) const {
    const uint32_t tag = Tag(h);
    for (uint64_t i = Home(tag);; i = Next(i)) {
      const Slot& s = slots_[i];
      if (s.node == kNoNode) return kNoNode;
      if (s.tag == tag && hash_of(s.node) == h) return s.node;
    }
  }
  // The first node whose tag matches h (unconfirmed): for prefetching ahead.
  NodeId Candidate(BlockHash h) const {
    const uint32_t tag = Tag(h);
    for (uint64_t i = Home(tag);; i = Next(i)) {
      const Slot& s = slots_[i];
      if (s.node == kNoNode || s.tag == tag) return s.node;
    }
  }
  // REQUIRES: no node with hash h is indexed.
  void Insert(BlockHash h, NodeId n) {
    const uint32_t tag = Tag(h);
    uint64_t i = Home(tag);
    while (slots_[i].node != kNoNode) i = Next(i);
    slots_[i] = Slot{tag, n};
    ++size_;
  }
  // REQUIRES: node n is indexed under hash h.
  void Repoint(BlockHash h, NodeId from, NodeId to) { slots_[Locate(h, from)].node = to; }
  void Erase(BlockHash h, NodeId n) {
    uint64_t hole = Locate(h, n);
    // Backward shift: move later entries of the probe run into the hole when their home
    // is not within (hole, j] cyclically.
    for (uint64_t j = Next(hole); slots_[j].node != kNoNode; j = Next(j)) {
      const uint64_t home = Home(slots_[j].tag);
      const bool in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
      if (!in_range) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{0, kNoNode};
    --size_;
  }
  void Clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{0, kNoNode});
    size_ = 0;
  }

  uint32_t size() const { return size_; }
  size_t MemoryBytes() const { return slots_.capacity() * sizeof(Slot); }
  // Invariant 1 for every entry; `hash_of` as in Find.
  template <typename HashOf>
  bool Check(HashOf&& hash_of) const {
    uint32_t n = 0;
    for (uint64_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].node == kNoNode) continue;
      ++n;
      if (Tag(hash_of(slots_[i].node)) != slots_[i].tag) return false;
      for (uint64_t k = Home(slots_[i].tag); k != i; k = Next(k)) {
        if (slots_[k].node == kNoNode) return false;
      }
    }
    return n == size_;
  }

 private:
  struct Slot {
    uint32_t tag;
    NodeId node;
  };
  uint64_t Next(uint64_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }
  uint64_t Locate(BlockHash h, NodeId n) const {
    uint64_t i = Home(Tag(h));
    while (slots_[i].node != n) i = Next(i);
    return i;
  }

  HugeVector<Slot> slots_;
  uint32_t size_ = 0;
};

}  // namespace kvfleet::kv
