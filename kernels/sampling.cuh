// Sampling kernel (contract in sampling.h). One block of kThreads per sequence; every pass
// reads the logits row (from L2 after the first), so a 128K vocabulary costs ~10 row reads.
//   0. logprobs: raw max, logsumexp, then one argmax pass per top entry (only rows asking);
//   adjustments written in place;  1. max and argmax;  2. top-k: radix select of the k-th
//   largest key (4 passes of 8 bits, counts), min_p: a key threshold;  3. top-p: radix select
//   over fixed-point probability mass;  4. Gumbel-max.
#pragma once

#include "kernels/cuda_common.cuh"
#include "kernels/sampling.h"
#include "kernels/sampling_common.h"

namespace kvfleet::kernels::sample {

constexpr int kThreads = 1024;
constexpr int kHistBytes = kThreads / 32 * 256 * 8;  // per-warp radix histograms

struct ArgMax {
  float v;
  int32_t i;
};

__device__ __forceinline__ ArgMax Better(ArgMax a, ArgMax b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

__device__ ArgMax BlockArgMax(ArgMax x) {
  __shared__ float s_v[32];
  __shared__ int32_t s_i[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax y{__shfl_xor_sync(0xffffffffu, x.v, o), __shfl_xor_sync(0xffffffffu, x.i, o)};
    x = Better(x, y);
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    s_v[threadIdx.x / 32] = x.v;
    s_i[threadIdx.x / 32] = x.i;
  }
  __syncthreads();
  ArgMax r{s_v[0], s_i[0]};
  for (int w = 1; w < kThreads / 32; ++w) r = Better(r, ArgMax{s_v[w], s_i[w]});
  return r;
}

// Sum over the block: T per thread and within a warp, Acc across warps (float rows sum their
// warps in double; fixed-point probabilities stay uint64 throughout).
template <typename Acc, typename T>
__device__ Acc BlockSum(T x) {
  __shared__ Acc s[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = x;
  __syncthreads();
  Acc r = 0;
  for (int w = 0; w < kThreads / 32; ++w) r += s[w];
  return r;
}

// Log-softmax of a raw row: writes its `top` largest entries (descending, lowest index on
// ties: each pass the best entry after the previous one in Better's order) to
// top_tokens/top_logprobs and returns the row's logsumexp. Every thread calls it.
__device__ float RowLogprobs(const float* row, int32_t vocab, int32_t top, int32_t* top_tokens, float* top_logprobs) {
  ArgMax best{-INFINITY, -1};
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) best = Better(best, ArgMax{row[i], i});
  best = BlockArgMax(best);
  float local = 0.f;
  for (int32_t i = threadIdx.x; i < vocab; i += kThreads) local += expf(row[i] - best.v);
  const float lse = best.v + static_cast<float>(log(BlockSum<double>(local)));
  ArgMax prev = best;
  for (int32_t k = 0; k < top; ++k) {
    if (k > 0) {
      ArgMax next{-INFINITY, -1};
      for (int32_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float v = row[i];
        if (v < prev.v || (v == prev.v && i > prev.i)) next = Better(next, ArgMax{v, i});
      }
      prev = BlockArgMax(next);
    }
    if (threadIdx.x == 0) {
      top_tokens[k] = prev.i;
      top_logprobs[k] = prev.i >= 0 ? prev.v - lse : -INFINITY;
    }
  }
  return lse;
}

__device__ __forceinline__ uint64_t FixedProb(float logit, float max, float temperature) {
  return static_cast<uint64_t>(static_cast<double>(expf((logit - max) / temperature)) * kProbFixedScale);
}

// The key of the element where the running total over keys >= min_key, taken from the largest
// key down, first reaches target (by count when kMass is false, by probability mass if true).
// Logits cluster in a few high bytes, so each warp adds into its own histogram: contention
// stays inside a warp instead of 32 warps serialising on one shared-memory bin.
template <bool kMass>
__device__ uint32_t RadixSelect(const float* row, int32_t vocab, uint32_t min_key, uint64_t target,
                                float max_logit, float temperature) {
  // One 256-bin histogram per warp (dynamic shared memory, kHistBytes), summed after each pass.
  extern __shared__ unsigned long long warp_hist[];  // [kThreads / 32][256]
  __shared__ unsigned long long hist[256];
  __shared__ uint32_t s_sel;
  __shared__ uint64_t s_remaining;
  const int lane = threadIdx.x % 32;
  uint32_t prefix = 0, prefix_mask = 0;
  uint64_t remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    unsigned long long* my_hist = warp_hist + (threadIdx.x / 32) * 256;
    for (int b = lane; b < 256; b += 32) my_hist[b] = 0;
    __syncwarp();
    for (int32_t base = 0; base < vocab; base += kThreads) {
      const int32_t i = base + threadIdx.x;
      const float l = i < vocab ? row[i] : -INFINITY;
      const uint32_t key = FloatOrderKey(l);
      const bool take = i < vocab && key >= min_key && (key & prefix_mask) == prefix;
      if (take) {
        const uint64_t add = kMass ? FixedProb(l, max_logit, temperature) : 1ull;
        atomicAdd(&my_hist[(key >> shift) & 255u], static_cast<unsigned long long>(add));
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      unsigned long long total = 0;
      for (int w = 0; w < kThreads / 32; ++w) total += warp_hist[w * 256 + b];
      hist[b] = total;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane L owns bins 255 - 8L ... 248 - 8L (descending); scan the lanes, then the bins.
      uint64_t local[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        local[j] = hist[255 - 8 * lane - j];
        sum += local[j];
      }
      uint64_t incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      const unsigned crossed = __ballot_sync(0xffffffffu, incl >= remaining);
      const int owner = crossed ? __ffs(crossed) - 1 : 31;
      if (lane == owner) {
        uint64_t cum = incl - sum;
        uint32_t sel = 255 - 8 * lane - 7;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (cum + local[j] >= remaining) {
            sel = 255 - 8 * lane - j;
            break;
          }
          cum += local[j];
        }
        s_sel = sel;
        s_remaining = remaining - cum;
      }
    }
    __syncthreads();
    prefix |= s_sel << shift;
    prefix_mask |= 255u << shift;
    remaining = s_remaining;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) SamplingKernel(SamplingParams p) {
  const int seq = blockIdx.x;
  float* row = p.logits + static_cast<int64_t>(seq) * p.vocab;
  GridDependentsLaunch();
  GridDependencyWait();  // PDL (launch.h): the logits come from the previous kernel
  // 0. Logprobs of the raw row, then the adjustments in place (raw values kept for step 4).
  const int32_t want_lp = p.logprobs ? p.logprobs[seq] : -1;
  float lse = 0.f;
  if (want_lp >= 0) {
    lse = RowLogprobs(row, p.vocab, want_lp, p.top_tokens + static_cast<int64_t>(seq) * kMaxTopLogprobs,
                      p.top_logprobs + static_cast<int64_t>(seq) * kMaxTopLogprobs);
  }
  const int32_t a0 = p.adjust_begin ? p.adjust_begin[seq] : 0;
  const int32_t a1 = p.adjust_begin ? p.adjust_begin[seq + 1] : 0;
  if (a1 > a0) {
    __syncthreads();  // every pass of step 0 has read the raw row
    for (int32_t e = a0 + threadIdx.x; e < a1; e += kThreads) {
      const LogitAdjust a = p.adjust[e];
      const float raw = row[a.token];
      p.adjust_raw[e] = raw;
      row[a.token] = AdjustLogit(raw, a);
    }
    __syncthreads();  // the block's global writes are visible to its threads after the barrier
  }
  // 1b. Constrained decoding: disallowed tokens become -inf in place, in the argmax pass below
  // (the later passes read the masked row after its barriers).
  const uint32_t* bits = nullptr;
  if (p.allowed_rows != nullptr && p.allowed_rows[seq] != 0) {
    bits = p.allowed + static_cast<int64_t>(seq) * p.allowed_words;
    __syncthreads();  // every pass of step 0 has read the raw row
  }
  // Better() is a total order (value, then lowest index), so any visiting order gives the
  // same argmax. 16-byte loads, several in flight: a 128K-row pass is ~31 loads per thread
  // instead of ~125 dependent ones (the greedy step is this pass alone). A masked row reads
  // its 4 tokens' bits beside each load (8 neighbouring threads share a word: one broadcast
  // load per warp and 32 bytes) and writes the 16 bytes back only where a bit is clear.
  ArgMax best{-INFINITY, -1};
  if (p.vocab % 4 == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0) {
    float4* row4 = reinterpret_cast<float4*>(row);
    const int32_t n4 = p.vocab / 4;
    if (bits == nullptr) {
#pragma unroll 4
      for (int32_t j = threadIdx.x; j < n4; j += kThreads) {
        const float4 v = row4[j];
        best = Better(best, ArgMax{v.x, 4 * j});
        best = Better(best, ArgMax{v.y, 4 * j + 1});
        best = Better(best, ArgMax{v.z, 4 * j + 2});
        best = Better(best, ArgMax{v.w, 4 * j + 3});
      }
    } else {
#pragma unroll 4
      for (int32_t j = threadIdx.x; j < n4; j += kThreads) {
        float4 v = row4[j];
        const uint32_t ok = TokenAllowedBits(bits, 4 * static_cast<int64_t>(j), 4);
        if (ok != 0xFu) {
          if (!(ok & 1u)) v.x = -INFINITY;
          if (!(ok & 2u)) v.y = -INFINITY;
          if (!(ok & 4u)) v.z = -INFINITY;
          if (!(ok & 8u)) v.w = -INFINITY;
          row4[j] = v;
        }
        best = Better(best, ArgMax{v.x, 4 * j});
        best = Better(best, ArgMax{v.y, 4 * j + 1});
        best = Better(best, ArgMax{v.z, 4 * j + 2});
        best = Better(best, ArgMax{v.w, 4 * j + 3});
      }
    }
  } else {
    for (int32_t i = threadIdx.x; i < p.vocab; i += kThreads) {
      float v = row[i];
      if (bits != nullptr && !TokenAllowed(bits, i)) row[i] = v = -INFINITY;
      best = Better(best, ArgMax{v, i});
    }
  }
  best = BlockArgMax(best);  // its barriers: every masked write is visible to the passes below
  const float temperature = p.temperature[seq];
  const int32_t top_k = p.top_k[seq];
  int32_t token = best.i;
  if (!(temperature <= 0.f || top_k == 1)) {
    const float max_logit = best.v;
    uint32_t min_key = 0;
    if (top_k > 0 && top_k < p.vocab) min_key = RadixSelect<false>(row, p.vocab, 0, top_k, max_logit, temperature);
    const float min_p = p.min_p ? p.min_p[seq] : 0.f;
    if (min_p > 0.f) min_key = max(min_key, FloatOrderKey(MinPThreshold(max_logit, temperature, min_p)));
    const float top_p = p.top_p[seq];
    if (top_p < 1.f) {
      uint64_t total = 0;
      for (int32_t i = threadIdx.x; i < p.vocab; i += kThreads)
        if (FloatOrderKey(row[i]) >= min_key) total += FixedProb(row[i], max_logit, temperature);
      total = BlockSum<uint64_t>(total);
      uint64_t target = static_cast<uint64_t>(ceil(static_cast<double>(top_p) * static_cast<double>(total)));
      if (target < 1) target = 1;
      min_key = max(min_key, RadixSelect<true>(row, p.vocab, min_key, target, max_logit, temperature));
    }
    const uint64_t seed = p.seed[seq], step = p.step[seq];
    ArgMax pick{-INFINITY, -1};
    for (int32_t i = threadIdx.x; i < p.vocab; i += kThreads) {
      const float l = row[i];
      if (FloatOrderKey(l) < min_key) continue;
      const float u = SampleUniform(seed, step, static_cast<uint64_t>(i));
      pick = Better(pick, ArgMax{l / temperature - logf(-logf(u)), i});
    }
    pick = BlockArgMax(pick);
    token = pick.i;
  }
  if (threadIdx.x == 0) p.tokens[seq] = token;
  // 4. The drawn token's raw logprob: its raw logit is in adjust_raw if an adjustment named it.
  if (want_lp >= 0) {
    __shared__ float s_raw;
    if (threadIdx.x == 0) s_raw = row[token];
    __syncthreads();
    for (int32_t e = a0 + threadIdx.x; e < a1; e += kThreads) {
      if (p.adjust[e].token == token) s_raw = p.adjust_raw[e];  // tokens are distinct: one writer
    }
    __syncthreads();
    if (threadIdx.x == 0) p.token_logprob[seq] = s_raw - lse;
  }
}

__global__ void __launch_bounds__(kThreads) LogprobsKernel(LogprobsParams p) {
  const int r = blockIdx.x;
  const float* row = p.logits + static_cast<int64_t>(r) * p.vocab;
  GridDependentsLaunch();
  GridDependencyWait();
  if (p.target[r] < 0) return;  // uniform over the block
  const float lse = RowLogprobs(row, p.vocab, p.top, p.top_tokens + static_cast<int64_t>(r) * kMaxTopLogprobs,
                                p.top_logprobs + static_cast<int64_t>(r) * kMaxTopLogprobs);
  if (threadIdx.x == 0) p.token_logprob[r] = row[p.target[r]] - lse;
}

}  // namespace kvfleet::kernels::sample
