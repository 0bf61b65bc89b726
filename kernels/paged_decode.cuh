// Paged-attention decode kernels (see paged_decode.h for the contract and shapes).
//
// Grid: x = split-K partition, y = KV head, z = sequence * query-head chunks.
// Block: 4 warps. K/V tiles of 32 KB stream into shared memory through cp.async, two stages
// deep, so the bytes in flight do not depend on registers; the block table is read by the
// copying threads one tile ahead. Each token row (head_dim bf16) is then read by
// kLanes = head_dim/8 lanes, 16 bytes each. One pass: scores, online softmax (per warp) and
// acc_g += p v; warps merge through shared memory at the end. One partition writes the
// normalised output; several write (acc, max, sum) to the workspace and PagedDecodeCombine
// merges them.
//
// The pieces all decode kernels share (tile staging, the block-table walk, block setup, the
// split-K workspace) are in paged_decode_common.cuh; the fp8 tensor-core kernel is in
// paged_decode_fp8.cuh. The CUDA-core kernel's bf16 and fp8 paths are one template (E) whose
// branches sit side by side.
#pragma once

#include "kernels/paged_decode_common.cuh"

namespace kvfleet::kernels::decode {

// E: __nv_bfloat16 or uint8_t (fp8 e4m3: the K scale goes into q, the V scale into acc).
template <int kHeadDim, int kGroup, bool kShiftRope, typename E>
__global__ void __launch_bounds__(kThreads) PagedDecodeKernel(PagedDecodeParams p) {
  using T = Tiling<kHeadDim, E>;
  constexpr int kLanes = T::kLanes, kTile = T::kTile, kPerLane = T::kPerLane;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // [stage][K, V][kTile][kHeadDim] E; after the loop: per-warp (acc, max, sum) for the merge.
  E* tiles = reinterpret_cast<E*>(smem_raw);

  const int part = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + kGroup - 1) / kGroup;
  const int seq = blockIdx.z / chunks;
  const int g0 = (blockIdx.z % chunks) * kGroup;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int lane_in_row = lane % kLanes, row_group = lane / kLanes;

  // PDL (launch.h): seq_lens and tables are step metadata; q and the cache come after the wait.
  GridDependentsLaunch();
  const TokenRange range = MakeRange(p.mask, p.seq_lens[seq]);
  const int num_parts = (range.n + p.partition_size - 1) / p.partition_size;
  if (part >= num_parts) return;
  const Partition pt = MakePartition(p, range, seq, part);
  GridDependencyWait();

  // Issues the cp.async copies of tile t (tokens i0 + t*kTile ...) into stage st.
  auto load_tile = [&](int t, int st) {
    LoadKvTile<kHeadDim, kTile, kHeadDim, E>(p, range, pt, kv_head, t, tiles, st);
    CpAsyncCommit();
  };

  const int num_tiles = (pt.len + kTile - 1) / kTile;
  load_tile(0, 0);

  float inv_freq[8];
  if constexpr (kShiftRope) {
#pragma unroll
    for (int e = 0; e < 8; ++e) inv_freq[e] = p.rope_inv_freq[(lane_in_row * 8 + e) % (kHeadDim / 2)];
  }
  // This lane's 8 dims of each query head, pre-scaled so that softmax uses exp2.
  const float2 kv_scale = KvScaleOf<E>(p, kv_head);
  float q[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const int hq = kv_head * group + g0 + g;
    if (g0 + g < group) {
      const uint4 v = *reinterpret_cast<const uint4*>(
          p.q + (static_cast<int64_t>(seq) * p.num_q_heads + hq) * kHeadDim + lane_in_row * 8);
      Bf16x8ToFloat(v, q[g]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = 0.f;
    }
    if constexpr (kShiftRope) RotateHalf<kLanes>(q[g], inv_freq, lane_in_row, range.n - 1);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[g][e] *= p.scale * kLog2e * kv_scale.x;
  }

  // Online softmax state of this warp (the lanes of a row group hold the same max and sum).
  float acc[kGroup][8], m[kGroup], l[kGroup];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  }

