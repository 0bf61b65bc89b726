// OverflowRows: one shard's overflow rows (global_index.h's layout), the masks of workers 64
// and up, in an arena that lock-free readers read without a lock. Internal to router/index.
//
// A block held by workers past 63 has one row: the {device, host} masks of each 64-worker
// group (worker / 64, >= 1) that holds it, in group order, two words a group. The slot's
// overflow field is the row's set of groups and the table's row_refs entry beside the slot
// (shard_table.h) its ref: the index of the row's first word here. One lookup finds every
// group: a prefix every worker of a 1,000-worker fleet holds has one row, not 15.
//
// Concurrency: a writer (the shard's mutex held) changes a row only within an op's write
// section on its slot's group (shard_table.h, Open): masks change in place, and a change of
// the set of groups writes a new row, publishes its ref, and frees the old one for reuse. A
// reader reads the ref and the row between its two reads of the slot group's version
// (ReadSlot): a row it read while it was freed or reused was written after the version turned
// odd, so the second read sees the change and the reader retries. Chunks are never freed
// before the shard, so a stale ref at worst reads another row's words, within bounds (Words).
//
// Memory: 16 bytes a group, in chunks that double from 32 KiB; a freed row's words go to a
// free list by size, so churn reuses them.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/check.h"

namespace kvfleet::router {

class OverflowRows {
 public:
  static constexpr int kFirstChunkBits = 12;  // chunk c holds 2^(12 + c) words
  static constexpr int kChunks = 21;          // refs are 32 bits
  static constexpr int kMaxGroups = 16;

  OverflowRows() = default;
  ~OverflowRows() {
    for (auto& c : chunks_) delete[] c.load(std::memory_order_relaxed);
  }
  OverflowRows(const OverflowRows&) = delete;
  OverflowRows& operator=(const OverflowRows&) = delete;

  // The n words at `ref`, or null when they are not all in one allocated chunk (a ref read
  // while a writer changed it; the reader's version check then fails anyway).
  const std::atomic<uint64_t>* Words(uint32_t ref, uint32_t n) const {
    const uint64_t x = uint64_t{ref} + (uint64_t{1} << kFirstChunkBits);
    const int c = std::bit_width(x) - 1 - kFirstChunkBits;
    const uint64_t size = uint64_t{1} << (kFirstChunkBits + c);
    const uint64_t off = x - size;
    const std::atomic<uint64_t>* chunk = chunks_[c].load(std::memory_order_acquire);
    if (chunk == nullptr || off + n > size) return nullptr;
    return chunk + off;
  }
  std::atomic<uint64_t>* MutableWords(uint32_t ref, uint32_t n) {
    return const_cast<std::atomic<uint64_t>*>(Words(ref, n));
  }

  // ---- Writer side (the shard's mutex held) ----------------------------------------------
  // A row of `groups` groups (2 words each), its words unspecified. Never ref 0 (no row).
  uint32_t Allocate(int groups) {
    live_words_ += 2 * static_cast<uint64_t>(groups);
    auto& free = free_[groups - 1];
    if (!free.empty()) {
      const uint32_t ref = free.back();
      free.pop_back();
      return ref;
    }
    const uint64_t n = 2 * static_cast<uint64_t>(groups);
    for (;;) {
      const uint64_t x = next_ + (uint64_t{1} << kFirstChunkBits);
      const int c = std::bit_width(x) - 1 - kFirstChunkBits;
      KVF_CHECK(next_ + n <= UINT32_MAX) << "overflow rows past 2^32 words in one shard";
      const uint64_t size = uint64_t{1} << (kFirstChunkBits + c);
      if (x - size + n > size) {  // a row never spans two chunks
        next_ = 2 * size - (uint64_t{1} << kFirstChunkBits);
        continue;
      }
      if (chunks_[c].load(std::memory_order_relaxed) == nullptr) {
        chunks_[c].store(new std::atomic<uint64_t>[size](), std::memory_order_release);
        bytes_ += size * sizeof(uint64_t);
      }
      const uint32_t ref = static_cast<uint32_t>(next_);
      next_ += n;
      return ref;
    }
  }
  void Free(uint32_t ref, int groups) {
    live_words_ -= 2 * static_cast<uint64_t>(groups);
    free_[groups - 1].push_back(ref);
  }
  uint64_t Bytes() const {
    uint64_t free_bytes = 0;
    for (const auto& f : free_) free_bytes += f.capacity() * sizeof(uint32_t);
    return bytes_ + free_bytes;
  }
  uint64_t LiveWords() const { return live_words_; }

 private:
  std::atomic<std::atomic<uint64_t>*> chunks_[kChunks] = {};
  uint64_t next_ = 1;  // ref 0 is "no row"
  uint64_t live_words_ = 0, bytes_ = 0;
  std::vector<uint32_t> free_[kMaxGroups];  // freed rows by their number of groups
};

}  // namespace kvfleet::router
