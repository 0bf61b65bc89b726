#include "kernels/decode_partition.h"

namespace kvfleet::kernels {

int32_t PagedDecodeChoosePartition(int32_t num_seqs, int32_t num_q_heads, int32_t num_kv_heads, int32_t max_seq_len,
                                   int32_t num_sms) {
  // Blocks per partition of the tensor-core kernels: one per 16 query heads of a KV head.
  const int group = num_q_heads / num_kv_heads;
  const int64_t blocks_per_part = int64_t(num_seqs) * num_kv_heads * ((group + 15) / 16);
  // Three regimes, from partition sweeps on an H200, bf16 and fp8 pages
  // (tests/bench/results/2026-11-28-decode-partitions.txt has the tables):
  // 1. Full batches: the largest partition (256..2048) giving kMinWaves waves of resident
  //    blocks, so the last, partial wave costs little (batch 64 at 4K: P=1024, 93% of copy
  //    bandwidth bf16), with at most kMaxParts per sequence: with more, one wave of long
  //    partitions beat the waves (one sequence at 64K: P=2048 45 us fp8, P=256 62). Waves are
  //    sized by three blocks per SM for both kernels: sizing fp8's by its four picked worse.
  // 2. Small grids: one wave, at least half full, of the longest partitions. A block pays its
  //    start once and the merge has fewer partitions (one sequence at 32K: P=1024 51 us bf16
  //    and 31 fp8, against P=256's 78 and 49); the fastest of eleven small shapes for bf16.
  // 3. Neither: regime 1 without the bound, else 256 when that fills a wave, else 128.
  // Decode graphs size the grid for their length bucket, up to twice the real length.
  constexpr int64_t kMinWaves = 4;
  constexpr int64_t kMaxParts = 32;
  const int64_t slots = int64_t(kDecodeResidentBlocksPerSm) * num_sms;
  auto parts = [&](int32_t part) { return (int64_t(max_seq_len) + part - 1) / part; };
  auto blocks = [&](int32_t part) { return blocks_per_part * parts(part); };
  for (int32_t part = 2048; part >= 256; part /= 2)
    if (blocks(part) >= kMinWaves * slots && parts(part) <= kMaxParts) return part;
  for (int32_t part = 2048; part >= 256; part /= 2)
    if (2 * blocks(part) >= slots && blocks(part) <= slots) return part;
  for (int32_t part = 2048; part >= 256; part /= 2)
    if (blocks(part) >= kMinWaves * slots) return part;
  return blocks(256) >= slots ? 256 : 128;
}

}  // namespace kvfleet::kernels
