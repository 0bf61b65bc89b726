#include "worker/kv/block_allocator.h"

#include <string>

#include "common/check.h"

namespace kvfleet::kv {

BlockAllocator::BlockAllocator(uint32_t num_blocks)
    : num_blocks_(num_blocks), run_begin_(0), run_end_(num_blocks), free_(num_blocks, 1) {
  stack_.reserve(num_blocks);
}

void BlockAllocator::TakeFromRun(uint32_t n, std::vector<BlockId>* out) {
  for (uint32_t i = 0; i < n; ++i) {
    free_[run_begin_] = 0;
    out->push_back(run_begin_++);
  }
}

void BlockAllocator::Allocate(uint32_t n, std::vector<BlockId>* out) {
  KVF_CHECK_LE(n, num_free());
  if (n >= 2 && run_end_ - run_begin_ >= n) {
    TakeFromRun(n, out);
    return;
  }
  while (n > 0 && !stack_.empty()) {
    const BlockId b = stack_.back();
    stack_.pop_back();
    free_[b] = 0;
    out->push_back(b);
    --n;
  }
  TakeFromRun(n, out);
}

BlockId BlockAllocator::AllocateOne() {
  KVF_CHECK(num_free() > 0) << "no free block";
  BlockId b;
  if (!stack_.empty()) {
    b = stack_.back();
    stack_.pop_back();
  } else {
    b = run_begin_++;
  }
  free_[b] = 0;
  return b;
}

void BlockAllocator::Free(BlockId b) {
  KVF_DCHECK(b < num_blocks_ && !free_[b]) << "double free of block " << b;
  free_[b] = 1;
  if (run_begin_ == run_end_) {
    run_begin_ = b;
    run_end_ = b + 1;
  } else if (b + 1 == run_begin_) {
    run_begin_ = b;
  } else if (b == run_end_) {
    run_end_ = b + 1;
  } else {
    stack_.push_back(b);
  }
}

Status BlockAllocator::CheckInvariants() const {
  std::vector<uint8_t> seen(num_blocks_, 0);
  if (run_begin_ > run_end_ || run_end_ > num_blocks_) return Internal("allocator: run out of range");
  for (uint32_t b = run_begin_; b < run_end_; ++b) seen[b]++;
  for (BlockId b : stack_) {
    if (b >= num_blocks_) return Internal("allocator: stack block out of range");
    seen[b]++;
  }
  for (uint32_t b = 0; b < num_blocks_; ++b) {
    if (seen[b] > 1) return Internal("allocator invariant 1: block " + std::to_string(b) + " free twice");
    if ((seen[b] == 1) != (free_[b] == 1)) {
      return Internal("allocator invariant 1: block " + std::to_string(b) + " free flag disagrees with lists");
    }
  }
  return Status::Ok();
}

}  // namespace kvfleet::kv
