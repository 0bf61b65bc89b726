// The matrix products of one llama-3.1-8b decode step at few token rows: the backend's
// cuBLASLt path (worker/backend/cuda/lt_gemm.h) against the skinny GEMM kernel
// (kernels/gemv.h), to choose CudaBackend's gemv_max_rows.
//
//   kvfleet_gemv_bench [--quick]
//
// Weights: 32 layers of distinct random matrices (qkv 6144x4096, o 4096x4096, gate_up
// 28672x4096, down 4096x14336) and the LM head 128256x4096 (fp32 out): 15.0 GB, far past the
// L2, as in the model. Each case is one CUDA graph of the launches (per shape: its 32
// layers; "step": every product of the step in order), replayed; median of 10 replays after
// 2 warm-ups (CUDA events). GB/s counts the weight bytes (x and y are negligible) against
// the device-to-device copy rate measured in the same run.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemv.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backend/cuda/lt_gemm.h"

namespace kvfleet {
namespace {

using gputest::DeviceBuffer;
using backend::cuda::LtGemm;

double TimeGraphMs(const std::function<void(cudaStream_t)>& enqueue, cudaStream_t s, int reps = 10) {
  cudaGraph_t g;
  KVF_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue(s);
  KVF_CUDA_OK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  KVF_CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  for (int i = 0; i < 2; ++i) KVF_CUDA_OK(cudaGraphLaunch(exec, s));
  cudaEvent_t a, b;
  KVF_CUDA_OK(cudaEventCreate(&a));
  KVF_CUDA_OK(cudaEventCreate(&b));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    KVF_CUDA_OK(cudaEventRecord(a, s));
    KVF_CUDA_OK(cudaGraphLaunch(exec, s));
    KVF_CUDA_OK(cudaEventRecord(b, s));
    KVF_CUDA_OK(cudaEventSynchronize(b));
    KVF_CUDA_OK(cudaEventElapsedTime(&ms[i], a, b));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

double CopyGBs(cudaStream_t s) {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  KVF_CUDA_OK(cudaMemset(a.get(), 1, bytes));
  // Outside a graph: a memcpy node in a graph runs on a copy engine, slower than the SMs.
  KVF_CUDA_OK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
  cudaEvent_t e0, e1;
  KVF_CUDA_OK(cudaEventCreate(&e0));
  KVF_CUDA_OK(cudaEventCreate(&e1));
  std::vector<float> ms(10);
  for (float& m : ms) {
    KVF_CUDA_OK(cudaEventRecord(e0, s));
    KVF_CUDA_OK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, s));
    KVF_CUDA_OK(cudaEventRecord(e1, s));
    KVF_CUDA_OK(cudaEventSynchronize(e1));
    KVF_CUDA_OK(cudaEventElapsedTime(&m, e0, e1));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return 2.0 * bytes / ms[ms.size() / 2] / 1e6;
}

struct Shape {
  const char* name;
  int m, k;
  bool f32;
  int count;  // distinct copies (layers)
};

}  // namespace
}  // namespace kvfleet

