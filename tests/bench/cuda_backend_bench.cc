// cuda backend end-to-end figures on one GPU, for a model directory (e.g. a
// llama-3.1-8b-shaped random model from `kvfleet make-model --shape llama-3.1-8b`):
//
//   cuda_backend_bench --model DIR [--steps N] [--set KEY=VALUE]... [--only-batch1]
//                      [--kv-cache-dtype auto|bf16|fp8] [--decode-ctx N] [--batches B[,B...]]
//                      [--loras K1,K2,... [--lora-rank R] [--lora-ablation]] [--tensor-parallel N]
//                      [--masked]
//
//   --set KEY=VALUE     a BackendOptions::extra setting (e.g. gemv_max_rows=0, cuda_graphs=0),
//                       to measure one change against the default in the same run
//   --only-batch1       only the batch-1 decode (no large batches, no prefill)
//   --masked            each decode also with every sequence constrained (a token bitmask
//                       allowing every other token: its copy after the logits are queued,
//                       upload and the sampling kernel's masking; then one allowing every
//                       token: the same without masked writes), and the difference in step time
//   --kv-cache-dtype    the KV cache's element type (fp8: e4m3, half the KV bytes per token)
//   --decode-ctx N      context of the large-batch decodes (default 2048; 8192 for b64@8K)
//   --batches B,...     their batch sizes (default 32,64,128)
//   --loras K1,K2,...   instead of the figures below: decode at batch 64 @2K (and the 8K
//                       prefill) with K distinct random adapters of rank R (--lora-rank,
//                       default 16) over the seven targets, sequences assigned to them
//                       round-robin, side by side for each K (K = 0: the base model on the
//                       same backend)
//   --tensor-parallel N the model over N ranks (cuda_backend.h invariant 8): on GPUs 0..N-1
//                       over NCCL, or as --set tp_devices=0,0 places them (one GPU: the
//                       same-device communicator, for trying it out); bandwidth is then the
//                       fraction of the GPUs' combined copy bandwidth. After each decode
//                       figure: the all-reduce and gather time per step (rank 0's CUDA events
//                       around each collective, eager steps) and the step without its
//                       collectives (wrong tokens, the same work otherwise)
//   --lora-ablation     with --loras (include 0): where a LoRA step's time goes, for each K
//                       and the prefill: the base model without graphs (what losing the
//                       graph costs), the LoRA step with every shrink/expand launch skipped
//                       (its unfused path and row grouping), the full LoRA step without graphs,
//                       and the full step eagerly with each shrink and expand timed by CUDA
//                       events (ms per step, by target group)
//
//   copy bandwidth      cudaMemcpy device→device of 1 GiB (read + write bytes / time): the
//                       ceiling for memory-bound decode
//   cuBLASLt peak       one bf16 GEMM 8192³ through the backend's own LtGemm
//   decode b=1 @1K      step time (Execute wall time, host work and sync included) and
//                       achieved bandwidth = (weights read + KV read) / step time
//   decode b=32/64/128 @2K   step time and generated tokens/s
//   prefill 8K in 2K chunks  TFLOP/s (matmul + causal attention FLOPs) vs the GEMM peak
//
// Decode steps run at their context length without prefilling it first: the cache holds
// zeros, which costs the same to read as real K/V (timing depends only on lengths).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "worker/backend/backend.h"
#include "worker/model/lora_adapter.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/lt_gemm.h"

using namespace kvfleet;
using WallClock = std::chrono::steady_clock;

namespace {

double Since(WallClock::time_point t0) { return std::chrono::duration<double>(WallClock::now() - t0).count(); }

#define BENCH_CUDA(call)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

double CopyBandwidthGBs() {
  const size_t bytes = 1ull << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CUDA(cudaMalloc(&a, bytes));
  BENCH_CUDA(cudaMalloc(&b, bytes));
  BENCH_CUDA(cudaMemset(a, 1, bytes));
  BENCH_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  BENCH_CUDA(cudaDeviceSynchronize());
  const int iters = 10;
  auto t0 = WallClock::now();
  for (int i = 0; i < iters; ++i) BENCH_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  BENCH_CUDA(cudaDeviceSynchronize());
  const double s = Since(t0);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) * iters / s * 1e-9;
}

