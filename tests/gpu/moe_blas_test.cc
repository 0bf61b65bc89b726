// MoeBlas (worker/backend/cuda/moe_blas.h): the prefill expert products through cuBLAS's
// grouped GEMM against the CPU references of the grouped GEMM and SiLU-mul, from token rows
// (gathered) and from grouped rows, with empty experts, one expert taking every token, and an
// unsupported shape refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe.h"
#include "kernels/moe_ref.h"
#include "kernels/small_kernels_ref.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/backend/cuda/moe_blas.h"

namespace kvfleet::backend::cuda {
namespace {

using gputest::DeviceBuffer;
using kernels::bf16_bits;

TEST_CASE("MoeBlas's grouped cuBLAS products equal the reference chain, gathered or grouped rows") {
  std::mt19937 rng(31);
  struct Shape {
    int T, k, E, N, H;
    bool one_expert;  // every token routes to expert 1 first (the others' groups small or empty)
  };
  auto made = MoeBlas::Make(16);
  REQUIRE(made.ok());
  MoeBlas& blas = **made;
  cudaStream_t stream;
  KVF_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (Shape s : {Shape{64, 2, 8, 96, 128, false}, Shape{37, 1, 16, 40, 64, true}, Shape{200, 4, 6, 64, 256, false}})
    for (int gather : {1, 0}) {
      const int S = s.T * s.k;
      std::vector<int32_t> experts(S);
      for (int t = 0; t < s.T; ++t) {
        std::vector<int32_t> ids(s.E);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        if (s.one_expert) std::swap(*std::find(ids.begin(), ids.end(), 1), ids[0]);
        std::copy(ids.begin(), ids.begin() + s.k, experts.begin() + t * s.k);
      }
      std::vector<int32_t> sorted(S), position(S), offsets(s.E + 1), tiles(s.E + 1);
      kernels::MoeGroupRef(experts.data(), S, s.E, sorted.data(), position.data(), offsets.data(), tiles.data());
      auto gu = gputest::RandomBf16(size_t(s.E) * 2 * s.N * s.H, rng, -0.5f, 0.5f);
      auto dn = gputest::RandomBf16(size_t(s.E) * s.H * s.N, rng, -0.5f, 0.5f);
      auto x = gputest::RandomBf16(size_t(gather ? s.T : S) * s.H, rng, -1, 1);
      DeviceBuffer<bf16_bits> dgu(gu), ddn(dn), dx(x), dxs(size_t(S) * s.H), dprod(size_t(S) * 2 * s.N),
          dact(size_t(S) * s.N), dy(size_t(S) * s.H);
      DeviceBuffer<int32_t> de(experts), ds(S), dp(S), doff(s.E + 1), dt(s.E + 1);
      dy.Poison();
      KVF_CUDA_OK(kernels::LaunchMoeGroup(de.get(), S, s.E, ds.get(), dp.get(), doff.get(), dt.get(), stream));
      const Status st = blas.Products(dgu.as<__nv_bfloat16>(), ddn.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(),
                                      gather ? s.k : 0, ds.get(), doff.get(), dxs.as<__nv_bfloat16>(),
                                      dprod.as<__nv_bfloat16>(), dact.as<__nv_bfloat16>(), dy.as<__nv_bfloat16>(), S,
                                      s.E, s.N, s.H, stream);
      REQUIRE(st.ok());
      KVF_CUDA_OK(cudaStreamSynchronize(stream));
      // The references over the device's own grouping (rows within a group in any order).
      const std::vector<int32_t> gsorted = ds.Download();
      std::vector<bf16_bits> prod(size_t(S) * 2 * s.N), act(size_t(S) * s.N), y(size_t(S) * s.H);
      kernels::MoeGroupedGemmRef(gu.data(), x.data(), gsorted.data(), gather ? s.k : 0, offsets.data(), prod.data(), S,
                                 s.E, 2 * s.N, s.H);
      kernels::SiluMulRef(prod.data(), act.data(), S, s.N);
      CAPTURE(s.T);
      CAPTURE(s.E);
      CAPTURE(gather);
      CHECK(gputest::RelativeError(dact.Download(), gputest::ToFloat(act)) <= 4e-3);
      // The down product over the device's intermediate, so its bar is one product's.
      const std::vector<bf16_bits> got_act = dact.Download();
      kernels::MoeGroupedGemmRef(dn.data(), got_act.data(), gsorted.data(), 0, offsets.data(), y.data(), S, s.E, s.H,
                                 s.N);
      CHECK(gputest::RelativeError(dy.Download(), gputest::ToFloat(y)) <= 4e-3);
    }
  CHECK_FALSE(blas.Products(nullptr, nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 8, 17,
                            64, 64, stream)
                  .ok());  // more experts than it was made for
  KVF_CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace kvfleet::backend::cuda
