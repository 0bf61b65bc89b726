// The skinny GEMM (kernels/gemv.h) against its CPU reference: every row count it takes, odd
// and Llama-sized shapes, with and without bias, bf16 and fp32 outputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/gemv.h"
#include "kernels/gemv_ref.h"
#include "kernels/rope.h"
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

TEST_CASE("the gemv with an RMSNorm prologue matches RMSNorm then gemv (and SiLU-mul) on the CPU") {
  std::mt19937 rng(23);
  struct Shape {
    int m, k;
  };
  for (Shape s : {Shape{8, 8}, Shape{37, 72}, Shape{1000, 1032}, Shape{6144, 4096}})
    for (int n : {1, 3, kGemvMaxRows})
      for (bool with_residual : {false, true})
        for (bool silu_mul : {false, true}) {
          const int w_rows = silu_mul ? 2 * s.m : s.m;
          auto w = gputest::RandomBf16(size_t(w_rows) * s.k, rng, -0.5, 0.5);
          auto x = gputest::RandomBf16(size_t(n) * s.k, rng, -2, 2);
          auto resid = gputest::RandomBf16(size_t(n) * s.k, rng, -2, 2);
          auto norm_w = gputest::RandomBf16(s.k, rng, 0.5, 1.5);
          auto bias = gputest::RandomBf16(w_rows, rng, -1, 1);
          // CPU: RMSNorm (+ residual, in place), the product rounded to bf16, SiLU-mul.
          std::vector<bf16_bits> resid_ref = resid, xn(x.size());
          RmsNormRef(x.data(), with_residual ? resid_ref.data() : nullptr, norm_w.data(), xn.data(), n, s.k, 1e-5f);
          std::vector<float> y(size_t(n) * w_rows);
          GemvRef(w.data(), xn.data(), bias.data(), y.data(), w_rows, n, s.k);
          std::vector<float> ref(size_t(n) * s.m);
          if (silu_mul) {
            std::vector<bf16_bits> gate_up(y.size()), act(ref.size());
            for (size_t i = 0; i < y.size(); ++i) gate_up[i] = FloatToBf16(y[i]);
            SiluMulRef(gate_up.data(), act.data(), n, s.m);
            for (size_t i = 0; i < ref.size(); ++i) ref[i] = Bf16ToFloat(act[i]);
          } else {
            ref = y;
          }

          DeviceBuffer<bf16_bits> dw(w), dx(x), dres(resid), dres_out(resid.size()), dnw(norm_w), db(bias),
              dy(ref.size());
          dy.Poison();
          dres_out.Poison();
          GemvRmsNorm nrm;
          nrm.x = dx.as<__nv_bfloat16>();
          nrm.residual_in = with_residual ? dres.as<__nv_bfloat16>() : nullptr;
          nrm.residual_out = with_residual ? dres_out.as<__nv_bfloat16>() : nullptr;
          nrm.weight = dnw.as<__nv_bfloat16>();
          nrm.eps = 1e-5f;
          KVF_CUDA_OK(LaunchRmsNormGemv(nrm, dw.as<__nv_bfloat16>(), db.as<__nv_bfloat16>(), dy.as<__nv_bfloat16>(),
                                        silu_mul, s.m, n, s.k, nullptr));
          KVF_CUDA_OK(cudaDeviceSynchronize());
          CAPTURE(s.m);
          CAPTURE(s.k);
          CAPTURE(n);
          CAPTURE(with_residual);
          CAPTURE(silu_mul);
          // The residual sum is exact bf16 arithmetic; the product differs from the CPU's by
          // summation order (a 1-ulp flip of a normalised element or of g, u moves it a little).
          if (with_residual) CHECK(dres_out.Download() == resid_ref);
          CHECK(dres.Download() == resid);  // the input residual is left alone
          CHECK(gputest::RelativeError(dy.Download(), ref) < 1e-2);
        }
}

// Values differ by at most `ulps` bf16 steps (same-sign bit patterns are ordered).
bool WithinUlps(const std::vector<bf16_bits>& a, const std::vector<bf16_bits>& b, int ulps, size_t* bad) {
  *bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float x = Bf16ToFloat(a[i]), y = Bf16ToFloat(b[i]);
    if (x == y) continue;
    const int d = std::signbit(x) == std::signbit(y) ? std::abs(int(a[i]) - int(b[i])) : 1;
    if (std::isnan(x) || std::isnan(y) || d > ulps) ++*bad;
  }
  return *bad == 0;
}

