// The pieces the paged-attention decode kernels share (paged_decode.cuh: the CUDA-core and
// bf16 tensor-core kernels and the combine; paged_decode_fp8.cuh: the fp8 tensor-core kernel):
// the attended token range and a block's partition of it, K/V tile staging into shared memory
// through cp.async with the block-table walk one tile ahead (LoadKvTile, KvTileLines), the
// block setup (StartDecodeBlock), the CUDA-core tiling, the warps' merge, and a partition's
// store into the output or the split-K workspace.
#pragma once

#include "kernels/attention_mask.h"
#include "kernels/cuda_common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/mma.cuh"
#include "kernels/paged_decode.h"

namespace kvfleet::kernels::decode {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// The attended tokens of a sequence in order: sinks [0, ns), then [lo, seq_len).
struct TokenRange {
  int32_t lo, ns, n;
  __device__ __forceinline__ int32_t Pos(int32_t i) const { return i < ns ? i : lo + (i - ns); }
};

__device__ __forceinline__ TokenRange MakeRange(const AttentionMask& m, int32_t seq_len) {
  TokenRange r;
  r.lo = MaskRangeStart(m, seq_len - 1);
  r.ns = MaskSinkCount(m, r.lo);
  r.n = r.ns + seq_len - r.lo;
  return r;
}

// Split-K partition `part` of a sequence attending to `range`: its tokens are
// range.Pos(i0 + i) for i in [0, len). A token at position pos has its K at
// kv_pool + layout.Offset(table[pos / B], layer, 0, kv_head, pos % B), its V v_offset
// elements further.
struct Partition {
  int i0, len;
  const int32_t* table;  // [max_blocks_per_seq]: the sequence's block table
  int B;                 // tokens per block
  int b_shift;           // log2(B) when B is a power of two, else -1
  int64_t v_offset;
};

// REQUIRES: part < the sequence's number of partitions.
__device__ __forceinline__ Partition MakePartition(const PagedDecodeParams& p, const TokenRange& range, int seq,
                                                   int part) {
  Partition pt;
  pt.i0 = part * p.partition_size;
  pt.len = min(p.partition_size, range.n - pt.i0);
  pt.table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  pt.B = p.layout.block_size;
  pt.b_shift = (pt.B & (pt.B - 1)) == 0 ? __ffs(pt.B) - 1 : -1;
  pt.v_offset = p.layout.TileElems() * p.layout.num_kv_heads;
  return pt;
}

// The pool the kernel reads: E = __nv_bfloat16 (kv_pool) or uint8_t (kv_fp8, e4m3).
template <typename E>
__device__ __forceinline__ const E* KvPool(const PagedDecodeParams& p) {
  if constexpr (sizeof(E) == 1) {
    return p.kv_fp8;
  } else {
    return p.kv_pool;
  }
}

// The layer's (K, V) dequantisation scales of a KV head: 1 for bf16.
template <typename E>
__device__ __forceinline__ float2 KvScaleOf(const PagedDecodeParams& p, int kv_head) {
  if constexpr (sizeof(E) == 1) {
    return make_float2(p.scales.k[kv_head], p.scales.v[kv_head]);
  } else {
    return make_float2(1.f, 1.f);
  }
}

// Issues the cp.async copies of partition tokens [t * kRows, (t + 1) * kRows) of one KV head
// into stage st of tiles ([stage][K, V][kRows][kStride] elements E), 16-byte chunks (8 bf16 or
// 16 fp8) spread over the block's threads; rows past pt.len are zero-filled. Commits nothing.
template <int kHeadDim, int kRows, int kStride, typename E>
__device__ __forceinline__ void LoadKvTile(const PagedDecodeParams& p, const TokenRange& range, const Partition& pt,
                                           int kv_head, int t, E* tiles, int st) {
  constexpr int kChunkElems = 16 / sizeof(E);
  constexpr int kChunks = kHeadDim / kChunkElems;
  E* ks = tiles + st * 2 * kRows * kStride;
  E* vs = ks + kRows * kStride;
  const E* pool = KvPool<E>(p);
#pragma unroll
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int row = c / kChunks, chunk = c % kChunks;
    const int i = t * kRows + row;
    const bool valid = i < pt.len;
    const E* src = pool;
    if (valid) {
      const int32_t pos = range.Pos(pt.i0 + i);
      src = pool + p.layout.Offset(pt.table[pos / pt.B], p.layer, 0, kv_head, pos % pt.B) + chunk * kChunkElems;
    }
    CpAsync16(ks + row * kStride + chunk * kChunkElems, src, valid);
    CpAsync16(vs + row * kStride + chunk * kChunkElems, valid ? src + pt.v_offset : src, valid);
  }
}

