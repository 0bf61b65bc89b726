// Kernels behind small_kernels.h. Each thread moves 16-byte vectors of 8 bf16. PDL
// (launch.h): each waits for the previous kernel before touching activations or the cache.
#pragma once

#include "kernels/cuda_common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/small_kernels.h"

namespace kvfleet::kernels::small {

// One block per row; each thread keeps up to kMaxVec vectors of the row in registers.
template <int kMaxVec>
__global__ void RmsNormKernel(const __nv_bfloat16* x, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                              __nv_bfloat16* out, int32_t hidden, float eps) {
  const int64_t row = blockIdx.x;
  const int vecs = hidden / 8;
  float v[kMaxVec][8];
  float ss = 0.f;
  GridDependentsLaunch();
  GridDependencyWait();
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= vecs) break;
    Bf16x8ToFloat(reinterpret_cast<const uint4*>(x + row * hidden)[c], v[j]);
    if (residual) {
      float r[8];
      uint4* rp = reinterpret_cast<uint4*>(residual + row * hidden) + c;
      Bf16x8ToFloat(*rp, r);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[j][e] = Bf16Round(v[j][e] + r[e]);
      *rp = FloatToBf16x8(v[j]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[j][e] * v[j][e];
  }
  __shared__ float s_warp[32];
  __shared__ float s_inv;
  ss = WarpSum(ss);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = threadIdx.x < blockDim.x / 32 ? s_warp[threadIdx.x] : 0.f;
    t = WarpSum(t);
    if (threadIdx.x == 0) s_inv = rsqrtf(t / hidden + eps);
  }
  __syncthreads();
  const float inv = s_inv;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int c = threadIdx.x + j * blockDim.x;
    if (c >= vecs) break;
    float w[8];
    Bf16x8ToFloat(reinterpret_cast<const uint4*>(weight)[c], w);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[j][e] = w[e] * Bf16Round(v[j][e] * inv);
    reinterpret_cast<uint4*>(out + row * hidden)[c] = FloatToBf16x8(v[j]);
  }
}

