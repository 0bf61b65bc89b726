// The MoE block's kernels (kernels/moe.h) at real shapes: routing, grouping, the two grouped
// GEMMs with SiLU-mul between and the combine (for Llama 4: sigmoid routing, the scaled gather
// and the combine onto the shared expert's output), timed together (CUDA events, launches back to
// back as in a decode graph, median of rounds). Each case prints the expert weights it reads
// per second (the decode cases are memory-bound: every expert some token chose is read once)
// next to the device's copy bandwidth, and its TFLOP/s (the prefill cases are compute-bound;
// kvfleet_kernels_bench's cuBLASLt line is the device's bf16 GEMM rate).
//
//   kvfleet_moe_bench [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/moe.h"
#include "kernels/small_kernels.h"
#include "worker/backend/cuda/moe_blas.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

// Median milliseconds of one call: 9 rounds of 5 calls after 2 (gpu_test_util.h).
double TimeMs(const std::function<void()>& fn, int reps = 9, int per_round = 5) {
  return gputest::MedianCallMs(fn, reps, /*warmup=*/2, per_round);
}

void FillRandom(DeviceBuffer<uint16_t>& buf, uint32_t seed, float range) {
  std::mt19937 rng(seed);
  const size_t chunk = 1 << 22;
  std::vector<uint16_t> host(std::min(chunk, buf.size()));
  for (auto& x : host) x = FloatToBf16(std::uniform_real_distribution<float>(-range, range)(rng));
  for (size_t off = 0; off < buf.size(); off += chunk) {
    KVF_CUDA_OK(cudaMemcpy(buf.get() + off, host.data(), std::min(chunk, buf.size() - off) * 2, cudaMemcpyHostToDevice));
  }
}

struct Shape {
  const char* name;
  int E, k, H, I;
  bool sigmoid = false;  // Llama 4: sigmoid routing over fp32 logits, inputs scaled, the combine
                         // adding the shared expert's output (its own gemv is not timed here)
};

// kGemm: the tensor-core grouped GEMMs; kGemv: the decode path (LaunchMoeGroupedGemv with
// SiLU-mul fused, then down); kBlas: the prefill products through cuBLAS's grouped GEMM
// (worker/backend/cuda/moe_blas.h: a gather, and one stream synchronisation a call).
enum class Path { kGemm, kGemv, kBlas };

