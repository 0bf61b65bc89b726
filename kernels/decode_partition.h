// How the paged-attention decode (paged_decode.h) splits a sequence's context into split-K
// partitions. Plain C++, built everywhere, so CI tests the choice without a GPU.
#pragma once

#include <cstdint>

namespace kvfleet::kernels {

// Blocks of the decode kernels resident per SM at head_dim 128: the bf16 tensor-core kernel's
// two 34 KB stages fit three (paged_decode.cuh). The chooser sizes waves by it, for fp8 pages
// too (sizing fp8's waves by its four picked worse partitions).
inline constexpr int kDecodeResidentBlocksPerSm = 3;

// A partition size (multiple of 128, <= 2048) for a decode grid on num_sms: several waves of
// resident blocks for full batches, one wave of long partitions for a few sequences
// (decode_partition.cc says how, with the measurements). REQUIRES: num_kv_heads > 0.
int32_t PagedDecodeChoosePartition(int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads,
                                   int32_t max_seq_len, int32_t num_sms);

}  // namespace kvfleet::kernels
