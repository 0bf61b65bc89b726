// CudaBackend's KV transfer (Contract 4, schema/README.md): whole bf16 blocks copied out of,
// and into, the pools (device blocks, and the pinned host tier's for reads).
//
// Ordering: the engine thread calls between steps, but a step's tail, a block copy
// (offload, onboard, copy on partial reuse) or a LoRA load may still be on the stream, so a
// read waits for the stream first, and every device copy runs on the stream itself. A write
// returns once its copies are done: the next step, on the same stream, reads the blocks.
//
// Device bytes go through two pinned staging halves: the DMA of one piece into (or out of)
// one half overlaps the host memcpy of the other, and neither direction pays the driver's
// own pageable staging. Host-tier blocks are plain memory already: a memcpy.
//
// Same host (CUDA IPC): ExportKvDevice hands out each pool's cudaIpcMemHandle_t once the
// stream is idle; a receiver maps the holder's pool (once, kept) and copies its blocks device
// to device on its own stream, merging neighbouring blocks into one copy. The holder keeps the
// blocks pinned and unchanged until the receiver says it is done (kv_pulls.cc).
//
// Another host, or no IPC between the two (NCCL): MakeKvNccl (cuda_kv_nccl.h) sends and
// receives whole blocks by ncclSend/ncclRecv on a thread and stream of its own.
//
// Not supported: an fp8 cache (the block bytes are e4m3 under per-model scales, which
// Contract 4's Layout does not carry yet) and tensor parallelism (each rank holds its KV heads
// of a block; no peer layout names that split).
//
// Thread-compatible (cuda_backend.h): the engine thread calls it.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "worker/backend/cuda/cuda_backend.h"
#include "common/log.h"
#include "worker/backend/cuda/cuda_kv_nccl.h"
#include "worker/backend/cuda/cuda_util.h"