void Bench(const Shape& s, int T, double copy_gbs, Path path, backend::cuda::MoeBlas* blas) {
  const bool gemv = path == Path::kGemv;
  const int S = T * s.k, ld = (s.E + 7) / 8 * 8;
  // kRoutings router outputs, one per call in turn: consecutive calls choose other experts, so
  // the weights come from DRAM as in a model's next layer, not from L2 (50 MB holds a T = 1
  // call's 8 qwen3 experts, 75 MB, in good part).
  constexpr int kRoutings = 16;
  int call = 0;
  DeviceBuffer<uint16_t> logits(size_t(kRoutings) * T * ld), x(size_t(T) * s.H), gate_up(size_t(s.E) * 2 * s.I * s.H),
      down(size_t(s.E) * s.H * s.I), gu(size_t(S) * 2 * s.I), act(size_t(S) * s.I), y(size_t(S) * s.H),
      out(size_t(T) * s.H), xs(s.sigmoid || path == Path::kBlas ? size_t(S) * s.H : 1),
      shared(s.sigmoid ? size_t(T) * s.H : 1);
  FillRandom(logits, 1, 3.f);
  FillRandom(x, 2, 1.f);
  FillRandom(gate_up, 3, 0.05f);
  FillRandom(down, 4, 0.05f);
  FillRandom(shared, 5, 1.f);
  DeviceBuffer<float> flogits(s.sigmoid ? size_t(kRoutings) * T * ld : 1);
  if (s.sigmoid) {
    std::vector<float> host(flogits.size());
    std::mt19937 rng(6);
    for (float& v : host) v = std::uniform_real_distribution<float>(-3.f, 3.f)(rng);
    KVF_CUDA_OK(cudaMemcpy(flogits.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  DeviceBuffer<int32_t> experts(S), sorted(S), position(S), offsets(s.E + 1), tiles(s.E + 1), active(s.E + 1);
  DeviceBuffer<float> weights(S);
  // One MoE block; `mark(i)` before part i (and after the last) when timing the parts.
  auto block = [&](const std::function<void(int)>& mark) {
    const size_t routing = size_t(call++ % kRoutings) * T * ld;
    mark(0);
    if (s.sigmoid) {
      KVF_CUDA_OK(LaunchMoeRouteSigmoid(flogits.get() + routing, ld, T, s.E, s.k, experts.get(), weights.get(), nullptr));
    } else {
      KVF_CUDA_OK(LaunchMoeRoute(logits.as<__nv_bfloat16>() + routing, ld, T, s.E, s.k, true, experts.get(),
                                 weights.get(), nullptr));
    }
    mark(1);
    KVF_CUDA_OK(LaunchMoeGroup(experts.get(), S, s.E, sorted.get(), position.get(), offsets.get(), tiles.get(), nullptr,
                               active.get()));
    const __nv_bfloat16* x_in = x.as<__nv_bfloat16>();
    if (s.sigmoid) {
      KVF_CUDA_OK(LaunchMoeGatherScaled(x_in, sorted.get(), s.k, weights.get(), xs.as<__nv_bfloat16>(), S, s.H, nullptr));
      x_in = xs.as<__nv_bfloat16>();
    }
    const int gather_div = s.sigmoid ? 0 : s.k;
    mark(2);
    if (path == Path::kBlas) {
      const auto st = blas->Products(gate_up.as<__nv_bfloat16>(), down.as<__nv_bfloat16>(), x_in, gather_div,
                                     sorted.get(), offsets.get(), xs.as<__nv_bfloat16>(), gu.as<__nv_bfloat16>(),
                                     act.as<__nv_bfloat16>(), y.as<__nv_bfloat16>(), S, s.E, s.I, s.H, nullptr);
      if (!st.ok()) {
        std::fprintf(stderr, "MoeBlas: %s\n", st.ToString().c_str());
        std::exit(1);
      }
      mark(3);
    } else if (gemv) {
      KVF_CUDA_OK(LaunchMoeGroupedGemv(gate_up.as<__nv_bfloat16>(), x_in, sorted.get(), gather_div, offsets.get(),
                                       active.get(), act.as<__nv_bfloat16>(), true, T, S, s.E, s.I, s.H, nullptr));
      mark(3);
      KVF_CUDA_OK(LaunchMoeGroupedGemv(down.as<__nv_bfloat16>(), act.as<__nv_bfloat16>(), sorted.get(), 0, offsets.get(),
                                       active.get(), y.as<__nv_bfloat16>(), false, T, S, s.E, s.H, s.I, nullptr));
    } else {
      KVF_CUDA_OK(LaunchMoeGroupedGemm(gate_up.as<__nv_bfloat16>(), x_in, sorted.get(), gather_div, offsets.get(),
                                       tiles.get(), gu.as<__nv_bfloat16>(), S, s.E, 2 * s.I, s.H, nullptr));
      KVF_CUDA_OK(LaunchSiluMul(gu.as<__nv_bfloat16>(), act.as<__nv_bfloat16>(), S, s.I, nullptr));
      mark(3);
      KVF_CUDA_OK(LaunchMoeGroupedGemm(down.as<__nv_bfloat16>(), act.as<__nv_bfloat16>(), sorted.get(), 0,
                                       offsets.get(), tiles.get(), y.as<__nv_bfloat16>(), S, s.E, s.H, s.I, nullptr));
    }
    mark(4);
    if (s.sigmoid) {
      KVF_CUDA_OK(LaunchMoeCombineAdd(y.as<__nv_bfloat16>(), position.get(), shared.as<__nv_bfloat16>(),
                                      out.as<__nv_bfloat16>(), T, s.k, s.H, nullptr));
    } else {
      KVF_CUDA_OK(LaunchMoeCombine(y.as<__nv_bfloat16>(), weights.get(), position.get(), out.as<__nv_bfloat16>(), T,
                                   s.k, s.H, nullptr));
    }
    mark(5);
  };
  const double ms = TimeMs([&] { block([](int) {}); });
  // Where a decode call's time goes: events between its parts (which also stops PDL's overlap
  // between them, so the parts add up to more than the whole), medians of 32 calls.
  std::string parts;
  if (gemv && T <= 8) {
    constexpr int kParts = 5, kCalls = 32;
    std::vector<cudaEvent_t> ev(kParts + 1);
    for (auto& e : ev) KVF_CUDA_OK(cudaEventCreate(&e));
    std::vector<std::vector<float>> took(kParts);
    for (int c = 0; c < kCalls; ++c) {
      block([&](int i) { KVF_CUDA_OK(cudaEventRecord(ev[i])); });
      KVF_CUDA_OK(cudaEventSynchronize(ev[kParts]));
      for (int i = 0; i < kParts; ++i) {
        float t;
        KVF_CUDA_OK(cudaEventElapsedTime(&t, ev[i], ev[i + 1]));
        took[i].push_back(t * 1e3f);
      }
    }
    for (auto& e : ev) cudaEventDestroy(e);
    const char* names[kParts] = {"route", s.sigmoid ? "group+gather" : "group", "gate/up", "down", "combine"};
    parts = "  [us:";
    for (int i = 0; i < kParts; ++i) {
      std::sort(took[i].begin(), took[i].end());
      char buf[48];
      std::snprintf(buf, sizeof buf, " %s %.1f", names[i], took[i][kCalls / 2]);
      parts += buf;
    }
    parts += "]";
  }
  const std::vector<int32_t> chosen = experts.Download();
  const size_t used = std::set<int32_t>(chosen.begin(), chosen.end()).size();
  const double weight_bytes = double(used) * 3.0 * s.I * s.H * 2;
  const double flops = 2.0 * S * 3.0 * s.I * s.H;
  std::printf("%-14s %s T=%-5d %3zu/%-3d experts  %8.3f ms  %7.1f GB/s weights (%4.1f%% of copy)  %6.1f TFLOP/s%s\n",
              s.name, path == Path::kBlas ? "blas" : gemv ? "gemv" : "gemm", T, used, s.E, ms, weight_bytes / ms / 1e6, 100 * weight_bytes / ms / 1e6 / copy_gbs, flops / ms / 1e9, parts.c_str());
}

}  // namespace
}  // namespace kvfleet::kernels

int main(int argc, char** argv) {
  using namespace kvfleet::kernels;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop;
  KVF_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  KVF_CUDA_OK(cudaMalloc(&a, bytes));
  KVF_CUDA_OK(cudaMalloc(&b, bytes));
  const double copy_ms = TimeMs([&] { KVF_CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 5, 1);
  const double copy_gbs = 2.0 * bytes / copy_ms / 1e6;
  KVF_CUDA_OK(cudaFree(a));
  KVF_CUDA_OK(cudaFree(b));
  std::printf("device %s, copy %.0f GB/s (D2D, read+write)\n", prop.name, copy_gbs);
  auto made = kvfleet::backend::cuda::MoeBlas::Make(128);
  if (!made.ok()) {
    std::fprintf(stderr, "MoeBlas: %s\n", made.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<kvfleet::backend::cuda::MoeBlas> blas = std::move(made).value();
  // Llama 4 Scout's routed experts (16, top 1, hidden 5120, 8192 each; its shared expert,
  // another 8192-wide MLP every token takes, is a dense gemv outside this block).
  for (const Shape& s : {Shape{"qwen3-30b-a3b", 128, 8, 2048, 768}, Shape{"mixtral-8x7b", 8, 2, 4096, 14336},
                         Shape{"llama-4-scout", 16, 1, 5120, 8192, true}}) {
    for (int T : {1, 2, 4, 8, 16, 32, 64, 512, 4096}) {
      if (quick && T > 64) continue;
      Bench(s, T, copy_gbs, Path::kGemm, blas.get());
      if (T <= 64) Bench(s, T, copy_gbs, Path::kGemv, blas.get());
      if (T >= 64) Bench(s, T, copy_gbs, Path::kBlas, blas.get());
    }
  }
  return 0;
}
