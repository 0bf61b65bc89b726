// BlockCopier: how the KV cache manager moves KV data it does not own.
//
// The backend owns the KV memory; the manager only hands out block ids. KV memory layout
// (the cpu and cuda backends use it): per pool and per tier, block-major
//   [num_blocks][layers_in_pool][2 (K, V)][num_kv_heads][B][head_dim]
// so one block is one contiguous span of PoolLayout::bytes_per_block bytes, and every copy
// the manager asks for is a whole block:
//   - offload:       device block -> host block   (eviction keeps a block on the host tier)
//   - onboard:       host block   -> device block (a request reuses a host block)
//   - partial reuse: device or host block -> device block. The whole block is copied, then
//     the sequence recomputes and overwrites the tokens after the matching ones.
//
// Ordering: the manager issues copies in the order they must happen, in one batch per
// public call, before it returns. A later copy may read a block that an earlier copy in the
// same batch wrote, and a block freed by an offload may be the destination of a later copy,
// so the backend must execute them in order (one CUDA stream does that) and before any
// kernel that reads or writes those blocks (enqueue on the compute stream, or sync).
//
// Thread safety: called on the engine thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "schema/kv_event.h"

namespace kvfleet::kv {

using BlockId = uint32_t;
constexpr BlockId kNoBlock = UINT32_MAX;  // a block-table entry with no block (dropped, or none)

// Where one pool keeps a block: its tier and block id there.
struct BlockLocation {
  Tier tier = Tier::kDevice;
  BlockId block = 0;
};

struct BlockCopy {
  uint32_t pool = 0;
  Tier src_tier = Tier::kDevice;
  BlockId src = 0;
  Tier dst_tier = Tier::kDevice;
  BlockId dst = 0;
};

class BlockCopier {
 public:
  virtual ~BlockCopier() = default;
  // Copies each whole block, in order. cudaMemcpyAsync on GPU, memcpy on CPU.
  virtual void Copy(std::span<const BlockCopy> copies) = 0;
};

// A copier over plain host memory: one base pointer per (pool, tier), block-major arenas.
// The cpu backend uses it; tests use it over small arenas.
class MemcpyBlockCopier final : public BlockCopier {
 public:
  struct Arena {
    std::byte* device = nullptr;  // [device_blocks][bytes_per_block]
    std::byte* host = nullptr;    // [host_blocks][bytes_per_block]; may be null without a host tier
    size_t bytes_per_block = 0;
  };
  explicit MemcpyBlockCopier(std::vector<Arena> arenas) : arenas_(std::move(arenas)) {}
  void Copy(std::span<const BlockCopy> copies) override;

 private:
  std::vector<Arena> arenas_;  // indexed by pool
};

}  // namespace kvfleet::kv