double GemmPeakTflops() {
  const int64_t n = 8192;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&a), n * n * 2));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&b), n * n * 2));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&c), n * n * 2));
  BENCH_CUDA(cudaMemset(a, 0x3c, n * n * 2));  // bf16 ~0.0115: finite products
  BENCH_CUDA(cudaMemset(b, 0x3c, n * n * 2));
  auto g = backend::cuda::LtGemm::Make();
  if (!g.ok()) {
    std::fprintf(stderr, "LtGemm: %s\n", g.status().ToString().c_str());
    std::exit(1);
  }
  auto& gemm = *g.value();
  auto run = [&] {
    Status st = gemm.Run(a, b, nullptr, c, backend::cuda::LtGemm::Out::kBf16, n, n, n, nullptr);
    if (!st.ok()) std::exit(1);
  };
  run();
  BENCH_CUDA(cudaDeviceSynchronize());
  const int iters = 20;
  auto t0 = WallClock::now();
  for (int i = 0; i < iters; ++i) run();
  BENCH_CUDA(cudaDeviceSynchronize());
  const double s = Since(t0);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * n * iters / s * 1e-12;
}

// The prefill figures' prompt: kPrefillTokens tokens, one sequence on blocks 0.., run in
// kPrefillChunk-token steps.
constexpr int kPrefillTokens = 8192, kPrefillChunk = 2048;

std::vector<TokenId> PrefillPrompt() {
  std::vector<TokenId> prompt(kPrefillTokens);
  for (int i = 0; i < kPrefillTokens; ++i) prompt[i] = static_cast<TokenId>((i * 7919) % 100000 + 100);
  return prompt;
}

// One prefill of `prompt` (LoRA slot `slot`, -1: none); its seconds, or a negative value after
// printing the error.
double RunPrefill(backend::ModelBackend& b, std::span<const TokenId> prompt, int32_t slot) {
  std::vector<backend::BlockId> table;
  for (int64_t i = 0; i < static_cast<int64_t>(prompt.size()) / b.block_size(); ++i) {
    table.push_back(static_cast<backend::BlockId>(i));
  }
  const auto t = WallClock::now();
  for (size_t pos = 0; pos < prompt.size(); pos += kPrefillChunk) {
    backend::StepBatch step;
    backend::SequenceStep q;
    q.tokens = prompt.subspan(pos, std::min<size_t>(kPrefillChunk, prompt.size() - pos));
    q.start_position = static_cast<int64_t>(pos);
    q.block_tables = {table};
    q.sample = pos + kPrefillChunk >= prompt.size();
    q.lora_slot = slot;
    step.seqs = {q};
    backend::StepOutput out;
    Status st = b.Execute(step, &out);
    if (!st.ok()) {
      std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
      return -1;
    }
  }
  return Since(t);
}

struct Decode {
  double step_s;  // per step
  double tokens_per_s;
};

// `batch` sequences decoding from position ctx - 1 for `steps` timed steps (3 warm-up).
// Sequence s uses LoRA slot s % loras (loras == 0: none).
// A nonzero `allowed_bits` constrains every sequence with that word repeated as its bitmask.
Decode RunDecode(backend::ModelBackend& b, int batch, int ctx, int steps, int loras = 0, uint32_t allowed_bits = 0) {
  const std::vector<uint32_t> allowed(allowed_bits != 0 ? (b.config().vocab_size + 31) / 32 : 0, allowed_bits);
  const int B = b.block_size();
  const int total = 3 + steps;
  const int nblocks = (ctx + total + B - 1) / B;
  std::vector<std::vector<backend::BlockId>> tables(batch);
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < nblocks; ++i) tables[s].push_back(static_cast<backend::BlockId>(s * nblocks + i));
  }
  // Distinct first tokens: identical rows would route every sequence of an MoE model to the
  // same k experts.
  std::vector<TokenId> tok(batch);
  for (int s = 0; s < batch; ++s) tok[s] = static_cast<TokenId>(1000 + 37 * s);
  backend::StepBatch step;
  step.seqs.resize(batch);
  backend::StepOutput out;
  WallClock::time_point t0;
  for (int i = 0; i < total; ++i) {
    if (i == 3) t0 = WallClock::now();
    for (int s = 0; s < batch; ++s) {
      auto& q = step.seqs[s];
      q.request_id = s;
      q.tokens = std::span<const TokenId>(&tok[s], 1);
      q.start_position = ctx - 1 + i;
      q.block_tables = {tables[s]};
      q.sample = true;
      q.lora_slot = loras > 0 ? s % loras : -1;
      q.token_bitmask = allowed;
    }
    Status st = b.Execute(step, &out);
    if (!st.ok()) {
      std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    for (int s = 0; s < batch; ++s) tok[s] = out.tokens[s];
  }
  const double s = Since(t0);
  return {s / steps, static_cast<double>(batch) * steps / s};
}