TEST_CASE("the QKV gemv with RoPE + K/V store epilogue (and RMSNorm prologue) equals the separate kernels") {
  std::mt19937 rng(24);
  struct Shape {
    int hq, hkv, d, hidden, block;
  };
  for (Shape s : {Shape{32, 8, 128, 4096, 16}, Shape{14, 2, 64, 896, 2}, Shape{4, 1, 16, 64, 7}})
    for (int n : {1, 3, kGemvRopeKvMaxRows})
      for (bool rotate : {true, false})
        for (bool with_bias : {false, true}) {
          const int layers = 3, layer = 1, width = (s.hq + 2 * s.hkv) * s.d;
          PagedKvLayout layout{layers, s.hkv, s.block, s.d};
          const int num_blocks = n / s.block + 4;
          auto w = gputest::RandomBf16(size_t(width) * s.hidden, rng, -0.5, 0.5);
          auto x = gputest::RandomBf16(size_t(n) * s.hidden, rng, -2, 2);
          auto resid = gputest::RandomBf16(size_t(n) * s.hidden, rng, -2, 2);
          auto norm_w = gputest::RandomBf16(s.hidden, rng, 0.5, 1.5);
          auto bias = gputest::RandomBf16(width, rng, -1, 1);
          std::vector<int32_t> pos(n), slots(n), perm(num_blocks * s.block);
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int t = 0; t < n; ++t) {
            pos[t] = 1000 + 517 * t;
            slots[t] = t == 1 ? -1 : perm[t];  // a padding row stores nothing
          }
          RopeConfig rc;
          rc.head_dim = s.d;
          rc.scaling.type = RopeScaling::Type::kLlama3;
          rc.scaling.factor = 8;
          auto inv = RopeInvFreq(rc);
          auto pool = gputest::RandomBf16(num_blocks * layout.BlockElems(), rng);

          // CPU: RMSNorm + residual, the product rounded to bf16, RoPE + store.
          std::vector<bf16_bits> resid_ref = resid, xn(x.size()), qkv(size_t(n) * width);
          RmsNormRef(x.data(), resid_ref.data(), norm_w.data(), xn.data(), n, s.hidden, 1e-5f);
          std::vector<float> y(qkv.size());
          GemvRef(w.data(), xn.data(), with_bias ? bias.data() : nullptr, y.data(), width, n, s.hidden);
          for (size_t i = 0; i < y.size(); ++i) qkv[i] = FloatToBf16(y[i]);
          std::vector<bf16_bits> q_ref(size_t(n) * s.hq * s.d), pool_ref = pool;
          RopeKvStoreRef(qkv.data(), pos.data(), slots.data(), inv.data(), q_ref.data(), pool_ref.data(), layout, layer,
                         n, s.hq, rotate);

          DeviceBuffer<bf16_bits> dw(w), dx(x), dres(resid), dres_out(resid.size()), dnw(norm_w), db(bias),
              dqkv(qkv.size()), dq(q_ref.size()), dq_fused(q_ref.size()), dpool(pool), dpool_fused(pool);
          DeviceBuffer<int32_t> dpos(pos), dslots(slots);
          DeviceBuffer<float> dinv(inv);
          dq.Poison();
          dq_fused.Poison();
          GemvRmsNorm nrm;
          nrm.x = dx.as<__nv_bfloat16>();
          nrm.residual_in = dres.as<__nv_bfloat16>();
          nrm.residual_out = dres_out.as<__nv_bfloat16>();
          nrm.weight = dnw.as<__nv_bfloat16>();
          nrm.eps = 1e-5f;
          const __nv_bfloat16* b = with_bias ? db.as<__nv_bfloat16>() : nullptr;
          // The unfused pair on the GPU: the normalising gemv, then LaunchRopeKvStore.
          KVF_CUDA_OK(LaunchRmsNormGemv(nrm, dw.as<__nv_bfloat16>(), b, dqkv.as<__nv_bfloat16>(), false, width, n,
                                        s.hidden, nullptr));
          KVF_CUDA_OK(LaunchRopeKvStore(dqkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), dinv.get(),
                                        dq.as<__nv_bfloat16>(), dpool.as<__nv_bfloat16>(), layout, layer, n, s.hq,
                                        rotate, nullptr));
          GemvRopeKvStore rope;
          rope.positions = dpos.get();
          rope.slots = dslots.get();
          rope.inv_freq = dinv.get();
          rope.q_out = dq_fused.as<__nv_bfloat16>();
          rope.kv_pool = dpool_fused.as<__nv_bfloat16>();
          rope.layout = layout;
          rope.layer = layer;
          rope.num_q_heads = s.hq;
          rope.rotate = rotate;
          KVF_CUDA_OK(LaunchRmsNormGemvRopeKv(nrm, dw.as<__nv_bfloat16>(), b, rope, n, s.hidden, nullptr));
          KVF_CUDA_OK(cudaDeviceSynchronize());
          CAPTURE(s.hq);
          CAPTURE(s.d);
          CAPTURE(n);
          CAPTURE(rotate);
          CAPTURE(with_bias);
          // Each row's sum in the same order, the same roundings: bit for bit.
          CHECK(dq_fused.Download() == dq.Download());
          CHECK(dpool_fused.Download() == dpool.Download());  // untouched slots stay equal too
          // Against the CPU: a different summation order can flip a bf16 rounding of the
          // product (then of the rotation): a few elements a few ulps apart.
          size_t bad_q = 0, bad_pool = 0;
          WithinUlps(dq_fused.Download(), q_ref, 4, &bad_q);
          WithinUlps(dpool_fused.Download(), pool_ref, 4, &bad_pool);
          CHECK(bad_q <= q_ref.size() / 100);
          CHECK(bad_pool <= size_t(n) * 2 * s.hkv * s.d / 100);
          CHECK(gputest::RelativeError(dq_fused.Download(), gputest::ToFloat(q_ref)) < 1e-2);

          // Without the prologue: x as given, against LaunchGemv + LaunchRopeKvStore.
          DeviceBuffer<bf16_bits> dq2(q_ref.size()), dq2_fused(q_ref.size()), dpool2(pool), dpool2_fused(pool);
          KVF_CUDA_OK(LaunchGemv(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), b, dqkv.get(), false, width, n, s.hidden,
                                 nullptr));
          KVF_CUDA_OK(LaunchRopeKvStore(dqkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), dinv.get(),
                                        dq2.as<__nv_bfloat16>(), dpool2.as<__nv_bfloat16>(), layout, layer, n, s.hq,
                                        rotate, nullptr));
          rope.q_out = dq2_fused.as<__nv_bfloat16>();
          rope.kv_pool = dpool2_fused.as<__nv_bfloat16>();
          KVF_CUDA_OK(LaunchGemvRopeKv(dw.as<__nv_bfloat16>(), dx.as<__nv_bfloat16>(), b, rope, n, s.hidden, nullptr));
          KVF_CUDA_OK(cudaDeviceSynchronize());
          CHECK(dq2_fused.Download() == dq2.Download());
          CHECK(dpool2_fused.Download() == dpool2.Download());
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
  GemvRmsNorm nrm;
  nrm.x = x.as<__nv_bfloat16>();
  nrm.weight = w.as<__nv_bfloat16>();
  nrm.residual_out = y.as<__nv_bfloat16>();  // a residual out without a residual in
  CHECK(LaunchRmsNormGemv(nrm, w.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), false, 64, 1, 64, nullptr) ==
        cudaErrorInvalidValue);
  GemvRopeKvStore rope;  // complete but for the row count
  DeviceBuffer<int32_t> ints(16);
  DeviceBuffer<float> freqs(32);
  rope.positions = ints.get();
  rope.slots = ints.get();
  rope.inv_freq = freqs.get();
  rope.q_out = y.as<__nv_bfloat16>();
  rope.kv_pool = y.as<__nv_bfloat16>();
  rope.layout = PagedKvLayout{1, 1, 16, 16};
  rope.num_q_heads = 1;
  CHECK(LaunchGemvRopeKv(w.as<__nv_bfloat16>(), x.as<__nv_bfloat16>(), nullptr, rope, kGemvRopeKvMaxRows + 1, 64,
                         nullptr) == cudaErrorInvalidValue);
  nrm.residual_out = nullptr;
  nrm.weight = nullptr;
  CHECK(LaunchRmsNormGemv(nrm, w.as<__nv_bfloat16>(), nullptr, y.as<__nv_bfloat16>(), false, 64, 1, 64, nullptr) ==
        cudaErrorInvalidValue);
  KVF_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace kvfleet::kernels