int main(int argc, char** argv) {
  using namespace kvfleet;
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop;
  KVF_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  KVF_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const double copy = CopyGBs(s);
  std::printf("device %s; copy (D2D read+write) %.0f GB/s\n", prop.name, copy);

  const int layers = quick ? 8 : 32;
  const std::vector<Shape> shapes = {{"qkv 6144x4096", 6144, 4096, false, layers},
                                     {"o 4096x4096", 4096, 4096, false, layers},
                                     {"gate_up 28672x4096", 28672, 4096, false, layers},
                                     {"down 4096x14336", 4096, 14336, false, layers},
                                     {"lm_head 128256x4096 f32", 128256, 4096, true, 1}};
  // Weights: one random 256 MiB pattern copied over every matrix (no zeros, no cache reuse).
  std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> w;
  {
    const size_t pat = size_t(128) << 20;  // elements
    DeviceBuffer<uint16_t> pattern(pat);
    std::mt19937 rng(5);
    std::vector<uint16_t> host(pat);
    for (auto& v : host) v = kernels::FloatToBf16(std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng));
    pattern.Upload(host);
    for (const Shape& sh : shapes)
      for (int l = 0; l < sh.count; ++l) {
        const size_t n = size_t(sh.m) * sh.k;
        w.push_back(std::make_unique<DeviceBuffer<uint16_t>>(n));
        for (size_t off = 0; off < n; off += pat)
          KVF_CUDA_OK(cudaMemcpy(w.back()->get() + off, pattern.get(), std::min(pat, n - off) * 2, cudaMemcpyDeviceToDevice));
      }
  }
  std::mt19937 xrng(6);
  auto rows_x = gputest::RandomBf16(size_t(kernels::kGemvMaxRows) * 14336, xrng);
  DeviceBuffer<uint16_t> x(rows_x);
  DeviceBuffer<float> y(size_t(kernels::kGemvMaxRows) * 128256);
  auto made = LtGemm::Make();
  if (!made.ok()) {
    std::fprintf(stderr, "LtGemm: %s\n", made.status().ToString().c_str());
    return 1;
  }
  LtGemm& lt = *made.value();

  auto run = [&](const Shape& sh, const uint16_t* wp, int n, bool gemv, cudaStream_t st) {
    const auto* wb = reinterpret_cast<const __nv_bfloat16*>(wp);
    const auto* xb = x.as<__nv_bfloat16>();
    if (gemv) {
      KVF_CUDA_OK(kernels::LaunchGemv(wb, xb, nullptr, y.get(), sh.f32, sh.m, n, sh.k, st));
    } else {
      Status e = lt.Run(wb, xb, nullptr, y.get(), sh.f32 ? LtGemm::Out::kF32 : LtGemm::Out::kBf16, sh.m, n, sh.k, st);
      if (!e.ok()) {
        std::fprintf(stderr, "LtGemm: %s\n", e.ToString().c_str());
        std::exit(1);
      }
    }
  };
  std::printf("%-26s %3s %12s %9s %7s %12s %9s %7s %7s\n", "matrices", "n", "cuBLASLt ms", "GB/s", "%copy", "gemv ms",
              "GB/s", "%copy", "speedup");
  std::vector<std::string> summary;
  for (int n : {1, 2, 3, 4, 6, 8}) {
    // Plan every cuBLASLt shape outside capture.
    for (size_t i = 0, wi = 0; i < shapes.size(); wi += shapes[i].count, ++i) run(shapes[i], w[wi]->get(), n, false, s);
    KVF_CUDA_OK(cudaStreamSynchronize(s));
    double step_bytes = 0;
    for (size_t i = 0, wi = 0; i < shapes.size(); wi += shapes[i].count, ++i) {
      const Shape& sh = shapes[i];
      const double bytes = 2.0 * sh.m * sh.k * sh.count;
      step_bytes += bytes;
      double ms[2];
      for (int g = 0; g < 2; ++g)
        ms[g] = TimeGraphMs([&](cudaStream_t st) {
          for (int l = 0; l < sh.count; ++l) run(sh, w[wi + l]->get(), n, g == 1, st);
        }, s);
      std::printf("%-26s %3d %12.4f %9.0f %6.1f%% %12.4f %9.0f %6.1f%% %6.2fx\n", sh.name, n, ms[0] / sh.count,
                  bytes / ms[0] / 1e6, 100 * bytes / ms[0] / 1e6 / copy, ms[1] / sh.count, bytes / ms[1] / 1e6,
                  100 * bytes / ms[1] / 1e6 / copy, ms[0] / ms[1]);
    }
    double ms[2];
    for (int g = 0; g < 2; ++g)
      ms[g] = TimeGraphMs([&](cudaStream_t st) {
        for (int l = 0; l < layers; ++l)
          for (size_t i = 0, wi = 0; i < 4; wi += shapes[i].count, ++i) run(shapes[i], w[wi + l]->get(), n, g == 1, st);
        run(shapes[4], w.back()->get(), n, g == 1, st);
      }, s);
    char line[200];
    std::snprintf(line, sizeof(line), "  step matmuls (%d layers + lm_head) n=%d: cuBLASLt %.3f ms (%.1f%% of copy), gemv %.3f ms (%.1f%%), %.2fx",
                  layers, n, ms[0], 100 * step_bytes / ms[0] / 1e6 / copy, ms[1], 100 * step_bytes / ms[1] / 1e6 / copy,
                  ms[0] / ms[1]);
    std::printf("%s\n", line + 2);
    summary.push_back(line);
  }
  double step_gb = 0;
  for (const Shape& sh : shapes) step_gb += 2e-9 * sh.m * sh.k * sh.count;
  std::printf("\nsummary (%s, %.2f GB of weights per step)\n", prop.name, step_gb);
  for (const auto& l : summary) std::printf("%s\n", l.c_str());
  return 0;
}
