// Paged-attention decode kernels (see paged_decode.h for the contract and shapes).
//
// Grid: x = split-K partition, y = KV head, z = sequence * query-head chunks.
// Block: 4 warps. Each token row of K or V (head_dim bf16) is read by kLanes = head_dim/8
// lanes with one 16-byte load each, kUnroll loads in flight per lane.
//   1. scores[g][i] = q_g . k_i for the partition's tokens (into shared memory);
//   2. per head: max, p = exp2(s - max), sum;
//   3. acc_g = sum_i p[g][i] v_i, reduced over lanes and warps.
// One partition writes the normalised output; several write (acc, max, sum) to the
// workspace and PagedDecodeCombine merges them.
#pragma once

#include "kernels/attention_mask.h"
#include "kernels/cuda_common.cuh"
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

template <int kHeadDim, int kGroup, bool kShiftRope>
__global__ void __launch_bounds__(kThreads) PagedDecodeKernel(PagedDecodeParams p) {
  constexpr int kLanes = kHeadDim / 8;          // lanes per token row
  constexpr int kRowsPerLoad = 32 / kLanes;     // token rows per warp per load
  constexpr int kUnroll = kGroup <= 4 ? 8 : 4;  // 16-byte loads in flight per lane
  constexpr int kTokensPerIter = kRowsPerLoad * kUnroll;
  extern __shared__ float smem[];               // scores[kGroup][P], later red[kWarps][kGroup][D]
  __shared__ float s_max[kGroup], s_sum[kGroup];

  const int part = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int group = p.num_q_heads / p.layout.num_kv_heads;
  const int chunks = (group + kGroup - 1) / kGroup;
  const int seq = blockIdx.z / chunks;
  const int g0 = (blockIdx.z % chunks) * kGroup;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int lane_in_row = lane % kLanes, row = lane / kLanes;
  const int P = p.partition_size;

  const int32_t seq_len = p.seq_lens[seq];
  const TokenRange range = MakeRange(p.mask, seq_len);
  const int num_parts = (range.n + P - 1) / P;
  if (part >= num_parts) return;
  const int i0 = part * P;
  const int len = min(P, range.n - i0);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int B = p.layout.block_size;

  float inv_freq[8];
  if constexpr (kShiftRope) {
#pragma unroll
    for (int e = 0; e < 8; ++e) inv_freq[e] = p.rope_inv_freq[(lane_in_row * 8 + e) % (kHeadDim / 2)];
  }

  // This lane's 8 dims of each query head, pre-scaled so that softmax uses exp2.
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
    for (int e = 0; e < 8; ++e) q[g][e] *= p.scale * kLog2e;
  }

  auto row_ptr = [&](int i, int kv) {
    const int32_t pos = range.Pos(i0 + i);
    const int32_t block = table[pos / B];
    return p.kv_pool + p.layout.Offset(block, p.layer, kv, kv_head, pos % B) + lane_in_row * 8;
  };

  // 1. Scores.
  float* scores = smem;
  for (int base = warp * kTokensPerIter; base < len; base += kWarps * kTokensPerIter) {
    uint4 k[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRowsPerLoad + row;
      k[u] = i < len ? LoadStreaming(row_ptr(i, 0)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRowsPerLoad + row;
      float kf[8];
      Bf16x8ToFloat(k[u], kf);
      if constexpr (kShiftRope) RotateHalf<kLanes>(kf, inv_freq, lane_in_row, i0 + i);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(q[g][e], kf[e], s);
        s = WarpSum<kLanes>(s);
        if (lane_in_row == 0 && i < len) scores[g * P + i] = s;
      }
    }
  }
  __syncthreads();

  // 2. Softmax statistics of this partition, per head.
  for (int g = warp; g < kGroup; g += kWarps) {
    float m = -INFINITY;
    for (int i = lane; i < len; i += 32) m = fmaxf(m, scores[g * P + i]);
    m = WarpMax(m);
    float l = 0.f;
    for (int i = lane; i < len; i += 32) {
      const float e = exp2f(scores[g * P + i] - m);
      scores[g * P + i] = e;
      l += e;
    }
    l = WarpSum(l);
    if (lane == 0) {
      s_max[g] = m;
      s_sum[g] = l;
    }
  }
  __syncthreads();

  // 3. Weighted sum of V.
  float acc[kGroup][8];
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.f;
  for (int base = warp * kTokensPerIter; base < len; base += kWarps * kTokensPerIter) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRowsPerLoad + row;
      v[u] = i < len ? LoadStreaming(row_ptr(i, 1)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * kRowsPerLoad + row;
      if (i >= len) continue;
      float vf[8];
      Bf16x8ToFloat(v[u], vf);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        const float w = scores[g * P + i];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(w, vf[e], acc[g][e]);
      }
    }
  }
  // Sum over the rows a warp covers, then over warps.
