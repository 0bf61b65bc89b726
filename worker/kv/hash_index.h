// HashIndex: the reuse tree's lookup table, block hash -> node.
//
// Bucketized linear probing: the table is an array of 64-byte buckets (one cache line) of
// 8 slots. A slot is 8 bytes: 32 bits of the mixed hash (the tag, which also fixes the
// entry's home bucket: tag x buckets / 2^32) and the node id. The full 64-bit hash lives in
// the node, so a lookup confirms a tag match against it (the node is read next anyway, to
// compare the block's tokens). An entry lives in its home bucket, or when that is full in
// the next bucket with room. So a lookup, hit or miss, almost always reads one cache line,
// at ~10 bytes per entry (kMaxLoad = 0.8); plain linear probing at that load walks ~13
// slots per insert.
//
// Invariants:
//   1. A bucket's entries fill its first slots (empty slots come last).
//   2. An entry outside its home bucket has every bucket from its home up to its own full.
//   3. size() <= the capacity given at construction.
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

// Starts loading p's cache line. GCC 12 at -O2 silently drops __builtin_prefetch of this
// index's bucket address (seen with objdump), so x86 issues the instruction itself.
inline void PrefetchAddress(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

class HashIndex {
 public:
  // Entries per slot. 0.8 keeps overflow into a second bucket rare, at 10 bytes per entry.
  static constexpr double kMaxLoad = 0.8;
  static constexpr uint32_t kSlotsPerBucket = 8;

  explicit HashIndex(uint32_t capacity)
      : buckets_(std::max<uint64_t>(1, static_cast<uint64_t>(capacity / (kMaxLoad * kSlotsPerBucket)) + 1)) {}

  static uint32_t Tag(BlockHash h) { return static_cast<uint32_t>((h * 0x9E3779B97F4A7C15ull) >> 32); }
  void Prefetch(BlockHash h) const { PrefetchAddress(&buckets_[Home(Tag(h))]); }

  // The node with hash h, or kNoNode. hash_of(node) gives a node's full hash.
  template <typename HashOf>
  NodeId Find(BlockHash h, HashOf&& hash_of) const {
    const uint32_t tag = Tag(h);
    for (uint64_t b = Home(tag);; b = Next(b)) {
      const Bucket& k = buckets_[b];
      for (const Slot& s : k.slots) {
        if (s.node == kNoNode) return kNoNode;  // a bucket with room: nothing overflowed past it
        if (s.tag == tag && hash_of(s.node) == h) return s.node;
      }
    }
  }
  // The first node whose tag matches h (unconfirmed), or kNoNode when none can: for
  // prefetching ahead.
  NodeId Candidate(BlockHash h) const {
    const uint32_t tag = Tag(h);
    for (uint64_t b = Home(tag);; b = Next(b)) {
      for (const Slot& s : buckets_[b].slots) {
        if (s.node == kNoNode || s.tag == tag) return s.node;
      }
    }
  }
  // REQUIRES: no node with hash h is indexed; size() < capacity.
  void Insert(BlockHash h, NodeId n) {
    const uint32_t tag = Tag(h);
    for (uint64_t b = Home(tag);; b = Next(b)) {
      for (Slot& s : buckets_[b].slots) {
        if (s.node == kNoNode) {
          s = Slot{tag, n};
          ++size_;
          return;
        }
      }
    }
  }
  // REQUIRES: node n is indexed under hash h.
  void Repoint(BlockHash h, NodeId from, NodeId to) { Locate(h, from, nullptr)->node = to; }
  void Erase(BlockHash h, NodeId n) {
    uint64_t hole;
    Slot* s = Locate(h, n, &hole);
    bool was_full = buckets_[hole].slots[kSlotsPerBucket - 1].node != kNoNode;
    RemoveSlot(hole, s);
    // Invariant 2: an entry further on whose home is at or before the hole may have
    // overflowed past it; pull one back, which moves the hole, until a bucket that had room.
    for (uint64_t b = Next(hole); was_full && b != hole; b = Next(b)) {
      Bucket& k = buckets_[b];
      was_full = k.slots[kSlotsPerBucket - 1].node != kNoNode;
      Slot* move = nullptr;
      for (Slot& t : k.slots) {
        if (t.node == kNoNode) break;
        if (!Within(Home(t.tag), hole, b)) {
          move = &t;
          break;
        }
      }
      if (move == nullptr) continue;
      buckets_[hole].slots[kSlotsPerBucket - 1] = *move;  // the hole bucket's one free slot
      RemoveSlot(b, move);
      hole = b;
    }
    --size_;
  }
  void Clear() {
    std::fill(buckets_.begin(), buckets_.end(), Bucket{});
    size_ = 0;
  }

  uint32_t size() const { return size_; }
  size_t MemoryBytes() const { return buckets_.capacity() * sizeof(Bucket); }
  // Invariants 1 and 2 for every entry; `hash_of` as in Find.
  template <typename HashOf>
  bool Check(HashOf&& hash_of) const {
    uint32_t n = 0;
    for (uint64_t b = 0; b < buckets_.size(); ++b) {
      bool empty_seen = false;
      for (const Slot& s : buckets_[b].slots) {
        if (s.node == kNoNode) {
          empty_seen = true;
          continue;
        }
        if (empty_seen) return false;  // invariant 1
        ++n;
        if (Tag(hash_of(s.node)) != s.tag) return false;
        for (uint64_t k = Home(s.tag); k != b; k = Next(k)) {
          if (buckets_[k].slots[kSlotsPerBucket - 1].node == kNoNode) return false;  // invariant 2
        }
      }
    }
    return n == size_;
  }

 private:
  struct Slot {
    uint32_t tag = 0;
    NodeId node = kNoNode;
  };
  struct alignas(64) Bucket {
    Slot slots[kSlotsPerBucket];
  };
  static_assert(sizeof(Bucket) == 64);

  uint64_t Home(uint32_t tag) const { return (uint64_t{tag} * buckets_.size()) >> 32; }
  uint64_t Next(uint64_t b) const { return b + 1 == buckets_.size() ? 0 : b + 1; }
  // Whether bucket x lies in the cyclic range (from, to].
  static bool Within(uint64_t x, uint64_t from, uint64_t to) {
    return from <= to ? (x > from && x <= to) : (x > from || x <= to);
  }
  // The slot of node n (indexed under h), and its bucket in *bucket when not null.
  Slot* Locate(BlockHash h, NodeId n, uint64_t* bucket) {
    for (uint64_t b = Home(Tag(h));; b = Next(b)) {
      for (Slot& s : buckets_[b].slots) {
        if (s.node != n) continue;
        if (bucket != nullptr) *bucket = b;
        return &s;
      }
    }
  }
  // Empties slot s of bucket b, keeping invariant 1 (the bucket's last entry fills it).
  void RemoveSlot(uint64_t b, Slot* s) {
    Slot* last = &buckets_[b].slots[kSlotsPerBucket - 1];
    while (last->node == kNoNode) --last;
    *s = *last;
    *last = Slot{};
  }

  HugeVector<Bucket> buckets_;
  uint32_t size_ = 0;
};

}  // namespace kvfleet::kv