  for (int t = 0; t < num_tiles; ++t) {
    const int st = t & 1;
    if (t + 1 < num_tiles) {
      load_tile(t + 1, st ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    const E* ks = tiles + st * 2 * kTile * kHeadDim;
    const E* vs = ks + kTile * kHeadDim;
    // This lane's tokens in the tile: rows (warp, row_group, u).
    const int row0 = (warp * T::kRowGroups + row_group) * kPerLane;

    float s[kGroup][kPerLane];
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      float kf[8];
      Load8(ks + (row0 + u) * kHeadDim + lane_in_row * 8, kf);
      const int i = t * kTile + row0 + u;
      if constexpr (kShiftRope) RotateHalf<kLanes>(kf, inv_freq, lane_in_row, pt.i0 + i);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(q[g][e], kf[e], dot);
        dot = WarpSum<kLanes>(dot);
        s[g][u] = i < pt.len ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) mx = fmaxf(mx, s[g][u]);
#pragma unroll
      for (int o = kLanes; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float base = mx == -INFINITY ? 0.f : mx;
      const float corr = exp2f(m[g] - base);
      m[g] = mx;
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        s[g][u] = exp2f(s[g][u] - base);
        l[g] += s[g][u];
      }
    }
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      float vf[8];
      Load8(vs + (row0 + u) * kHeadDim + lane_in_row * 8, vf);
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(s[g][u], vf[e], acc[g][e]);
    }
    __syncthreads();  // the stage is refilled by the next iteration's prefetch
  }

  // Merge the row groups of the warp (same max), then the warps through shared memory.
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
#pragma unroll
    for (int o = kLanes; o < 32; o <<= 1) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    }
  }
  float* red = reinterpret_cast<float*>(smem_raw);  // [kWarps][kGroup][kHeadDim]
  float* red_m = red + kWarps * kGroup * kHeadDim;  // [kWarps][kGroup]
  float* red_l = red_m + kWarps * kGroup;           // [kWarps][kGroup]
  if (row_group == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(warp * kGroup + g) * kHeadDim + lane_in_row * 8 + e] = acc[g][e] * kv_scale.y;
      if (lane == 0) {
        red_m[warp * kGroup + g] = m[g];
        red_l[warp * kGroup + g] = l[g];
      }
    }
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < kGroup * kLanes; idx += kThreads) {
    const int g = idx / kLanes, d = (idx % kLanes) * 8;
    if (g0 + g >= group) continue;
    float o[8], mx, sum;
    MergeWarps<kGroup, kHeadDim>(red, red_m, red_l, g, d, o, mx, sum);
    const int hq = kv_head * group + g0 + g;
    const int64_t row_idx = static_cast<int64_t>(seq) * p.num_q_heads + hq;
    StorePartition<kHeadDim>(p, row_idx, part, num_parts, d, o, mx, sum);
  }
}

// Tensor-core variant for bf16 pages, head_dim <= 128 without shifted RoPE (fp8 pages:
// paged_decode_fp8.cuh). The (up to 16) query heads of a KV head are the 16 rows of one
// mma.sync m16n8k16 tile; each warp takes 16 tokens of every 64-token K/V tile (two cp.async
// stages), computes S = Q K^T and O += P V on tensor cores with its own online softmax, and
// the warps merge at the end. Rows past the group are zero queries whose results are dropped:
// the tensor cores have far more throughput than a memory-bound decode needs, and this path
// issues ~8x fewer instructions per token than the CUDA-core kernel above.
namespace mma {

constexpr int kTile = 64;  // tokens per stage: 16 per warp
// Two stages of 34 KB (one tile loading while the other is used): three blocks fit an SM
// (registers allow three as well), twelve warps; the partition chooser sizes its waves by
// those three (kDecodeResidentBlocksPerSm, decode_partition.h). Measured on an H200 against three stages
// (two blocks per SM): 73-76% of copy bandwidth at 1K-32K context against 69-70%
// (tests/bench/results, v8); with KvTileLines, 89-94% (2026-11-25-fp8-decode.txt).
constexpr int kStages = 2;
constexpr int kPad = 8;    // bf16 per shared row: conflict-free fragment loads
// Floats per row of the warps' partial O in the merge: 8 of padding make the float2 stores
// of a quad's 8 rows fall in distinct banks (unpadded, the 8 rows share 4 banks: 8-way).
template <int kHeadDim>
constexpr int MergeStride() {
  return kHeadDim + 8;
}

template <int kHeadDim>
constexpr int SmemBytes() {
  return kStages * 2 * kTile * (kHeadDim + kPad) * int(sizeof(__nv_bfloat16));
}

template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) PagedDecodeMmaKernel(PagedDecodeParams p) {
  using E = __nv_bfloat16;
  constexpr int kStride = kHeadDim + kPad;
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kDTiles = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  E* tiles = reinterpret_cast<E*>(smem_raw);  // [stage][K,V][kTile][kStride]

  DecodeBlock b;
  if (!StartDecodeBlock<16, kTile>(p, b)) return;
  const int kv_head = b.kv_head, group = b.group, seq = b.seq, g0 = b.g0, num_tiles = b.num_tiles;
  const Partition& pt = b.pt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gid = lane / 4, tig = lane % 4;

  KvTileLines<kHeadDim, kTile, kStride, E> loader(p, b);
  auto load_tile = [&](int t) { loader.Load(b, t, tiles, t % kStages); };
  load_tile(0);

  // Q as the A operand: row r = query head g0 + r of this KV head (zero past the group).
  uint32_t qa[kKSteps][4];
  {
    const int r_lo = g0 + gid, r_hi = g0 + gid + 8;
    const E* q_lo = p.q + (static_cast<int64_t>(seq) * p.num_q_heads + kv_head * group + r_lo) * kHeadDim;
    const E* q_hi = q_lo + 8 * kHeadDim;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool hi = j & 1;
        const int col = kk * 16 + (j >> 1) * 8 + 2 * tig;
        const bool valid = (hi ? r_hi : r_lo) < group;
        qa[kk][j] = valid ? *reinterpret_cast<const uint32_t*>((hi ? q_hi : q_lo) + col) : 0u;
      }
  }

  float o[kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t)
