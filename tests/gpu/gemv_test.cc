// The skinny GEMM (kernels/gemv.h) against its CPU reference: every row count it takes, odd
// and Llama-sized shapes, with and without bias, bf16 and fp32 outputs.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/gemv_ref.h"
#include "kernels/small_kernels.h"
#include "kernels/small_kernels_ref.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

TEST_CASE("gemv matches the fp32 reference for 1..8 rows, odd and Llama-sized shapes") {
  std::mt19937 rng(21);
  struct Shape {
    int m, k;
  };
  // m not a multiple of the rows per block; k not a multiple of the unrolled stride; 8B shapes.
  for (Shape s : {Shape{1, 8}, Shape{37, 72}, Shape{1000, 1032}, Shape{4096, 4096}, Shape{576, 14336}})
    for (int n = 1; n <= kGemvMaxRows; ++n)
      for (bool with_bias : {false, true}) {
        auto w = gputest::RandomBf16(size_t(s.m) * s.k, rng);
        auto x = gputest::RandomBf16(size_t(n) * s.k, rng, -2, 2);
        auto bias = gputest::RandomBf16(s.m, rng, -4, 4);
        std::vector<float> ref(size_t(n) * s.m);
        GemvRef(w.data(), x.data(), with_bias ? bias.data() : nullptr, ref.data(), s.m, n, s.k);
        DeviceBuffer<bf16_bits> dw(w), dx(x), db(bias), dy(ref.size());
        DeviceBuffer<float> dyf(ref.size());
        dy.Poison();
        dyf.Poison();
        const __nv_bfloat16* b = with_bias ? db.as<__nv_bfloat16>() : nullptr;
        KVF_CUDA_OK(LaunchGemv(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), b, dy.get(), false, s.m, n, s.k, nullptr));
        KVF_CUDA_OK(LaunchGemv(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), b, dyf.get(), true, s.m, n, s.k, nullptr));
        KVF_CUDA_OK(cudaDeviceSynchronize());
        CAPTURE(s.m);
        CAPTURE(s.k);
        CAPTURE(n);
        CAPTURE(with_bias);
        // bf16 output: one rounding of the fp32 sum (relative 2^-9 at most per element).
        CHECK(gputest::RelativeError(dy.Download(), ref) < 4e-3);
        // fp32 output: only the summation order differs from the float64 reference.
        const std::vector<float> yf = dyf.Download();
        double num = 0, den = 0;
        bool finite = true;
        for (size_t i = 0; i < ref.size(); ++i) {
          finite = finite && std::isfinite(yf[i]);
          num += double(yf[i] - ref[i]) * (yf[i] - ref[i]);
          den += double(ref[i]) * ref[i];
        }
        CHECK(finite);
        CHECK(std::sqrt(num / den) < 1e-5);
      }
}

TEST_CASE("the gate/up gemv fused with SiLU-mul equals the gemv followed by SiLU-mul, and the CPU reference") {
  std::mt19937 rng(22);
  struct Shape {
    int inter, k;
  };
  // inter not a multiple of the pairs per block (there the unfused SiLU-mul, which needs
  // inter % 8 == 0, is not run); k not a multiple of the unrolled stride; llama-3.1-8b.
  for (Shape s : {Shape{1, 8}, Shape{37, 72}, Shape{1000, 1032}, Shape{14336, 4096}})
    for (int n : {1, 2, 5, kGemvMaxRows})
      for (bool with_bias : {false, true}) {
        const int m = 2 * s.inter;
        auto w = gputest::RandomBf16(size_t(m) * s.k, rng, -0.5, 0.5);
        auto x = gputest::RandomBf16(size_t(n) * s.k, rng, -1, 1);
        auto bias = gputest::RandomBf16(m, rng, -1, 1);
        const bf16_bits* bias_h = with_bias ? bias.data() : nullptr;
        // CPU: the fp32 products rounded to bf16 (the GEMM's output), then SiLU-mul.
        std::vector<float> y(size_t(n) * m);
        GemvRef(w.data(), x.data(), bias_h, y.data(), m, n, s.k);
        std::vector<bf16_bits> gate_up(y.size()), act_ref(size_t(n) * s.inter);
        for (size_t i = 0; i < y.size(); ++i) gate_up[i] = FloatToBf16(y[i]);
        SiluMulRef(gate_up.data(), act_ref.data(), n, s.inter);
        std::vector<float> ref(act_ref.size());
        for (size_t i = 0; i < ref.size(); ++i) ref[i] = Bf16ToFloat(act_ref[i]);

        DeviceBuffer<bf16_bits> dw(w), dx(x), db(bias), dgu(y.size()), dact(ref.size()), dfused(ref.size());
        dfused.Poison();
        const __nv_bfloat16* b = with_bias ? db.as<__nv_bfloat16>() : nullptr;
        KVF_CUDA_OK(LaunchGemv(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), b, dgu.get(), false, m, n, s.k, nullptr));
        const bool unfused = s.inter % 8 == 0;
        if (unfused) KVF_CUDA_OK(LaunchSiluMul(dgu.as<__nv_bfloat16>(), dact.as<__nv_bfloat16>(), n, s.inter, nullptr));
        KVF_CUDA_OK(LaunchGemvSiluMul(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), b, dfused.as<__nv_bfloat16>(),
                                      s.inter, n, s.k, nullptr));
        KVF_CUDA_OK(cudaDeviceSynchronize());
        CAPTURE(s.inter);
        CAPTURE(s.k);
        CAPTURE(n);
        CAPTURE(with_bias);
        // Same sums in the same order, same roundings: bit for bit the unfused pair.
        if (unfused) CHECK(dfused.Download() == dact.Download());
        // Against the reference: the bf16 rounding of g or u can flip on a different
        // summation order, a few 2^-8 relative errors in a few elements at most.
        CHECK(gputest::RelativeError(dfused.Download(), ref) < 1e-2);
      }
}

TEST_CASE("gemv rejects what it cannot do instead of computing garbage") {
  DeviceBuffer<bf16_bits> w(64 * 64), x(9 * 64), y(9 * 64);
  auto run = [&](const void* wp, int n, int k) {
    return LaunchGemv(static_cast<const __nv_bfloat16*>(wp), x.as<__nv_bfloat16>(), nullptr, y.get(), false, 64, n, k,
                      nullptr);
  };
  CHECK(run(w.get(), 0, 64) == cudaErrorInvalidValue);
  CHECK(run(w.get(), kGemvMaxRows + 1, 64) == cudaErrorInvalidValue);
  CHECK(run(w.get(), 1, 60) == cudaErrorInvalidValue);                  // k % 8 != 0
  CHECK(run(w.as<bf16_bits>() + 1, 1, 64) == cudaErrorInvalidValue);   // w not 16-byte aligned
  CHECK(run(w.get(), 1, 64) == cudaSuccess);
  CHECK(LaunchGemvSiluMul(w.as<__nv_bfloat16>(), x.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), 32,
                          kGemvMaxRows + 1, 64, nullptr) == cudaErrorInvalidValue);
  CHECK(LaunchGemvSiluMul(w.as<__nv_bfloat16>(), x.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), 32, 1, 60,
                          nullptr) == cudaErrorInvalidValue);
  KVF_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kvfleet::kernels