// --masked: the same decode with every sequence constrained, beside the step time just measured.
void MaskedComparison(backend::ModelBackend& b, int batch, int ctx, int steps, double step_s) {
  const Decode m = RunDecode(b, batch, ctx, steps, 0, 0x55555555u);
  std::printf("  constrained (a bitmask per sequence): %.3f ms/step, %+.1f%% against unconstrained\n", m.step_s * 1e3,
              100.0 * (m.step_s / step_s - 1.0));
  // Every token allowed: the split graph, the masks' copy and upload and the kernel's bit
  // reads, but no masked writes (what remains is the masking itself).
  const Decode all = RunDecode(b, batch, ctx, steps, 0, 0xFFFFFFFFu);
  std::printf("  constrained, every token allowed: %.3f ms/step, %+.1f%%\n", all.step_s * 1e3,
              100.0 * (all.step_s / step_s - 1.0));
}

// --tensor-parallel: where the collectives' time goes in the decode just measured (step_s).
void TensorParallelBreakdown(backend::ModelBackend& b, int batch, int ctx, int steps, double step_s) {
  auto* cuda = dynamic_cast<backend::cuda::CudaBackend*>(&b);
  if (cuda == nullptr || cuda->tensor_parallel() <= 1) return;
  backend::cuda::CudaBackend::CommDebug d;
  d.time_collectives = true;
  cuda->set_comm_debug(d);
  (void)cuda->TakeCommTimes();
  const Decode timed = RunDecode(b, batch, ctx, steps);
  auto t = cuda->TakeCommTimes();
  if (!t.ok()) {
    std::fprintf(stderr, "TakeCommTimes: %s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  const double n = 3.0 + steps;  // RunDecode's warm-up steps are timed too
  std::printf("  tp %d (%s): all-reduce %.3f ms/step (%.1f per step), logits gather %.3f ms/step; eager step %.3f ms\n",
              cuda->tensor_parallel(), cuda->comm_kind(), t->all_reduce_ms / n, t->all_reduces / n, t->gather_ms / n,
              timed.step_s * 1e3);
  // Eager steps on both sides: a step without its collectives never runs from the graphs,
  // which hold them.
  d = {};
  d.run_collectives = false;
  cuda->set_comm_debug(d);
  const Decode bare = RunDecode(b, batch, ctx, steps);
  cuda->set_comm_debug({});
  std::printf("  ablation: eager step without the collectives %.3f ms (with them, timed: %.3f ms; the collectives cost "
              "at most %.3f ms, %.1f%% of the graphed step)\n",
              bare.step_s * 1e3, timed.step_s * 1e3, (timed.step_s - bare.step_s) * 1e3,
              100.0 * (timed.step_s - bare.step_s) / step_s);
}

// A random adapter of `rank` over the seven targets (B nonzero, unlike PEFT's initial one):
// its cost, not its values, is measured. splitmix64 keeps 8 adapters of the 8B shape quick.
model::LoraAdapter RandomAdapter(const model::ModelConfig& c, int32_t rank, uint64_t seed) {
  const int32_t H = static_cast<int32_t>(c.hidden_size), I = static_cast<int32_t>(c.intermediate_size);
  const int32_t Q = static_cast<int32_t>(c.q_size()), KV = static_cast<int32_t>(c.kv_size());
  const model::LoraDims dims[model::kNumLoraTargets] = {{H, Q}, {H, KV}, {H, KV}, {Q, H}, {H, I}, {H, I}, {I, H}};
  model::LoraAdapter a;
  a.name = "bench-" + std::to_string(seed);
  a.rank = rank;
  a.scaling = 2.0f;
  uint64_t x = seed * 0x9e3779b97f4a7c15ull;
  auto next = [&x] {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<float>((z ^ (z >> 31)) >> 40) / static_cast<float>(1 << 24) * 0.02f - 0.01f;
  };
  a.layers.resize(static_cast<size_t>(c.num_layers));
  for (auto& layer : a.layers) {
    for (int t = 0; t < model::kNumLoraTargets; ++t) {
      layer[t].a.resize(static_cast<size_t>(rank) * dims[t].in);
      layer[t].b.resize(static_cast<size_t>(dims[t].out) * rank);
      for (float& v : layer[t].a) v = next();
      for (float& v : layer[t].b) v = next();
    }
  }
  return a;
}

// --lora-ablation: the LoRA kernels' event times since the last call, per step, by group.
void PrintLoraKernelTimes(backend::cuda::CudaBackend& cb, int steps) {
  auto t = cb.TakeLoraKernelTimes();
  if (!t.ok()) {
    std::fprintf(stderr, "TakeLoraKernelTimes: %s\n", t.status().ToString().c_str());
    std::exit(1);
  }
  static const char* kGroups[] = {"qkv", "o", "gate_up", "down"};
  double total = 0;
  std::printf("    LoRA kernels per step (CUDA events, %lld pairs):", static_cast<long long>(t->launches));
  for (int g = 0; g < 4; ++g) {
    std::printf(" %s shrink %.3f expand %.3f ms;", kGroups[g], t->shrink_ms[g] / steps, t->expand_ms[g] / steps);
    total += (t->shrink_ms[g] + t->expand_ms[g]) / steps;
  }
  std::printf(" total %.3f ms\n", total);
}

// --loras: decode at batch 64 @2K and the 8K prefill for each adapter count, side by side.
int RunLoraComparison(backend::ModelBackend& b, const std::vector<int>& counts, int rank, int steps, bool ablation) {
  auto* cb = dynamic_cast<backend::cuda::CudaBackend*>(&b);
  if (ablation && cb == nullptr) {
    std::fprintf(stderr, "--lora-ablation: needs the cuda backend\n");
    return 1;
  }
  int most = 0;
  for (int k : counts) most = std::max(most, k);
  auto t0 = WallClock::now();
  for (int k = 0; k < most; ++k) {
    Status st = b.LoadLora(k, RandomAdapter(b.config(), rank, static_cast<uint64_t>(k) + 1));
    if (!st.ok()) {
      std::fprintf(stderr, "LoadLora: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::printf("%d adapters of rank %d loaded in %.2f s\n", most, rank, Since(t0));
  const int batch = 64, ctx = 2048;
  double base = 0;
  for (int k : counts) {
    Decode d = RunDecode(b, batch, ctx, steps, k);
    if (k == 0) base = d.step_s;
    std::printf("decode batch %d @ %d context, %d LoRA adapters of rank %d: %.3f ms/step, %.0f tokens/s", batch, ctx,
                k, rank, d.step_s * 1e3, d.tokens_per_s);
    if (k > 0 && base > 0) std::printf(" (%+.1f%% over no adapter)", 100.0 * (d.step_s / base - 1));
    std::printf("\n");
    if (!ablation) continue;
    auto rel = [&](double t) { return base > 0 ? 100.0 * (t / base - 1) : 0.0; };
    if (k == 0) {
      cb->set_use_graphs(false);
      const Decode e = RunDecode(b, batch, ctx, steps, 0);
      cb->set_use_graphs(true);
      std::printf("  ablation: no adapter, eager (no CUDA graph): %.3f ms/step (%+.1f%%)\n", e.step_s * 1e3,
                  rel(e.step_s));
      continue;
    }
    cb->set_lora_debug({.launch_kernels = false, .time_kernels = false});
    const Decode nk = RunDecode(b, batch, ctx, steps, k);
    std::printf("  ablation: %d adapters, LoRA path without the shrink/expand launches: %.3f ms/step (%+.1f%%)\n", k,
                nk.step_s * 1e3, rel(nk.step_s));
    cb->set_lora_debug({.launch_expand = false});
    const Decode ns = RunDecode(b, batch, ctx, steps, k);
    std::printf("  ablation: %d adapters, shrinks only (no expand): %.3f ms/step (%+.1f%%)\n", k, ns.step_s * 1e3,
                rel(ns.step_s));
    cb->set_lora_debug({.launch_shrink = false});
    const Decode ne = RunDecode(b, batch, ctx, steps, k);
    std::printf("  ablation: %d adapters, expands only (no shrink): %.3f ms/step (%+.1f%%)\n", k, ne.step_s * 1e3,
                rel(ne.step_s));
    cb->set_lora_debug({});
    cb->set_use_graphs(false);
    const Decode eg = RunDecode(b, batch, ctx, steps, k);
    cb->set_use_graphs(true);
    std::printf("  ablation: %d adapters, full LoRA step, eager (no CUDA graph): %.3f ms/step (%+.1f%%)\n", k,
                eg.step_s * 1e3, rel(eg.step_s));
    cb->set_lora_debug({.launch_kernels = true, .time_kernels = true});
    (void)cb->TakeLoraKernelTimes();
    const Decode tk = RunDecode(b, batch, ctx, steps, k);
    std::printf("  ablation: %d adapters, kernels timed: %.3f ms/step\n", k, tk.step_s * 1e3);
    PrintLoraKernelTimes(*cb, steps + 3);  // RunDecode's warm-up steps are timed too
    cb->set_lora_debug({});
  }
  const int total = kPrefillTokens, chunk = kPrefillChunk;
  const std::vector<TokenId> prompt = PrefillPrompt();
  // Prefill variants: 0 no adapter, 1 one adapter; with --lora-ablation also 2 one adapter
  // without the shrink/expand launches, 3 one adapter with the kernels timed.
  for (int variant = 0; variant < (ablation ? 4 : 2); ++variant) {
    const int slot = variant == 0 ? -1 : 0;
    if (slot >= most) continue;
    if (ablation) cb->set_lora_debug({.launch_kernels = variant != 2, .time_kernels = variant == 3});
    if (variant == 3) (void)cb->TakeLoraKernelTimes();
    double best = 1e30;
    const int reps = variant == 3 ? 1 : 2;
    for (int rep = 0; rep < reps; ++rep) {
      const double t = RunPrefill(b, prompt, slot);
      if (t < 0) return 1;
      best = std::min(best, t);
    }
    static const char* kVariants[] = {"no adapter", "one adapter", "one adapter, no shrink/expand launches",
                                      "one adapter, kernels timed"};
    std::printf("prefill %d tokens in %d-token chunks, %s: %.1f ms\n", total, chunk, kVariants[variant], best * 1e3);
    if (variant == 3) PrintLoraKernelTimes(*cb, total / chunk);  // per 2048-token chunk
  }
  if (ablation) cb->set_lora_debug({});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: cuda_backend_bench --model DIR [--steps N] [--set KEY=VALUE]... [--only-batch1] "
      "[--kv-cache-dtype auto|bf16|fp8] [--decode-ctx N] [--batches B[,B...]] [--loras K1,K2,... [--lora-rank R] [--lora-ablation]] "
      "[--tensor-parallel N] [--masked]\n";
  int tensor_parallel = 1;
  std::vector<int> lora_counts;
  int lora_rank = 16;
  bool lora_ablation = false;
  std::string model;
  int steps = 20;
  bool only_batch1 = false;
  bool masked = false;  // --masked
  int decode_ctx = 2048;
  std::vector<int> batches = {32, 64, 128};
  backend::KvCacheDtype kv_dtype = backend::KvCacheDtype::kAuto;
  std::map<std::string, std::string> extra;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) {
      model = argv[++i];
    } else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc && std::strchr(argv[i + 1], '=') != nullptr) {
      const std::string kv = argv[++i];
      extra[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    } else if (!std::strcmp(argv[i], "--tensor-parallel") && i + 1 < argc) {
      tensor_parallel = std::atoi(argv[++i]);
      if (tensor_parallel != 1 && tensor_parallel != 2 && tensor_parallel != 4 && tensor_parallel != 8) {
        std::fprintf(stderr, "--tensor-parallel: 1, 2, 4 or 8, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--only-batch1")) {
      only_batch1 = true;
    } else if (!std::strcmp(argv[i], "--loras") && i + 1 < argc) {
      for (const char* p = argv[++i]; *p != 0;) {
        char* end = nullptr;
        const long k = std::strtol(p, &end, 10);
        if (end == p || k < 0 || k > 64 || (*end != ',' && *end != 0)) {
          std::fprintf(stderr, "--loras: a comma-separated list of adapter counts in [0, 64], got '%s'\n", argv[i]);
          return 2;
        }
        lora_counts.push_back(static_cast<int>(k));
        p = *end == ',' ? end + 1 : end;
      }
    } else if (!std::strcmp(argv[i], "--masked")) {
      masked = true;
    } else if (!std::strcmp(argv[i], "--lora-ablation")) {
      lora_ablation = true;
    } else if (!std::strcmp(argv[i], "--lora-rank") && i + 1 < argc) {
      lora_rank = std::atoi(argv[++i]);
      if (lora_rank < 1 || lora_rank > model::kMaxLoraRank) {
        std::fprintf(stderr, "--lora-rank: an integer in [1, %d], got '%s'\n", model::kMaxLoraRank, argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--kv-cache-dtype") && i + 1 < argc) {
      auto d = backend::ParseKvCacheDtype(argv[++i]);
      if (!d.ok()) {
        std::fprintf(stderr, "%s\n", d.status().message().c_str());
        return 2;
      }
      kv_dtype = *d;
    } else if (!std::strcmp(argv[i], "--decode-ctx") && i + 1 < argc) {
      decode_ctx = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--batches") && i + 1 < argc) {
      batches.clear();
      for (char* t = std::strtok(argv[++i], ","); t != nullptr; t = std::strtok(nullptr, ",")) batches.push_back(std::atoi(t));
    } else {
      std::fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  if (lora_ablation && lora_counts.empty()) {
    std::fprintf(stderr, "--lora-ablation: needs --loras (e.g. --loras 0,1,8)\n");
    return 2;
  }
  if (model.empty() || decode_ctx < 1 || batches.empty() ||
      std::any_of(batches.begin(), batches.end(), [](int b) { return b < 1 || b > 128; })) {
    std::fprintf(stderr, "%s", usage);
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const double peak = GemmPeakTflops();
  std::printf("cuBLASLt bf16 GEMM 8192^3: %.1f TFLOP/s\n", peak);

  backend::BackendOptions o;
  o.model_dir = model;
  o.block_size = 32;
  o.max_num_tokens = 8192;
  o.max_batch_size = 128;
  o.max_context = std::max(8192, decode_ctx + steps + 8);
  o.kv_memory_fraction = 0.85;
  o.kv_cache_dtype = kv_dtype;
  std::printf("KV cache dtype: %s\n", std::string(backend::KvCacheDtypeName(kv_dtype)).c_str());
  o.extra = extra;
  o.tensor_parallel = tensor_parallel;
  // GPUs the ranks run on: N, unless tp_devices puts them together.
  int gpus = tensor_parallel;
  if (auto d = extra.find("tp_devices"); d != extra.end()) {
    std::vector<std::string> devs;
    for (size_t at = 0; at <= d->second.size();) {
      const size_t next = d->second.find(',', at);
      devs.push_back(d->second.substr(at, next == std::string::npos ? std::string::npos : next - at));
      at = next == std::string::npos ? d->second.size() + 1 : next + 1;
    }
    std::sort(devs.begin(), devs.end());
    gpus = static_cast<int>(std::unique(devs.begin(), devs.end()) - devs.begin());
  }
  if (tensor_parallel > 1) std::printf("tensor parallel %d on %d GPU%s\n", tensor_parallel, gpus, gpus == 1 ? "" : "s");
  for (int k : lora_counts) o.max_loras = std::max(o.max_loras, k);
  o.max_lora_rank = lora_rank;
  for (const auto& [k, v] : extra) std::printf("backend setting %s=%s\n", k.c_str(), v.c_str());
  auto t0 = WallClock::now();
  auto made = backend::CreateBackend("cuda", o);
  if (!made.ok()) {
    std::fprintf(stderr, "backend: %s\n", made.status().ToString().c_str());
    return 1;
  }
  auto& b = *made.value();
  std::printf("backend ready in %.1f s\n", Since(t0));
  const double copy = CopyBandwidthGBs() * gpus;  // combined over the ranks' GPUs
  std::printf("copy bandwidth (D2D, read+write): %.0f GB/s%s\n", copy, gpus > 1 ? " (GPU 0's, times the GPUs)" : "");

  const auto& c = b.config();
  const double L = static_cast<double>(c.num_layers), H = static_cast<double>(c.hidden_size);
  // The projections' parameters a step of `rows` token rows reads: attention, every dense MLP,
  // the LM head, and in MoE layers the router, the shared expert and the experts some row
  // chose: E·(1 − (1 − k/E)^rows) of them in expectation under uniform routing (random
  // weights route near-uniformly; kvfleet_moe_bench counts the real ones). rows = 0: the
  // parameters one token passes through (k experts a layer), for FLOPs.
  auto step_params = [&](double rows) {
    double p = L * (H * (c.q_size() + 2 * c.kv_size()) + c.q_size() * H) + static_cast<double>(c.vocab_size) * H;
    const model::MoeConfig& moe = c.moe;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (!c.sparse_layer(l)) {
        p += 3 * H * static_cast<double>(c.intermediate_size);
        continue;
      }
      const double E = static_cast<double>(moe.num_experts), k = static_cast<double>(moe.experts_per_token);
      const double used = rows > 0 ? E * (1 - std::pow(1 - k / E, rows)) : k;
      p += (used * static_cast<double>(moe.expert_intermediate) + static_cast<double>(moe.shared_expert_intermediate)) *
               3 * H + (rows > 0 ? E * H : 0);
    }
    return p;
  };
  const double matmul_params = step_params(1), token_params = step_params(0);
  const double kv_elem_bytes = kv_dtype == backend::KvCacheDtype::kFp8E4m3 ? 1 : 2;
  const double kv_bytes_per_token = L * 2 * c.num_kv_heads * c.head_dim * kv_elem_bytes;
  std::printf("model: %lld layers, hidden %lld, %.2f B matmul params (%.2f GB bf16 read per batch-1 step), KV %.0f KiB/token\n",
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size), matmul_params * 1e-9,
              matmul_params * 2e-9, kv_bytes_per_token / 1024);

  {
    const int ctx = 1024;
    Decode d = RunDecode(b, 1, ctx, steps);
    const double bytes = matmul_params * 2 + kv_bytes_per_token * (ctx + 3 + steps / 2.0);
    std::printf("decode batch 1 @ %d context: %.3f ms/step, %.1f tokens/s, %.0f GB/s weights+KV = %.1f%% of copy\n", ctx,
                d.step_s * 1e3, d.tokens_per_s, bytes / d.step_s * 1e-9, 100.0 * bytes / d.step_s * 1e-9 / copy);
    TensorParallelBreakdown(b, 1, ctx, steps, d.step_s);
    if (masked) MaskedComparison(b, 1, ctx, steps, d.step_s);
  }
  if (!lora_counts.empty()) return RunLoraComparison(b, lora_counts, lora_rank, steps, lora_ablation);
  if (only_batch1) return 0;
  for (int batch : batches) {
    const int ctx = decode_ctx;
    const int64_t need = static_cast<int64_t>(batch) * ((ctx + steps + 3 + 31) / 32);
    if (need > b.pools()[0].device_blocks) {
      std::printf("decode batch %d @ %d: skipped, needs %lld blocks, the cache has %lld\n", batch, ctx,
                  static_cast<long long>(need), static_cast<long long>(b.pools()[0].device_blocks));
      continue;
    }
    Decode d = RunDecode(b, batch, ctx, steps);
    const double bytes = step_params(batch) * 2 + kv_bytes_per_token * batch * (ctx + 3 + steps / 2.0);
    std::printf("decode batch %d @ %d context: %.3f ms/step, %.0f tokens/s, %.0f GB/s weights+KV = %.1f%% of copy\n",
                batch, ctx, d.step_s * 1e3, d.tokens_per_s, bytes / d.step_s * 1e-9,
                100.0 * bytes / d.step_s * 1e-9 / copy);
    TensorParallelBreakdown(b, batch, ctx, steps, d.step_s);
    if (masked) MaskedComparison(b, batch, ctx, steps, d.step_s);
  }
  {
    const int total = kPrefillTokens, chunk = kPrefillChunk;
    const std::vector<TokenId> prompt = PrefillPrompt();
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {  // the first run plans the GEMM shapes
      const double t = RunPrefill(b, prompt, -1);
      if (t < 0) return 1;
      best = std::min(best, t);
    }
    // Matmul FLOPs: every token through every projection (LM head only for the sampled
    // rows: one per chunk's last step, negligible). Attention: QK^T and PV over the
    // causal triangle.
    const double flops = 2.0 * (token_params - static_cast<double>(c.vocab_size) * H) * total +
                         4.0 * L * c.num_heads * c.head_dim * (static_cast<double>(total) * total / 2.0);
    // Against the combined peak of the ranks' GPUs, as the copy bandwidth above.
    std::printf("prefill %d tokens in %d-token chunks: %.1f ms, %.0f tokens/s, %.1f TFLOP/s = %.1f%% of the GEMM peak%s\n",
                total, chunk, best * 1e3, total / best, flops / best * 1e-12,
                100.0 * flops / best * 1e-12 / (peak * gpus), gpus > 1 ? " (GPU 0's, times the GPUs)" : "");
  }
  return 0;
}