// One block per token. Work items: for each q and k head, 8 dims of the lower half (with their
// rotate_half partners in the upper half); for each v head, 8 dims. With norms, a first pass
// puts each q and k head's 1/rms in shared memory.
__global__ void RopeKvStoreKernel(const __nv_bfloat16* qkv, const int32_t* positions, const int32_t* slots,
                                  const float* inv_freq, __nv_bfloat16* q_out, __nv_bfloat16* kv_pool,
                                  PagedKvLayout layout, int32_t layer, int32_t num_q_heads, bool rotate,
                                  RopeKvExtras ex) {
  extern __shared__ float s_inv_rms[];  // [num_q_heads + num_kv_heads], with norms
  const int64_t t = blockIdx.x;
  const int D = layout.head_dim, half = D / 2, hk = layout.num_kv_heads;
  const int row_elems = (num_q_heads + 2 * hk) * D;
  const __nv_bfloat16* in = qkv + t * row_elems;
  const int32_t pos = positions[t];
  const int32_t slot = slots[t];
  if (ex.inv_freq_row != nullptr) inv_freq += static_cast<int64_t>(ex.inv_freq_row[t]) * half;
  const bool norm = ex.q_norm != nullptr;
  GridDependentsLaunch();
  GridDependencyWait();
  if (norm) {
    // 1/rms of each q and k head: a warp per head, a lane per 8 dims (D <= 256), so the sum's
    // order is fixed and the result reproducible.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int head = warp; head < num_q_heads + hk; head += warps) {
      float ss = 0.f;
      if (lane < D / 8) {
        float v[8];
        Bf16x8ToFloat(*reinterpret_cast<const uint4*>(in + head * D + lane * 8), v);
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
      }
      ss = WarpSum(ss);
      if (lane == 0) s_inv_rms[head] = rsqrtf(ss / D + ex.norm_eps);
    }
    __syncthreads();
  }
  const int64_t block = slot >= 0 ? slot / layout.block_size : 0;
  const int32_t in_block = slot >= 0 ? slot % layout.block_size : 0;
  const int rot_items = (num_q_heads + hk) * (half / 8);
  const int items = rot_items + hk * (D / 8);
  for (int it = threadIdx.x; it < items; it += blockDim.x) {
    if (it < rot_items) {
      const int head = it / (half / 8), d = (it % (half / 8)) * 8;
      float lo[8], hi[8];
      Bf16x8ToFloat(*reinterpret_cast<const uint4*>(in + head * D + d), lo);
      Bf16x8ToFloat(*reinterpret_cast<const uint4*>(in + head * D + d + half), hi);
      if (norm) {
        const __nv_bfloat16* w = head < num_q_heads ? ex.q_norm : ex.k_norm;
        const float inv = s_inv_rms[head];
        float wl[8], wh[8];
        Bf16x8ToFloat(*reinterpret_cast<const uint4*>(w + d), wl);
        Bf16x8ToFloat(*reinterpret_cast<const uint4*>(w + d + half), wh);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          lo[e] = Bf16Round(wl[e] * Bf16Round(lo[e] * inv));
          hi[e] = Bf16Round(wh[e] * Bf16Round(hi[e] * inv));
        }
      }
      if (rotate) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float s, c;
          sincosf(static_cast<float>(pos) * inv_freq[d + e], &s, &c);
          c = Bf16Round(c);
          s = Bf16Round(s);
          const float a = lo[e], b = hi[e];
          lo[e] = Bf16Round(a * c) + Bf16Round(-b * s);
          hi[e] = Bf16Round(b * c) + Bf16Round(a * s);
        }
      }
      __nv_bfloat16* dst;
      if (head < num_q_heads) {
        dst = q_out + (t * num_q_heads + head) * D;
      } else {
        if (slot < 0) continue;
        if (ex.kv_fp8 != nullptr) {
          const int hkv = head - num_q_heads;
          uint8_t* dst8 = ex.kv_fp8 + layout.Offset(block, layer, 0, hkv, in_block);
          const float sc = ex.scales.k[hkv];
#pragma unroll
          for (int e = 0; e < 8; ++e) lo[e] = Bf16Round(lo[e]), hi[e] = Bf16Round(hi[e]);
          *reinterpret_cast<uint2*>(dst8 + d) = FloatToFp8x8(lo, sc);
          *reinterpret_cast<uint2*>(dst8 + d + half) = FloatToFp8x8(hi, sc);
          continue;
        }
        dst = kv_pool + layout.Offset(block, layer, 0, head - num_q_heads, in_block);
      }
      *reinterpret_cast<uint4*>(dst + d) = FloatToBf16x8(lo);
      *reinterpret_cast<uint4*>(dst + d + half) = FloatToBf16x8(hi);
    } else {
      if (slot < 0) continue;
      const int v_it = it - rot_items;
      const int head = v_it / (D / 8), d = (v_it % (D / 8)) * 8;
      const uint4 val = *reinterpret_cast<const uint4*>(in + (num_q_heads + hk + head) * D + d);
      if (ex.kv_fp8 != nullptr) {
        float f[8];
        Bf16x8ToFloat(val, f);
        *reinterpret_cast<uint2*>(ex.kv_fp8 + layout.Offset(block, layer, 1, head, in_block) + d) =
            FloatToFp8x8(f, ex.scales.v[head]);
        continue;
      }
      *reinterpret_cast<uint4*>(kv_pool + layout.Offset(block, layer, 1, head, in_block) + d) = val;
    }
  }
}

