// Batched copy of many non-contiguous KV blocks in one launch: offload (device -> pinned host),
// onboard (pinned host -> device) and device -> device (partial-reuse copies).
//
// Pinned host memory from cudaHostAlloc/cudaMallocHost is addressable from the device under
// unified addressing (every 64-bit Linux CUDA platform), so one kernel reads or writes it
// over PCIe/C2C directly; the copy of N blocks is one launch instead of N cudaMemcpyAsync.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvfleet::kernels {

// For each pair i: dst[pairs[i][1]] = src[pairs[i][0]], blocks of block_bytes each.
//   src, dst: pools of whole blocks (PagedKvLayout::BlockBytes), device or pinned host
//   pairs: [num_pairs][2] int32 (source block, destination block), device-readable
// REQUIRES: block_bytes % 16 == 0; 16-byte aligned pools; destination blocks distinct and not
// overlapping any source block.
cudaError_t LaunchKvBlockCopy(const void* src, void* dst, const int32_t* pairs, int32_t num_pairs,
                              int64_t block_bytes, cudaStream_t stream);

}  // namespace kvfleet::kernels
