#include "kernels/paged_attention_generic.h"

#include <cmath>

#include "kernels/fp8.cuh"

namespace kvfleet::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxPerLane = 256 / kWarp;  // head_dim <= 256

__device__ __forceinline__ float WarpAllSum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float Load(const __nv_bfloat16* x, int d) { return __bfloat162float(x[d]); }
// Unscaled: the caller applies the layer's scale.
__device__ __forceinline__ float Load(const uint8_t* x, int d) {
  return Fp8x2ToFloat2(static_cast<uint16_t>(x[d])).x;
}

// Element d of x rotated at `pos` (HF rotate_half): pairs (i, i + half).
template <typename E>
__device__ __forceinline__ float Rotated(const E* x, int d, int half, const float* inv_freq, float pos) {
  const int i = d < half ? d : d - half;
  float s, c;
  sincosf(pos * inv_freq[i], &s, &c);
  const float a = Load(x, i), b = Load(x, i + half);
  return d < half ? a * c - b * s : b * c + a * s;
}

// E: __nv_bfloat16 (kv_pool) or uint8_t (kv_fp8, e4m3: the K scale goes into the softmax
// scale, the V scale into the output).
template <typename E>
__global__ void GenericAttentionKernel(GenericAttentionParams p) {
  const int row = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int hd = p.layout.head_dim, half = hd / 2, B = p.layout.block_size;
  const int kv_head = h / (p.num_q_heads / p.layout.num_kv_heads);
  const int32_t qpos = p.positions[row];
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.token_seq[row]) * p.max_blocks_per_seq;
  const int32_t lo = MaskRangeStart(p.mask, qpos);
  const int32_t ns = MaskSinkCount(p.mask, lo);
  const bool shift = p.rope_inv_freq != nullptr;
  const __nv_bfloat16* qrow = p.q + (static_cast<int64_t>(row) * p.num_q_heads + h) * hd;

  const E* pool;
  float k_scale = 1.f, v_scale = 1.f;
  if constexpr (sizeof(E) == 1) {
    pool = reinterpret_cast<const E*>(p.kv_fp8);
    k_scale = p.scales.k[kv_head];
    v_scale = p.scales.v[kv_head];
  } else {
    pool = reinterpret_cast<const E*>(p.kv_pool);
  }
  const float scale = p.scale * k_scale;

  float q[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + j * kWarp;
    acc[j] = 0.f;
    q[j] = 0.f;
    if (d < hd) {
      q[j] = shift ? Rotated(qrow, d, half, p.rope_inv_freq, static_cast<float>(ns + (qpos - lo)))
                   : __bfloat162float(qrow[d]);
    }
  }
  float m = -INFINITY, l = 0.f;
  const int32_t n = ns + (qpos - lo + 1);  // visible keys: sinks [0, ns), then [lo, qpos]
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = i < ns ? i : lo + (i - ns);
    const int32_t blk = table[t / B];
    const E* k = pool + p.layout.Offset(blk, p.layer, 0, kv_head, t % B);
    const E* v = pool + p.layout.Offset(blk, p.layer, 1, kv_head, t % B);
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + j * kWarp;
      if (d < hd) {
        const float kd = shift ? Rotated(k, d, half, p.rope_inv_freq, static_cast<float>(i)) : Load(k, d);
        dot += q[j] * kd;
      }
    }
    const float s = WarpAllSum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), w = expf(s - m_new);
    l = l * corr + w;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + j * kWarp;
      if (d < hd) acc[j] = acc[j] * corr + w * Load(v, d);
    }
    m = m_new;
  }
  __nv_bfloat16* out = p.out + (static_cast<int64_t>(row) * p.num_q_heads + h) * hd;
  const float inv = l > 0.f ? v_scale / l : 0.f;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + j * kWarp;
    if (d < hd) out[d] = __float2bfloat16(acc[j] * inv);
  }
}

}  // namespace

cudaError_t LaunchGenericAttention(const GenericAttentionParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  if (p.layout.head_dim % 2 != 0 || p.layout.head_dim > 256 || p.layout.num_kv_heads <= 0 ||
      p.num_q_heads % p.layout.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  const bool fp8 = p.kv_fp8 != nullptr;
  if (p.layout.elem_bytes != (fp8 ? 1 : 2) || (fp8 && (p.scales.k == nullptr || p.scales.v == nullptr)))
    return cudaErrorInvalidValue;
  if (fp8)
    GenericAttentionKernel<uint8_t><<<dim3(p.num_tokens, p.num_q_heads), kWarp, 0, stream>>>(p);
  else
    GenericAttentionKernel<__nv_bfloat16><<<dim3(p.num_tokens, p.num_q_heads), kWarp, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvfleet::kernels