#pragma unroll
  for (int g = 0; g < kGroup; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int o = kLanes; o < 32; o <<= 1) acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
  __syncthreads();  // scores are no longer read
  float* red = smem;
  if (row == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(warp * kGroup + g) * kHeadDim + lane_in_row * 8 + e] = acc[g][e];
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < kGroup * kLanes; idx += kThreads) {
    const int g = idx / kLanes, d = (idx % kLanes) * 8;
    if (g0 + g >= group) continue;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      o[e] = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o[e] += red[(w * kGroup + g) * kHeadDim + d + e];
    }
    const int hq = kv_head * group + g0 + g;
    const int64_t row_idx = static_cast<int64_t>(seq) * p.num_q_heads + hq;
    if (num_parts == 1) {
      const float inv = 1.f / s_sum[g];
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
        ml[(row_idx * max_parts + part) * 2] = s_max[g];
        ml[(row_idx * max_parts + part) * 2 + 1] = s_sum[g];
      }
    }
  }
}

// Merges the partitions of one (sequence, query head): grid (num_q_heads, num_seqs).
template <int kHeadDim>
__global__ void __launch_bounds__(kThreads) PagedDecodeCombine(PagedDecodeParams p, int max_parts) {
  const int hq = blockIdx.x, seq = blockIdx.y;
  const TokenRange range = MakeRange(p.mask, p.seq_lens[seq]);
  const int num_parts = (range.n + p.partition_size - 1) / p.partition_size;
  if (num_parts <= 1) return;  // the attention kernel wrote this row itself
  const int64_t row_idx = static_cast<int64_t>(seq) * p.num_q_heads + hq;
  const float* ml = p.workspace + static_cast<int64_t>(p.num_seqs) * p.num_q_heads * max_parts * kHeadDim +
                    row_idx * max_parts * 2;
  __shared__ float s_w[kThreads];
  __shared__ float s_total;
  // Global max, then weights; partitions are few (<= a few hundred), one pass each.
  float m = -INFINITY;
  for (int i = threadIdx.x; i < num_parts; i += kThreads) m = fmaxf(m, ml[2 * i]);
  __shared__ float s_red[kWarps];
  m = WarpMax(m);
  if (threadIdx.x % 32 == 0) s_red[threadIdx.x / 32] = m;
  __syncthreads();
  m = fmaxf(fmaxf(s_red[0], s_red[1]), fmaxf(s_red[2], s_red[3]));
  __syncthreads();
  float l = 0.f;
  for (int i = threadIdx.x; i < num_parts; i += kThreads) l += exp2f(ml[2 * i] - m) * ml[2 * i + 1];
  l = WarpSum(l);
  if (threadIdx.x % 32 == 0) s_red[threadIdx.x / 32] = l;
  __syncthreads();
  if (threadIdx.x == 0) s_total = s_red[0] + s_red[1] + s_red[2] + s_red[3];
  const float* po = p.workspace + row_idx * max_parts * kHeadDim;
  constexpr int kPerThread = (kHeadDim + kThreads - 1) / kThreads;
  float o[kPerThread] = {};
  for (int c = 0; c < num_parts; c += kThreads) {
    __syncthreads();
    if (c + threadIdx.x < num_parts) s_w[threadIdx.x] = exp2f(ml[2 * (c + threadIdx.x)] - m);
    __syncthreads();
    const int n = min(kThreads, num_parts - c);
    for (int j = 0; j < n; ++j) {
      const float w = s_w[j];
#pragma unroll
      for (int k = 0; k < kPerThread; ++k) {
        const int d = threadIdx.x + k * kThreads;
        if (d < kHeadDim) o[k] += w * po[(c + j) * kHeadDim + d];
      }
    }
  }
  __syncthreads();
  const float inv = 1.f / s_total;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int d = threadIdx.x + k * kThreads;
    if (d < kHeadDim) p.out[row_idx * kHeadDim + d] = __float2bfloat16(o[k] * inv);
  }
}

}  // namespace kvfleet::kernels::decode
