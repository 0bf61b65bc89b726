// BlockAllocator: the free blocks of one tier of one pool, with O(1) allocate and free.
//
// Like LightLLM's TokenAttention allocator it prefers handing a new sequence one contiguous
// run of blocks, which keeps its KV in one span. It keeps one free run [run_begin, run_end)
// plus the scattered free blocks outside it:
//   - Allocate(n >= 2) takes n blocks from the run when the run holds n, else scattered
//     blocks first (so the run survives for the next sequence), then the run.
//   - Allocate(1) takes a scattered block first, the lowest-numbered one.
//   - AllocateAfter(prev) (a decode step) takes prev + 1 when it is free at the run's start
//     or scattered, so a sequence's tokens stay contiguous (at B = 1, one slot per token).
//   - Free(b) extends the run when b touches either end, seeds a new run when the run is
//     empty, and otherwise marks b scattered. A sequence freed last block first therefore
//     rebuilds a run.
// The scattered blocks are a bitmap with a summary level per 64 words (1/8 byte per block
// plus 1/512 above it), so finding one costs a few word scans however many blocks there
// are: allocation stays O(1) in practice (O(log64 blocks)) without a 4-byte stack entry
// per block.
//
// Invariants:
//   1. Every block is free (in the run or scattered, exactly once) or allocated.
//   2. num_free() == run length + scattered count.
//   3. A summary bit is set iff the word (or summary word) below it is non-zero.
//
// Thread safety: thread-compatible; owned by the engine thread with its manager.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/kv/block_copier.h"

namespace kvfleet::kv {

class BlockAllocator {
 public:
  explicit BlockAllocator(uint32_t num_blocks);

  uint32_t num_blocks() const { return num_blocks_; }
  uint32_t num_free() const { return (run_end_ - run_begin_) + num_scattered_; }
  bool IsFree(BlockId b) const { return (b >= run_begin_ && b < run_end_) || Bit(0, b); }

  // Appends n block ids to *out. REQUIRES: n <= num_free().
  void Allocate(uint32_t n, std::vector<BlockId>* out);
  BlockId AllocateOne();
  // prev + 1 when it is free and takes no block from inside the run, else AllocateOne().
  BlockId AllocateAfter(BlockId prev);
  // The block AllocateOne() would return now. REQUIRES: num_free() > 0.
  BlockId PeekOne() const;
  // REQUIRES: b is allocated.
  void Free(BlockId b);

  // Checks invariants 1-3; the message names the first broken one.
  Status CheckInvariants() const;
  // Host memory of the allocator in bytes.
  size_t MemoryBytes() const;

 private:
  bool Bit(size_t level, uint64_t i) const { return (levels_[level][i / 64] >> (i % 64)) & 1; }
  void SetScattered(BlockId b);
  BlockId TakeScattered();  // REQUIRES: num_scattered_ > 0
  void ClearScattered(BlockId b);  // REQUIRES: b is scattered
  void TakeFromRun(uint32_t n, std::vector<BlockId>* out);

  uint32_t num_blocks_;
  uint32_t run_begin_ = 0;
  uint32_t run_end_ = 0;
  uint32_t num_scattered_ = 0;
  // levels_[0]: one bit per block (scattered free); levels_[k + 1]: one bit per word of
  // levels_[k] that is non-zero. The last level is a single word.
  std::vector<std::vector<uint64_t>> levels_;
};

}  // namespace kvfleet::kv
