// The mock backend's cost model: how long one engine step takes on a real GPU.
//
//   step = a + b·(prefill tokens computed) + c·(decode sequences) + d·(KV tokens read)
//          + e·(MiB copied between the tiers)
//
// "KV tokens read" counts, for every sequence in the step, the tokens its attention
// reads from the cache: its context after the step (cached prefix + new tokens). The tier
// copies are the offloads (device to host) and onboards (host to device) the KV cache made
// since the last step: the engine issues them before the step's kernels on the same stream.
//
// Default constants: measured, not guessed. tests/bench/worker/calibrate_mock.py ran the
// forward pass of a Llama-3.1-8B-shaped model (bf16, random weights; cuBLAS GEMMs, flash
// attention for prefill, decode steps replayed as CUDA graphs) on one NVIDIA H100 80GB
// HBM3 with torch 2.11 (2026-11-21) and fitted the model to 5 prefill steps (256..4096
// tokens) and 14 decode steps (1..128 sequences × 512..4096 tokens of context):
//   a = 7290 µs    decode floor: the 16 GB of weights streamed once (1 seq × 512: 6.84 ms)
//   b = 26 µs      per prefill token (4096 tokens: 118 ms, ~550 TFLOP/s)
//   c = 11.5 µs    per decoding sequence (GEMM rows, sampling)
//   d = 0.057 µs   per KV token read: 128 KiB/token at ~2.3 TB/s
//   e = 20 µs      per MiB between the tiers: ~52 GB/s, what the cuda backend's block copies
//                  reached over PCIe 5 on an H200 (kv offload 52.5 GB/s, onboard 51.3 GB/s;
//                  tests/bench/results/2026-11-21-nvidia-h200-kernels-v7.txt)
// Measured points, for comparison: decode 64 seqs × 2048 ctx = 15.4 ms; 128 × 512 = 12.6 ms.
// A tuned engine (vLLM, SGLang) is within ~10-20% of these figures on the same GPU.
// worker/backend/mock/README.md says how to re-fit for another GPU or model.
//
// Thread safety: immutable value.
#pragma once

#include <cstdint>

#include "common/clock.h"
#include "common/status.h"

namespace kvfleet::backend::mock {

struct CostModel {
  double step_base_us = 7290.0;       // a: fixed cost of a step (weights streamed once)
  double prefill_token_us = 26.0;     // b: per prompt token computed (not served from cache)
  double decode_seq_us = 11.5;        // c: per sequence decoding one token
  double kv_token_read_us = 0.057;    // d: per KV token attention reads
  double tier_copy_us_per_mib = 20.0; // e: per MiB copied between the device and host tiers

  // A step's work, as the cost model sees it.
  struct Work {
    uint64_t prefill_tokens = 0;
    uint64_t decode_seqs = 0;
    uint64_t kv_tokens_read = 0;
    uint64_t tier_copy_bytes = 0;
  };

  // All constants must be finite and >= 0.
  Status Validate() const;

  // REQUIRES: Validate().ok(). 0 for a step with no work; a step of tier copies alone
  // takes their time, without a.
  DurationNs StepDuration(const Work& work) const;
};

}  // namespace kvfleet::backend::mock
