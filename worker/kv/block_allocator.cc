#include "worker/kv/block_allocator.h"

#include <bit>
#include <string>

#include "common/check.h"

namespace kvfleet::kv {

BlockAllocator::BlockAllocator(uint32_t num_blocks) : num_blocks_(num_blocks), run_begin_(0), run_end_(num_blocks) {
  uint64_t bits = num_blocks;
  do {
    const uint64_t words = (bits + 63) / 64;
    levels_.emplace_back(words, 0);
    bits = words;
  } while (bits > 1);
}

void BlockAllocator::SetScattered(BlockId b) {
  uint64_t i = b;
  for (auto& level : levels_) {
    const uint64_t before = level[i / 64];
    level[i / 64] = before | (uint64_t{1} << (i % 64));
    if (before != 0) break;  // the levels above already know this word is non-zero
    i /= 64;
  }
  ++num_scattered_;
}

BlockId BlockAllocator::TakeScattered() {
  // Descend from the single top word to the lowest set bit.
  uint64_t i = 0;
  for (size_t k = levels_.size(); k-- > 0;) i = i * 64 + std::countr_zero(levels_[k][i]);
  const BlockId b = static_cast<BlockId>(i);
  ClearScattered(b);
  return b;
}

void BlockAllocator::ClearScattered(BlockId b) {
  uint64_t i = b;
  for (auto& level : levels_) {
    uint64_t& word = level[i / 64];
    word &= ~(uint64_t{1} << (i % 64));
    if (word != 0) break;
    i /= 64;
  }
  --num_scattered_;
}

void BlockAllocator::TakeFromRun(uint32_t n, std::vector<BlockId>* out) {
  for (uint32_t i = 0; i < n; ++i) out->push_back(run_begin_++);
}

void BlockAllocator::Allocate(uint32_t n, std::vector<BlockId>* out) {
  KVF_CHECK_LE(n, num_free());
  if (n >= 2 && run_end_ - run_begin_ >= n) {
    TakeFromRun(n, out);
    return;
  }
  while (n > 0 && num_scattered_ > 0) {
    out->push_back(TakeScattered());
    --n;
  }
  TakeFromRun(n, out);
}

BlockId BlockAllocator::PeekOne() const {
  if (num_scattered_ == 0) return run_begin_;
  uint64_t i = 0;
  for (size_t k = levels_.size(); k-- > 0;) i = i * 64 + std::countr_zero(levels_[k][i]);
  return static_cast<BlockId>(i);
}

BlockId BlockAllocator::AllocateOne() {
  KVF_CHECK(num_free() > 0) << "no free block";
  if (num_scattered_ > 0) return TakeScattered();
  return run_begin_++;
}

BlockId BlockAllocator::AllocateAfter(BlockId prev) {
  const uint64_t next = uint64_t{prev} + 1;
  if (next < num_blocks_ && run_begin_ < run_end_ && next == run_begin_) return run_begin_++;
  if (next < num_blocks_ && Bit(0, next)) {
    ClearScattered(static_cast<BlockId>(next));
    return static_cast<BlockId>(next);
  }
  return AllocateOne();
}

void BlockAllocator::Free(BlockId b) {
  KVF_DCHECK(b < num_blocks_ && !IsFree(b)) << "double free of block " << b;
  if (run_begin_ == run_end_) {
    run_begin_ = b;
    run_end_ = b + 1;
  } else if (b + 1 == run_begin_) {
    run_begin_ = b;
  } else if (b == run_end_) {
    run_end_ = b + 1;
  } else {
    SetScattered(b);
  }
}

Status BlockAllocator::CheckInvariants() const {
  if (run_begin_ > run_end_ || run_end_ > num_blocks_) return Internal("allocator: run out of range");
  uint32_t scattered = 0;
  for (uint32_t b = 0; b < num_blocks_; ++b) {
    if (!Bit(0, b)) continue;
    if (b >= run_begin_ && b < run_end_) {
      return Internal("allocator invariant 1: block " + std::to_string(b) + " both in the run and scattered");
    }
    ++scattered;
  }
  if (scattered != num_scattered_) return Internal("allocator invariant 2: scattered count disagrees with the bitmap");
  for (size_t k = 0; k + 1 < levels_.size(); ++k) {
    for (uint64_t w = 0; w < levels_[k].size(); ++w) {
      if ((levels_[k][w] != 0) != Bit(k + 1, w)) return Internal("allocator invariant 3: summary bit disagrees");
    }
  }
  return Status::Ok();
}

size_t BlockAllocator::MemoryBytes() const {
  size_t bytes = levels_.capacity() * sizeof(levels_[0]);
  for (const auto& level : levels_) bytes += level.capacity() * sizeof(uint64_t);
  return bytes;
}

}  // namespace kvfleet::kv
