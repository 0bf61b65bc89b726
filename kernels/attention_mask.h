// Which cached tokens a query attends to: causal, plus optional sliding window, StreamingLLM
// sinks and chunked attention. Shared by the decode and prefill kernels and their CPU
// references. Plain data; functions are pure and callable from host and device.
//
// A query at absolute position q attends to key position k (k <= q) when
//   (window == 0 || k > q - window || k < sinks)  and  (chunk == 0 || k >= q - q % chunk).
// window: Mistral-style sliding window, the query itself included (HF: k > q - window).
// sinks: StreamingLLM (Xiao et al. 2023): the first `sinks` tokens stay visible; only
//        meaningful with a window.
// chunk: Llama-4-style chunked attention: a query sees only keys of its own chunk.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVF_HD __host__ __device__ __forceinline__
#else
#define KVF_HD inline
#endif

namespace kvfleet::kernels {

struct AttentionMask {
  int32_t window = 0;  // tokens, 0 = unlimited
  int32_t sinks = 0;   // tokens kept at the start when a window is set
  int32_t chunk = 0;   // tokens per attention chunk, 0 = none
};

// The first key position of the contiguous (non-sink) range that query position q sees.
KVF_HD int32_t MaskRangeStart(const AttentionMask& m, int32_t q) {
  int32_t lo = 0;
  if (m.window > 0 && q - m.window + 1 > lo) lo = q - m.window + 1;
  if (m.chunk > 0 && q - q % m.chunk > lo) lo = q - q % m.chunk;
  return lo;
}

// Number of sink positions [0, n) visible below the range start lo (chunked masks hide sinks).
KVF_HD int32_t MaskSinkCount(const AttentionMask& m, int32_t lo) {
  if (m.window <= 0 || m.chunk > 0) return 0;
  return m.sinks < lo ? m.sinks : lo;
}

// True when query position q attends to key position k.
KVF_HD bool MaskAttends(const AttentionMask& m, int32_t q, int32_t k) {
  if (k > q || k < 0) return false;
  bool in_window = m.window == 0 || k > q - m.window || (m.chunk == 0 && k < m.sinks);
  bool in_chunk = m.chunk == 0 || k >= q - q % m.chunk;
  return in_window && in_chunk;
}

}  // namespace kvfleet::kernels