// The work of one block of a tensor-core decode kernel, grid (partition, KV head, sequence x
// chunks of kHeads query heads): query heads g0 .. g0 + kHeads - 1 of the KV head's group
// (those past the group are zero queries), partition `part` of the sequence's tokens.
struct DecodeBlock {
  int part, kv_head, group, seq, g0, num_parts, num_tiles;
  TokenRange range;
  Partition pt;
};

// Fills b; false when the partition lies past the sequence (the block has nothing to do).
// Waits for the previous kernel (PDL) before returning true: seq_lens and tables are step
// metadata, q and the cache come after the wait.
template <int kHeads, int kTile>
__device__ __forceinline__ bool StartDecodeBlock(const PagedDecodeParams& p, DecodeBlock& b) {
  b.part = blockIdx.x;
  b.kv_head = blockIdx.y;
  b.group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (b.group + kHeads - 1) / kHeads;
  b.seq = blockIdx.z / chunks;
  b.g0 = (blockIdx.z % chunks) * kHeads;
  GridDependentsLaunch();
  b.range = MakeRange(p.mask, p.seq_lens[b.seq]);
  b.num_parts = (b.range.n + p.partition_size - 1) / p.partition_size;
  if (b.part >= b.num_parts) return false;
  b.pt = MakePartition(p, b.range, b.seq, b.part);
  b.num_tiles = (b.pt.len + kTile - 1) / kTile;
  GridDependencyWait();
  return true;
}

// The same copies for the kRows-row tiles of the tensor-core kernels (64 rows), each warp
// instruction covering whole 128-byte lines: warp w copies rows [R w, R w + R), R = kRows / 4,
// into tiles ([stage][K, V][kRows][kStride] elements E); lane r < R looks row R w + r up in the
// block table, and the lanes of each copy take their row's offset from it by shuffle. Spreading
// a row's chunks over threads that each look up their own rows (LoadKvTile) costs four lookups
// per thread per tile, and handing a thread one whole row makes each copy touch 16 lines for
// 32 bytes each; measured on an H200 with fp8 pages (b=64 @ 4K), the latter kept the load/store
// unit 90% busy at 57% of DRAM bandwidth, this 69% busy at 75%. The block table is read one
// tile ahead (Load: LookUp after Copy), so that the read's latency passes while the warp computes.
template <int kHeadDim, int kRows, int kStride, typename E>
class KvTileLines {
 public:
  // Looks tile 0 up.
  __device__ __forceinline__ KvTileLines(const PagedDecodeParams& p, const DecodeBlock& b) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    row_ = warp * kWarpRows + lane % kWarpRows;
    k_ = KvPool<E>(p) + p.layout.Offset(0, p.layer, 0, b.kv_head, 0);
    v_ = k_ + b.pt.v_offset;
    block_elems_ = p.layout.BlockElems();
    LookUp(b.range, b.pt, 0);
  }

  // Copies tile t (looked up last) into stage st and looks tile t + 1 up, when t < b.num_tiles;
  // commits a cp.async group either way, so that the wait counts stay uniform.
  __device__ __forceinline__ void Load(const DecodeBlock& b, int t, E* tiles, int st) {
    if (t < b.num_tiles) {
      Copy(tiles, st);
      LookUp(b.range, b.pt, t + 1);
    }
    CpAsyncCommit();
  }

 private:
  // Reads the block-table entry of this lane's row of tile t (none past the partition).
  __device__ __forceinline__ void LookUp(const TokenRange& range, const Partition& pt, int t) {
    const int i = t * kRows + row_;
    block_ = -1;
    if (i < pt.len) {
      const int32_t pos = range.Pos(pt.i0 + i);
      const int32_t entry = pt.b_shift >= 0 ? pos >> pt.b_shift : pos / pt.B;
      block_ = pt.table[entry];
      slot_ = pos - entry * pt.B;
    }
  }

  // Issues the cp.async copies of the tile looked up last into stage st; rows past the
  // partition are zero-filled. Commits nothing.
  __device__ __forceinline__ void Copy(E* tiles, int st) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t off = block_ >= 0 ? block_ * block_elems_ + static_cast<int64_t>(slot_) * kHeadDim : -1;
    E* ks = tiles + st * 2 * kRows * kStride + warp * kWarpRows * kStride;
    E* vs = ks + kRows * kStride;
    const int chunk = lane % kChunks;