namespace kvfleet::backend::cuda {

namespace {

// One contiguous range of bytes: a block, or the part of one that fits a staging half.
struct Piece {
  std::byte* device = nullptr;
  std::byte* host = nullptr;
  size_t bytes = 0;
};

// Appends [device, device + bytes) <-> [host, ...) cut to the staging half's size; neighbouring
// ranges (consecutive blocks) are merged first, so a run of blocks moves in few copies.
void AddPieces(std::byte* device, std::byte* host, size_t bytes, std::vector<Piece>* pieces) {
  if (!pieces->empty()) {
    Piece& last = pieces->back();
    if (last.device + last.bytes == device && last.host + last.bytes == host &&
        last.bytes < config::kTransferStagingBytes) {
      const size_t take = std::min(bytes, config::kTransferStagingBytes - last.bytes);
      last.bytes += take;
      device += take;
      host += take;
      bytes -= take;
    }
  }
  for (size_t at = 0; at < bytes; at += config::kTransferStagingBytes) {
    pieces->push_back({device + at, host + at, std::min(config::kTransferStagingBytes, bytes - at)});
  }
}

}  // namespace

KvTransferFormat CudaBackend::kv_transfer_format() const {
  if (shard_.ranks > 1) {
    return KvTransferFormat{"", "a cuda worker with " + std::to_string(shard_.ranks) +
                                    " tensor-parallel ranks splits each KV block over its GPUs; no peer layout names "
                                    "that split, so it does not move KV blocks", {}};
  }
  if (kv_fp8_) {
    return KvTransferFormat{"", "an fp8 KV cache's blocks are e4m3 under per-model scales, which Contract 4's layout "
                                "does not carry yet, so it does not move KV blocks", {}};
  }
  return KvTransferFormat{"bf16", "", {}};
}

Status CudaBackend::ReadKvBlocks(uint32_t pool, std::span<const kv::BlockLocation> blocks, std::span<std::byte> out) {
  KVF_RETURN_IF_ERROR(CheckKvTransfer(pool, blocks.size(), out.size()));
  const uint64_t bpb = pools_[pool].bytes_per_block;
  const KvPoolInfo& info = pools_[pool];
  std::vector<Piece> pieces;
  std::vector<size_t> host_blocks;  // indexes into `blocks` on the host tier
  for (size_t i = 0; i < blocks.size(); ++i) {
    const bool device = blocks[i].tier == kv::Tier::kDevice;
    const int64_t total = device ? info.device_blocks : info.host_blocks;
    if (int64_t{blocks[i].block} >= total) {
      return InvalidArgument("KV transfer: no " + std::string(device ? "device" : "host") + " block " +
                             std::to_string(blocks[i].block) + " in pool " + std::to_string(pool));
    }
    if (device) {
      AddPieces(static_cast<std::byte*>(device_kv_[pool]) + size_t{blocks[i].block} * bpb, out.data() + i * bpb, bpb,
                &pieces);
    } else {
      host_blocks.push_back(i);
    }
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  // Steps and block copies (the host tier's offloads too) still on the stream end first.
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
  for (const size_t i : host_blocks) {
    std::memcpy(out.data() + i * bpb, host_kv_[pool] + size_t{blocks[i].block} * bpb, bpb);
  }
  // Piece k's DMA into half k % 2 overlaps the memcpy of piece k - 1 out of the other half.
  for (size_t k = 0; k <= pieces.size(); ++k) {
    if (k < pieces.size()) {
      KVF_CUDA_RETURN(cudaMemcpyAsync(transfer_staging_[k % 2], pieces[k].device, pieces[k].bytes,
                                      cudaMemcpyDeviceToHost, stream_));
      KVF_CUDA_RETURN(cudaEventRecord(transfer_done_[k % 2], stream_));
    }
    if (k > 0) {
      const Piece& prev = pieces[k - 1];
      KVF_CUDA_RETURN(cudaEventSynchronize(transfer_done_[(k - 1) % 2]));
      std::memcpy(prev.host, transfer_staging_[(k - 1) % 2], prev.bytes);
    }
  }
  return Status::Ok();
}

Status CudaBackend::WriteKvBlocks(uint32_t pool, std::span<const BlockId> blocks, std::span<const std::byte> in) {
  KVF_RETURN_IF_ERROR(CheckKvTransfer(pool, blocks.size(), in.size()));
  const uint64_t bpb = pools_[pool].bytes_per_block;
  std::vector<std::span<const std::byte>> each(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) each[i] = in.subspan(i * bpb, bpb);
  return WriteKvBlocksFrom(pool, blocks, each);
}

Status CudaBackend::WriteKvBlocksFrom(uint32_t pool, std::span<const BlockId> blocks,
                                      std::span<const std::span<const std::byte>> in) {
  if (blocks.size() != in.size()) return InvalidArgument("KV transfer: block and buffer counts differ");
  KVF_RETURN_IF_ERROR(CheckKvTransfer(pool, 0, 0));  // a format that moves blocks, a pool that exists
  const uint64_t bpb = pools_[pool].bytes_per_block;
  std::vector<Piece> pieces;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (int64_t{blocks[i]} >= pools_[pool].device_blocks) {
      return InvalidArgument("KV transfer: no device block " + std::to_string(blocks[i]) + " in pool " +
                             std::to_string(pool));
    }
    if (in[i].size() != bpb) {
      return InvalidArgument("KV transfer: " + std::to_string(in[i].size()) + " bytes for a block of " +
                             std::to_string(bpb));
    }
    AddPieces(static_cast<std::byte*>(device_kv_[pool]) + size_t{blocks[i]} * bpb,
              const_cast<std::byte*>(in[i].data()), bpb, &pieces);
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  // Half k % 2 is refilled once piece k - 2's DMA out of it is done; the copies queue behind
  // whatever the stream holds, and the next step queues behind them. A run of blocks in one
  // call overlaps each block's memcpy into staging with the previous one's DMA.
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (k >= 2) KVF_CUDA_RETURN(cudaEventSynchronize(transfer_done_[k % 2]));
    std::memcpy(transfer_staging_[k % 2], pieces[k].host, pieces[k].bytes);
    KVF_CUDA_RETURN(cudaMemcpyAsync(pieces[k].device, transfer_staging_[k % 2], pieces[k].bytes,
                                    cudaMemcpyHostToDevice, stream_));
    KVF_CUDA_RETURN(cudaEventRecord(transfer_done_[k % 2], stream_));
  }
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

std::vector<std::string> CudaBackend::ExportKvDevice() {
  if (!kv_transfer_format().unsupported.empty()) return {};
  if (cudaSetDevice(options_.device) != cudaSuccess || cudaStreamSynchronize(stream_) != cudaSuccess) return {};
  if (!ipc_handles_) {  // made once; empty when that failed
    ipc_handles_.emplace();
    for (size_t p = 0; p < device_kv_.size(); ++p) {
      cudaIpcMemHandle_t h;
      if (const cudaError_t e = cudaIpcGetMemHandle(&h, device_kv_[p]); e != cudaSuccess) {
        Logger("cuda")->warn("KV transfer: no IPC handle for the KV pools ({}): pulls get bytes", cudaGetErrorString(e));
        ipc_handles_->clear();
        break;
      }
      // The handle, then the pool's size in bytes: the receiver bounds every block it reads.
      std::string handle(reinterpret_cast<const char*>(&h), sizeof(h));
      const uint64_t bytes = uint64_t(pools_[p].device_blocks) * pools_[p].bytes_per_block;
      handle.append(reinterpret_cast<const char*>(&bytes), sizeof(bytes));
      ipc_handles_->push_back(std::move(handle));
    }
  }
  return *ipc_handles_;
}

Status CudaBackend::CopyKvBlocksFromPeer(uint32_t pool, const std::string& handle, std::span<const BlockId> src,
                                         std::span<const BlockId> dst) {
  KVF_RETURN_IF_ERROR(CheckKvTransfer(pool, 0, 0));  // a format that moves blocks, a pool that exists
  if (src.size() != dst.size()) return InvalidArgument("KV transfer: source and destination block counts differ");
  constexpr size_t kHandleBytes = sizeof(cudaIpcMemHandle_t) + sizeof(uint64_t);  // ExportKvDevice's
  if (handle.size() != kHandleBytes) {
    return InvalidArgument("KV transfer: a peer pool's handle is " + std::to_string(kHandleBytes) + " bytes, not " +
                           std::to_string(handle.size()));
  }
  uint64_t peer_bytes = 0;
  std::memcpy(&peer_bytes, handle.data() + sizeof(cudaIpcMemHandle_t), sizeof(peer_bytes));
  const uint64_t bpb = pools_[pool].bytes_per_block;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (int64_t{dst[i]} >= pools_[pool].device_blocks || (uint64_t{src[i]} + 1) * bpb > peer_bytes) {
      return InvalidArgument("KV transfer: block " + std::to_string(src[i]) + " -> " + std::to_string(dst[i]) +
                             " is outside pool " + std::to_string(pool) + " on either side");
    }
  }
  KVF_CUDA_RETURN(cudaSetDevice(options_.device));
  auto mapping = std::find_if(peer_kv_.begin(), peer_kv_.end(), [&](const auto& m) { return m.first == handle; });
  if (mapping == peer_kv_.end()) {
    if (peer_kv_.size() >= config::kMaxPeerMappings) {
      KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
      cudaIpcCloseMemHandle(peer_kv_.front().second);
      peer_kv_.erase(peer_kv_.begin());
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* mapped = nullptr;
    if (const cudaError_t e = cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
      cudaGetLastError();  // not sticky: a later launch check must not see it
      return FailedPrecondition(std::string("KV transfer: cannot map the holder's KV pool (same process, another "
                                            "IPC namespace, or no peer access): ") + cudaGetErrorString(e));
    }
    peer_kv_.emplace_back(handle, mapped);  // the whole handle: a pool of another size is another mapping
    mapping = peer_kv_.end() - 1;
  }
  const auto* from = static_cast<const std::byte*>(mapping->second);
  auto* to = static_cast<std::byte*>(device_kv_[pool]);
  for (size_t i = 0; i < src.size();) {
    size_t n = 1;  // a run of blocks consecutive on both sides: one copy
    while (i + n < src.size() && src[i + n] == src[i] + n && dst[i + n] == dst[i] + n) ++n;
    KVF_CUDA_RETURN(cudaMemcpyAsync(to + size_t{dst[i]} * bpb, from + size_t{src[i]} * bpb, n * bpb,
                                    cudaMemcpyDefault, stream_));
    i += n;
  }
  KVF_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return Status::Ok();
}

Result<std::unique_ptr<KvNccl>> CudaBackend::MakeKvNccl(std::function<void()> on_done) {
  if (const KvTransferFormat f = kv_transfer_format(); !f.unsupported.empty()) return FailedPrecondition(f.unsupported);
  KvNcclPools pools;
  pools.device = options_.device;
  pools.engine_stream = stream_;
  for (size_t p = 0; p < device_kv_.size(); ++p) {
    pools.pools.push_back(static_cast<std::byte*>(device_kv_[p]));
    pools.bytes_per_block.push_back(pools_[p].bytes_per_block);
    pools.device_blocks.push_back(pools_[p].device_blocks);
  }
  return MakeCudaKvNccl(std::move(pools), std::move(on_done));
}

}  // namespace kvfleet::backend::cuda