#pragma unroll
    for (int j = 0; j < 4; ++j) o[t][j] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * kLog2e;

  for (int t = 0; t < num_tiles; ++t) {
    CpAsyncWait<0>();
    __syncthreads();  // tile t landed for everyone; the other stage is free again
    load_tile(t + 1);
    // The warp's 16 K rows of the stage, then (kTile rows on) its 16 V rows.
    const E* ks = tiles + (t % kStages) * 2 * kTile * kStride + warp * 16 * kStride;
    const E* vs = ks + kTile * kStride;

    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) s[nt][j] = 0.f;
      // Lanes 8j..8j+7 address the rows of matrix j: dims kk * 16 + 8 j .. + 7 (two k steps).
      const E* kaddr = ks + (nt * 8 + (lane & 7)) * kStride + (lane >> 3) * 8;
#pragma unroll
      for (int kk = 0; kk < kKSteps; kk += 2) {
        uint32_t b[4];
        LdMatrixX4(b, kaddr + kk * 16);
        Mma(s[nt], qa[kk], b[0], b[1]);
        Mma(s[nt], qa[kk + 1], b[2], b[3]);
      }
    }
    const int base_i = t * kTile + warp * 16;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        s[nt][j] = base_i + nt * 8 + 2 * tig + (j & 1) < pt.len ? s[nt][j] * scale_log2 : -INFINITY;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(m[h], fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float base = mx == -INFINITY ? 0.f : mx;
      const float corr = exp2f(m[h] - base);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * corr + sum;
#pragma unroll
      for (int d = 0; d < kDTiles; ++d) {
        o[d][2 * h] *= corr;
        o[d][2 * h + 1] *= corr;
      }
    }
    const uint32_t pa[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]), PackBf16(s[1][0], s[1][1]),
                            PackBf16(s[1][2], s[1][3])};
#pragma unroll
    for (int dn = 0; dn < kHeadDim / 16; ++dn) {
      uint32_t b[4];
      LdMatrixX4Trans(b, vs + (lane & 15) * kStride + dn * 16 + (lane >> 4) * 8);
      Mma(o[2 * dn], pa, b[0], b[1]);
      Mma(o[2 * dn + 1], pa, b[2], b[3]);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // shared memory is reused for the merge

  // Merge the warps: [kWarps][16 rows][kHeadDim] partial O, [kWarps][16] max and sum.
  constexpr int kRed = MergeStride<kHeadDim>();
  float* red = reinterpret_cast<float*>(smem_raw);
  float* red_m = red + kWarps * 16 * kRed;
  float* red_l = red_m + kWarps * 16;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = gid + 8 * h;
    if (g0 + r >= group) continue;  // zero query rows: never read back
    if (tig == 0) {
      red_m[warp * 16 + r] = m[h];
      red_l[warp * 16 + r] = sum;
    }
    float* row = red + (warp * 16 + r) * kRed;
#pragma unroll
    for (int d = 0; d < kDTiles; ++d)
      *reinterpret_cast<float2*>(row + d * 8 + 2 * tig) = make_float2(o[d][2 * h], o[d][2 * h + 1]);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * kChunks; idx += kThreads) {
    const int r = idx / kChunks, d = (idx % kChunks) * 8;
    if (g0 + r >= group) continue;
    float out[8], mx, sum;
    MergeWarps<16, kRed>(red, red_m, red_l, r, d, out, mx, sum);
    const int64_t row_idx = static_cast<int64_t>(seq) * p.num_q_heads + kv_head * group + g0 + r;
    StorePartition<kHeadDim>(p, row_idx, b.part, b.num_parts, d, out, mx, sum);
  }
}

}  // namespace mma

