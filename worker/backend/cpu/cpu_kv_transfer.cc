// CpuBackend's KV transfer (Contract 4): whole fp32 blocks copied out of, and into, the
// rank's arenas. With several tensor-parallel ranks a block is split over their arenas and
// no peer layout names that split, so such a worker does not move blocks.
// Thread-compatible (cpu_backend.h): the engine thread calls it between steps.
#include <cstring>
#include <string>

#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/cpu_rank.h"

namespace kvfleet::backend::cpu {

KvTransferFormat CpuBackend::kv_transfer_format() const {
  if (ranks_.size() > 1) {
    return KvTransferFormat{"", "a cpu worker with " + std::to_string(ranks_.size()) +
                                    " tensor-parallel ranks does not move KV blocks", {}};
  }
  return KvTransferFormat{"fp32", "", {}};
}

Status CpuBackend::ReadKvBlocks(uint32_t pool, std::span<const kv::BlockLocation> blocks, std::span<std::byte> out) {
  KVF_RETURN_IF_ERROR(CheckKvTransfer(pool, blocks.size(), out.size()));
  const uint64_t bpb = pools_[pool].bytes_per_block;
  const Rank& rk = *ranks_[0];
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool device = blocks[i].tier == kv::Tier::kDevice;
    const int64_t total = device ? pools_[pool].device_blocks : pools_[pool].host_blocks;
    if (blocks[i].block >= total) return InvalidArgument("KV transfer: no block " + std::to_string(blocks[i].block));
    const float* base = device ? rk.device_kv[pool] : rk.host_kv[pool];
    std::memcpy(out.data() + i * bpb, reinterpret_cast<const std::byte*>(base) + size_t{blocks[i].block} * bpb, bpb);
  }
  return {};
}

Status CpuBackend::WriteKvBlocks(uint32_t pool, std::span<const BlockId> blocks, std::span<const std::byte> in) {
  KVF_RETURN_IF_ERROR(CheckKvTransfer(pool, blocks.size(), in.size()));
  const uint64_t bpb = pools_[pool].bytes_per_block;
  Rank& rk = *ranks_[0];
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] >= pools_[pool].device_blocks) {
      return InvalidArgument("KV transfer: no device block " + std::to_string(blocks[i]));
    }
    std::memcpy(reinterpret_cast<std::byte*>(rk.device_kv[pool]) + size_t{blocks[i]} * bpb, in.data() + i * bpb, bpb);
  }
  return {};
}

}  // namespace kvfleet::backend::cpu
