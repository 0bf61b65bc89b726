// L2 prefetch: a byte range (weights a later kernel of the step reads) brought into the
// GPU's L2 while the kernels before that one, which read little, leave DRAM idle.
//
// A batch-1 decode step of a small-hidden model (qwen3-30b-a3b: hidden 2048) spends much of
// each layer in kernels that read a few MB at most (norms, RoPE and the K/V store, the
// attention over one sequence, the MoE routing and combine), between products that each read
// 17-50 MB in a few microseconds. Launched on a side stream forked from the step's stream, a
// prefetch of the next product's weights overlaps those kernels, and the product then reads
// from L2 (worker/backend/cuda/l2_prefetcher.h places them).
//
// Thread safety: a launcher, as the other kernels'.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace kvfleet::kernels {

// Asks L2 for [p, p + bytes) in 16 KiB bulk prefetches (cp.async.bulk.prefetch.L2, sm_90),
// with an evict_last cache policy when `evict_last` (the lines outlive streamed data that
// comes between the prefetch and the product). Changes no memory; a prefetch is a hint, so
// lines may be dropped. A plain launch (no PDL): it depends on whatever the stream orders
// before it. REQUIRES: p 16-byte aligned; bytes a multiple of 16 (a tail past the last 16
// bytes is left out).
cudaError_t LaunchL2Prefetch(const void* p, size_t bytes, bool evict_last, cudaStream_t stream);

}  // namespace kvfleet::kernels