#pragma unroll
    for (int j = 0; j < kWarpRows / kRowsPerCopy; ++j) {
      const int r = j * kRowsPerCopy + lane / kChunks;
      const int64_t ro = __shfl_sync(0xffffffffu, off, r);
      const bool valid = ro >= 0;
      const int64_t o = valid ? ro + chunk * kChunkElems : 0;
      CpAsync16(ks + r * kStride + chunk * kChunkElems, k_ + o, valid);
      CpAsync16(vs + r * kStride + chunk * kChunkElems, v_ + o, valid);
    }
  }

  static constexpr int kWarpRows = kRows / kWarps;
  static_assert(kWarpRows == 16, "16 rows per warp");
  static constexpr int kChunkElems = 16 / sizeof(E);
  static constexpr int kChunks = kHeadDim / kChunkElems;  // 16-byte chunks per row
  static_assert(32 % kChunks == 0, "a row's chunks fit one warp instruction");
  static constexpr int kRowsPerCopy = 32 / kChunks;

  const E* k_;  // this layer's K of the KV head in block 0; V v_offset further
  const E* v_;
  int64_t block_elems_;
  int row_;     // this lane's row within a tile
  int32_t block_ = -1, slot_ = 0;  // the row looked up last: block < 0 past the partition
};

// 8 consecutive elements as floats (unscaled): one 16-byte (bf16) or 8-byte (fp8) read.
__device__ __forceinline__ void Load8(const __nv_bfloat16* x, float (&f)[8]) {
  Bf16x8ToFloat(*reinterpret_cast<const uint4*>(x), f);
}
__device__ __forceinline__ void Load8(const uint8_t* x, float (&f)[8]) {
  Fp8x8ToFloat(*reinterpret_cast<const uint2*>(x), f);
}

// Rotates this lane's 8 dims (rotate_half pairing: dim d with d +- head_dim/2, held by the
// lane kLanes/2 away) by position pos.
template <int kLanes>
__device__ __forceinline__ void RotateHalf(float (&x)[8], const float (&inv_freq)[8], int lane_in_row,
                                           int32_t pos) {
  const bool upper = lane_in_row >= kLanes / 2;
  float partner[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, x[e], kLanes / 2);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float s, c;
    sincosf(static_cast<float>(pos) * inv_freq[e], &s, &c);
    x[e] = upper ? x[e] * c + partner[e] * s : x[e] * c - partner[e] * s;
  }
}

template <int kHeadDim, typename E>
struct Tiling {
  static constexpr int kLanes = kHeadDim / 8;           // lanes per token row (16 B each)
  static constexpr int kRowGroups = 32 / kLanes;        // token rows a warp reads at once
  static constexpr int kPerLane = 8;                    // tokens per lane per tile
  static constexpr int kTile = kWarps * kRowGroups * kPerLane;  // tokens per tile: 32 KB of K+V
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = kStages * 2 * kTile * kHeadDim * sizeof(E);
};

// Merges the warps' online-softmax partials of row r, dims [d, d + 8), from shared memory:
// red [kWarps][kRows][kStride] partial O, red_m and red_l [kWarps][kRows] max and sum.
// Returns the row's O (unnormalised), max and sum.
template <int kRows, int kStride>
__device__ __forceinline__ void MergeWarps(const float* red, const float* red_m, const float* red_l, int r, int d,
                                           float (&o)[8], float& mx, float& sum) {
  mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w * kRows + r]);
  const float base = mx == -INFINITY ? 0.f : mx;
  sum = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) o[e] = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float c = exp2f(red_m[w * kRows + r] - base);
    sum += c * red_l[w * kRows + r];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] += c * red[(w * kRows + r) * kStride + d + e];
  }
}

// Stores dims [d, d + 8) of output row row_idx (sequence * num_q_heads + query head) from
// partition `part` of num_parts: normalised into out when it is the only one, else o, max
// and sum into the workspace for PagedDecodeCombine. Workspace (max_parts = gridDim.x):
// [num_seqs * num_q_heads][max_parts][kHeadDim] partial O, then [...][max_parts][2] (max, sum).
template <int kHeadDim>
__device__ __forceinline__ void StorePartition(const PagedDecodeParams& p, int64_t row_idx, int part, int num_parts,
                                               int d, float (&o)[8], float mx, float sum) {
  if (num_parts == 1) {
    const float inv = 1.f / sum;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] *= inv;
    *reinterpret_cast<uint4*>(p.out + row_idx * kHeadDim + d) = FloatToBf16x8(o);
  } else {
    const int max_parts = gridDim.x;
    float* po = p.workspace + (row_idx * max_parts + part) * kHeadDim + d;
    *reinterpret_cast<float4*>(po) = make_float4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<float4*>(po + 4) = make_float4(o[4], o[5], o[6], o[7]);
    if (d == 0) {
      float* ml = p.workspace + static_cast<int64_t>(p.num_seqs) * p.num_q_heads * max_parts * kHeadDim;
      ml[(row_idx * max_parts + part) * 2] = mx;
      ml[(row_idx * max_parts + part) * 2 + 1] = sum;
    }
  }
}

}  // namespace kvfleet::kernels::decode