// Llama 4's q/k transforms (RopeKvExtras::interleaved, l2_norm, temperature) and the K/V
// store into a bf16 pool: one block per token, a warp per q or k head (a lane per 8 dims, D <= 256, so the
// interleaved pairs stay within a lane and the L2 norm's sum is one warp reduction in a fixed
// order), then every thread on the V heads' 8-dim items.
__global__ void Llama4QkKvStoreKernel(const __nv_bfloat16* qkv, const int32_t* positions, const int32_t* slots,
                                      const float* inv_freq, __nv_bfloat16* q_out, __nv_bfloat16* kv_pool,
                                      PagedKvLayout layout, int32_t layer, int32_t num_q_heads, bool rotate,
                                      RopeKvExtras ex) {
  const int64_t t = blockIdx.x;
  const int D = layout.head_dim, hk = layout.num_kv_heads;
  const int row_elems = (num_q_heads + 2 * hk) * D;
  const __nv_bfloat16* in = qkv + t * row_elems;
  const int32_t pos = positions[t];
  const int32_t slot = slots[t];
  if (ex.inv_freq_row != nullptr) inv_freq += static_cast<int64_t>(ex.inv_freq_row[t]) * (D / 2);
  GridDependentsLaunch();
  GridDependencyWait();
  const int64_t block = slot >= 0 ? slot / layout.block_size : 0;
  const int32_t in_block = slot >= 0 ? slot % layout.block_size : 0;
  // HF: log1p(floor((cache_position.float() + 1) / floor_scale)) * attn_scale + 1, in fp32.
  const bool tune = ex.temperature_floor > 0.f;
  const float temp =
      tune ? log1pf(floorf((static_cast<float>(pos) + 1.f) / ex.temperature_floor)) * ex.temperature_scale + 1.f : 1.f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int d = lane * 8;
  const bool active = d < D;
  for (int head = warp; head < num_q_heads + hk; head += warps) {  // warp-uniform
    const bool is_q = head < num_q_heads;
    if (!is_q && slot < 0) continue;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (active) Bf16x8ToFloat(*reinterpret_cast<const uint4*>(in + head * D + d), v);
    if (rotate && active) {  // interleaved pairs (the launcher refuses rotate_half here)
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        float s, c;
        sincosf(static_cast<float>(pos) * inv_freq[(d + e) / 2], &s, &c);
        const float a = v[e], b = v[e + 1];
        v[e] = Bf16Round(a * c - b * s);
        v[e + 1] = Bf16Round(a * s + b * c);
      }
    }
    if (ex.l2_norm) {
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[e] * v[e];  // inactive lanes hold zeros
      ss = WarpSum(ss);
      const float inv = rsqrtf(ss / D + ex.norm_eps);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = Bf16Round(v[e] * inv);
    }
    if (is_q && tune) {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = Bf16Round(v[e] * temp);
    }
    if (!active) continue;
    if (is_q) {
      *reinterpret_cast<uint4*>(q_out + (t * num_q_heads + head) * D + d) = FloatToBf16x8(v);
      continue;
    }
    *reinterpret_cast<uint4*>(kv_pool + layout.Offset(block, layer, 0, head - num_q_heads, in_block) + d) =
        FloatToBf16x8(v);
  }
  if (slot < 0) return;
  for (int it = threadIdx.x; it < hk * (D / 8); it += blockDim.x) {
    const int head = it / (D / 8), dv = (it % (D / 8)) * 8;
    *reinterpret_cast<uint4*>(kv_pool + layout.Offset(block, layer, 1, head, in_block) + dv) =
        *reinterpret_cast<const uint4*>(in + (num_q_heads + hk + head) * D + dv);
  }
}

__global__ void SiluMulKernel(const __nv_bfloat16* gate_up, __nv_bfloat16* out, int32_t rows, int32_t inter) {
  const int64_t vecs_per_row = inter / 8;
  const int64_t total = rows * vecs_per_row;
  GridDependentsLaunch();
  GridDependencyWait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / vecs_per_row, c = i % vecs_per_row;
    float g[8], u[8];
    Bf16x8ToFloat(reinterpret_cast<const uint4*>(gate_up + r * 2 * inter)[c], g);
    Bf16x8ToFloat(reinterpret_cast<const uint4*>(gate_up + r * 2 * inter + inter)[c], u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = Bf16Round(g[e] / (1.f + expf(-g[e]))) * u[e];
    reinterpret_cast<uint4*>(out + r * inter)[c] = FloatToBf16x8(g);
  }
}

__global__ void EmbeddingKernel(const int32_t* ids, const __nv_bfloat16* table, __nv_bfloat16* out, int32_t vocab,
                                int32_t hidden) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  GridDependentsLaunch();
  GridDependencyWait();
  for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) {
    const uint4 v = valid ? reinterpret_cast<const uint4*>(table + int64_t(id) * hidden)[c] : make_uint4(0, 0, 0, 0);
    reinterpret_cast<uint4*>(out + t * hidden)[c] = v;
  }
}

}  // namespace kvfleet::kernels::small
