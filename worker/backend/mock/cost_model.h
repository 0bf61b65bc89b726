// The mock backend's cost model: how long one engine step takes on a real GPU.
//
//   step = a + b·(prefill tokens computed) + c·(decode sequences) + d·(KV tokens read)
//
// "KV tokens read" counts, for every sequence in the step, the tokens its attention
// reads from the cache: its context after the step (cached prefix + new tokens).
//
// Default constants: Llama-3.1-8B, bf16, one H100 80GB SXM (3.35 TB/s HBM3, 989 TFLOP/s
// dense bf16), as an optimized engine (vLLM 0.6 / SGLang, CUDA graphs) runs it:
//   a = 6.5 ms   a decode step of one short sequence streams the 16 GB of weights:
//                16.06e9 B / 3.35e12 B/s = 4.8 ms at peak; measured ITL at batch 1 is
//                6-7 ms (vLLM and SGLang published H100 benchmarks, 2024).
//   b = 55 µs    per prefill token: 2·8.03e9 FLOP/token = 16 GFLOP; at the ~300 TFLOP/s
//                8B prefill reaches this is 54 µs (about 18k prompt tokens/s per GPU, the
//                figure vLLM's and SGLang's offline prefill benchmarks report).
//   c = 40 µs    per decode sequence: sampling, the per-sequence attention launch share
//                and the growing GEMM M dimension; fitted so that batch 64 at short
//                context takes ~9 ms/step (≈7k tokens/s), as published.
//   d = 0.05 µs  per KV token read: 128 KiB/token (32 layers × 8 KV heads × 128 dims ×
//                K,V × 2 bytes) at ~2.6 TB/s achieved = 50 ns.
// tests/bench/mock_cost_model.md records the derivation and how to re-fit on a GPU.
//
// Thread safety: immutable value.
#pragma once

#include <cstdint>

#include "common/clock.h"
#include "common/status.h"

namespace kvfleet::backend::mock {

struct CostModel {
  double step_base_us = 6500.0;       // a: fixed cost of a step (weights streamed once)
  double prefill_token_us = 55.0;     // b: per prompt token computed (not served from cache)
  double decode_seq_us = 40.0;        // c: per sequence decoding one token
  double kv_token_read_us = 0.05;     // d: per KV token attention reads

  // A step's work, as the cost model sees it.
  struct Work {
    uint64_t prefill_tokens = 0;
    uint64_t decode_seqs = 0;
    uint64_t kv_tokens_read = 0;
  };

  // All constants must be finite and >= 0.
  Status Validate() const;

  // REQUIRES: Validate().ok(). 0 for a step with no work.
  DurationNs StepDuration(const Work& work) const;
};

}  // namespace kvfleet::backend::mock
