// Contract 4's checks of what a frame carries against the pull it answers (transfer_codec.h:
// CheckBlock, CheckDeviceRun, CheckNcclRun): both ends run them, the holder before it sends and
// the receiver on what arrives.
#include <string>

#include "schema/transfer_codec.h"

namespace kvfleet::transfer {

namespace {

template <typename B>
Status CheckBlockOf(const PullRequest& request, const B& b, uint32_t index, bool verify_checksums) {
  const std::string at = "block " + std::to_string(index) + ": ";
  if (b.index != index) return InvalidArgument(at + "index " + std::to_string(b.index) + " out of order");
  if (index >= request.hashes.size()) return InvalidArgument(at + "beyond the " + std::to_string(request.hashes.size()) + " asked for");
  if (b.hash != request.hashes[index]) return InvalidArgument(at + "hash is not the one asked for");
  if (b.tokens.size() != request.block_size) {
    return InvalidArgument(at + std::to_string(b.tokens.size()) + " tokens, not " + std::to_string(request.block_size));
  }
  const Layout& layout = request.layout;
  const size_t pools = layout.dtype == KvDtype::kNone ? 0 : layout.pools.size();
  if (b.data.size() != pools || b.checksums.size() != pools) {
    return InvalidArgument(at + std::to_string(b.data.size()) + " data and " + std::to_string(b.checksums.size()) +
                           " checksums for " + std::to_string(pools) + " pools");
  }
  for (size_t i = 0; i < pools; ++i) {
    if (b.data[i].size() != layout.pools[i].bytes_per_block) {
      return InvalidArgument(at + "pool " + std::to_string(i) + " holds " + std::to_string(b.data[i].size()) +
                             " bytes, not " + std::to_string(layout.pools[i].bytes_per_block));
    }
    if (verify_checksums && Checksum(b.data[i]) != b.checksums[i]) {
      return DataLoss(at + "pool " + std::to_string(i) + " checksum mismatch");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckBlock(const PullRequest& request, const Block& b, uint32_t index, bool verify_checksums) {
  return CheckBlockOf(request, b, index, verify_checksums);
}

Status CheckBlock(const PullRequest& request, const BlockView& b, uint32_t index, bool verify_checksums) {
  return CheckBlockOf(request, b, index, verify_checksums);
}

namespace {

// Block i of a device or nccl run: index i, hash hashes[i], block_size tokens, `slots` slots.
Status CheckDeviceBlocks(const PullRequest& request, std::span<const DeviceBlock> blocks, size_t slots) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const DeviceBlock& b = blocks[i];
    const std::string at = "device block " + std::to_string(i) + ": ";
    if (b.index != i) return InvalidArgument(at + "index " + std::to_string(b.index) + " out of order");
    if (b.hash != request.hashes[i]) return InvalidArgument(at + "hash is not the one asked for");
    if (b.tokens.size() != request.block_size) {
      return InvalidArgument(at + std::to_string(b.tokens.size()) + " tokens, not " + std::to_string(request.block_size));
    }
    if (b.slots.size() != slots) {
      return InvalidArgument(at + std::to_string(b.slots.size()) + " slots, not " + std::to_string(slots));
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckDeviceRun(const PullRequest& request, const DeviceRun& run) {
  const size_t pools = request.layout.pools.size();
  if (run.handles.size() != pools) {
    return InvalidArgument("device run with " + std::to_string(run.handles.size()) + " handles for " +
                           std::to_string(pools) + " pools");
  }
  if (run.blocks.size() > request.hashes.size()) {
    return InvalidArgument("device run of " + std::to_string(run.blocks.size()) + " blocks for a chain of " +
                           std::to_string(request.hashes.size()));
  }
  return CheckDeviceBlocks(request, run.blocks, pools);
}

Status CheckNcclRun(const PullRequest& request, const NcclRun& run) {
  if (!request.nccl) return InvalidArgument("an nccl answer to a pull that did not offer NCCL");
  if (run.comm == 0) return InvalidArgument("nccl run with communicator 0");
  if (run.unique_id.empty() && (request.nccl_comm == 0 || run.comm != request.nccl_comm)) {
    return InvalidArgument("nccl run on communicator " + std::to_string(run.comm) +
                           " without a unique id, which the pull did not name");
  }
  if (!run.unique_id.empty() && run.unique_id.size() != config::kNcclUniqueIdBytes) {
    return InvalidArgument("nccl unique id of " + std::to_string(run.unique_id.size()) + " bytes");
  }
  if (run.blocks.size() > request.hashes.size()) {
    return InvalidArgument("nccl run of " + std::to_string(run.blocks.size()) + " blocks for a chain of " +
                           std::to_string(request.hashes.size()));
  }
  return CheckDeviceBlocks(request, run.blocks, 0);
}

}  // namespace kvfleet::transfer