// Merges the partitions of one (sequence, query head): grid (num_q_heads, num_seqs). Warp w
// takes partitions w, w + kWarps, ..., kUnroll of them in flight at once, each lane
// kHeadDim / 32 contiguous dims; the warps' sums meet in shared memory in warp order, so the
// result does not depend on timing. (A row's partitions walked one after another by every
// thread made the merge a chain of dependent loads as long as the partitions were many.)
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) PagedDecodeCombine(PagedDecodeParams p, int max_parts) {
  constexpr int kDims = kHeadDim / 32;  // per lane: 2, 4 or 8
  constexpr int kUnroll = 4;
  static_assert(kDims % 2 == 0, "head_dim 64, 128 or 256");
  const int hq = blockIdx.x, seq = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  GridDependentsLaunch();
  GridDependencyWait();  // PDL: the partitions come from the previous kernel
  const TokenRange range = MakeRange(p.mask, p.seq_lens[seq]);
  const int num_parts = (range.n + p.partition_size - 1) / p.partition_size;
  if (num_parts <= 1) return;  // the attention kernel wrote this row itself
  const int64_t row_idx = static_cast<int64_t>(seq) * p.num_q_heads + hq;
  const float* ml = p.workspace + static_cast<int64_t>(p.num_seqs) * p.num_q_heads * max_parts * kHeadDim +
                    row_idx * max_parts * 2;
  __shared__ float s_red[kWarps];
  __shared__ float s_acc[kWarps][kHeadDim];
  // Global max, then the sum of the partitions' sums rescaled to it.
  float m = -INFINITY;
  for (int i = threadIdx.x; i < num_parts; i += kThreads) m = fmaxf(m, ml[2 * i]);
  m = WarpMax(m);
  if (lane == 0) s_red[warp] = m;
  __syncthreads();
  m = fmaxf(fmaxf(s_red[0], s_red[1]), fmaxf(s_red[2], s_red[3]));
  __syncthreads();
  float l = 0.f;
  for (int i = threadIdx.x; i < num_parts; i += kThreads) l += exp2f(ml[2 * i] - m) * ml[2 * i + 1];
  l = WarpSum(l);
  if (lane == 0) s_red[warp] = l;

  const float* po = p.workspace + row_idx * max_parts * kHeadDim + kDims * lane;
  float acc[kDims] = {};
  for (int i0 = warp; i0 < num_parts; i0 += kWarps * kUnroll) {
    float v[kUnroll][kDims], mx[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load issued before any is used
      const int i = i0 + u * kWarps;
      mx[u] = i < num_parts ? ml[2 * i] : -INFINITY;
#pragma unroll
      for (int e = 0; e < kDims; e += 2) {
        const float2 x = i < num_parts ? *reinterpret_cast<const float2*>(po + int64_t(i) * kHeadDim + e)
                                       : make_float2(0.f, 0.f);
        v[u][e] = x.x, v[u][e + 1] = x.y;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float w = exp2f(mx[u] - m);  // 0 past the partitions
#pragma unroll
      for (int e = 0; e < kDims; ++e) acc[e] += w * v[u][e];
    }
  }
#pragma unroll
  for (int e = 0; e < kDims; ++e) s_acc[warp][kDims * lane + e] = acc[e];
  __syncthreads();
  const float inv = 1.f / (s_red[0] + s_red[1] + s_red[2] + s_red[3]);
  for (int d = threadIdx.x; d < kHeadDim; d += kThreads) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][d];
    p.out[row_idx * kHeadDim + d] = __float2bfloat16(o * inv);
  }
}

}  // namespace kvfleet::kernels::decode
