// BlockAllocator: the free blocks of one tier of one pool, with O(1) allocate and free.
//
// Like LightLLM's TokenAttention allocator it prefers handing a new sequence one contiguous
// run of blocks, which keeps its KV in one span. It keeps one free run [run_begin, run_end)
// plus a stack of scattered free blocks:
//   - Allocate(n >= 2) takes n blocks from the run when the run holds n, else the stack
//     first (so the run survives for the next sequence), then the run.
//   - Allocate(1) (a decode step) takes from the stack first.
//   - Free(b) extends the run when b touches either end, seeds a new run when the run is
//     empty, and otherwise pushes b on the stack. A sequence freed last block first
//     therefore rebuilds a run.
//
// Invariants:
//   1. Every block is free (in the run or on the stack, exactly once) or allocated.
//   2. num_free() == run length + stack size.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/kv/block_copier.h"
#include "worker/kv/huge_page_allocator.h"

namespace kvfleet::kv {

class BlockAllocator {
 public:
  explicit BlockAllocator(uint32_t num_blocks);

  uint32_t num_blocks() const { return num_blocks_; }
  uint32_t num_free() const { return (run_end_ - run_begin_) + static_cast<uint32_t>(stack_.size()); }
  bool IsFree(BlockId b) const { return free_[b] != 0; }

  // Appends n block ids to *out. REQUIRES: n <= num_free().
  void Allocate(uint32_t n, std::vector<BlockId>* out);
  BlockId AllocateOne();
  // REQUIRES: b is allocated.
  void Free(BlockId b);

  // Checks invariants 1-2; the message names the first broken one.
  Status CheckInvariants() const;

 private:
  void TakeFromRun(uint32_t n, std::vector<BlockId>* out);

  uint32_t num_blocks_;
  uint32_t run_begin_ = 0;
  uint32_t run_end_ = 0;
  HugeVector<BlockId> stack_;
  HugeVector<uint8_t> free_;  // 1 = free
};

}  // namespace kvfleet::kv
