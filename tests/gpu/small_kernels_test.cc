// RMSNorm(+residual), RoPE + paged K/V store, SiLU-and-mul and embedding lookup against their
// CPU references at several sizes. The references round at the same points, so results agree
// to within one bf16 ulp (device and host transcendental functions differ in the last bits).
#include <doctest/doctest.h>

#include <numeric>

#include "kernels/fp8.h"
#include "kernels/rope.h"
#include "kernels/small_kernels.h"
#include "kernels/small_kernels_ref.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvfleet::kernels {
namespace {

using gputest::DeviceBuffer;

// Largest difference in bf16 ulps (units of the larger value's last place); NaN counts as huge.
// Differences of at most `floor` in absolute value count as none: a rotated pair computed in
// fp32 can cancel to near zero, where an ulp is tiny but the fp32 rotation's error (relative to
// the pair's magnitude) is not.
int MaxUlpDiff(const std::vector<bf16_bits>& a, const std::vector<bf16_bits>& b, float floor = 0.f) {
  int worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float x = Bf16ToFloat(a[i]), y = Bf16ToFloat(b[i]);
    if (std::isnan(x) || std::isnan(y)) return 1 << 30;
    if (x == y || std::fabs(x - y) <= floor) continue;
    // bf16 bit patterns of same-sign values are ordered; opposite signs near 0 count as 1.
    const int d = (std::signbit(x) == std::signbit(y)) ? std::abs(int(a[i]) - int(b[i])) : 1;
    worst = std::max(worst, d);
  }
  return worst;
}

TEST_CASE("RMSNorm with and without the residual add matches the reference") {
  std::mt19937 rng(11);
  for (int hidden : {64, 576, 896, 4096, 8192, 16384})
    for (bool with_residual : {false, true}) {
      const int rows = 5;
      auto x = gputest::RandomBf16(size_t(rows) * hidden, rng, -3, 3);
      auto res = gputest::RandomBf16(size_t(rows) * hidden, rng, -3, 3);
      auto w = gputest::RandomBf16(hidden, rng, 0.5, 1.5);
      DeviceBuffer<bf16_bits> dx(x), dres(res), dw(w), dout(x.size());
      dout.Poison();
      KVF_CUDA_OK(LaunchRmsNorm(dx.as<__nv_bfloat16>(), with_residual ? dres.as<__nv_bfloat16>() : nullptr,
                                dw.as<__nv_bfloat16>(), dout.as<__nv_bfloat16>(), rows, hidden, 1e-5f, nullptr));
      KVF_CUDA_OK(cudaDeviceSynchronize());
      std::vector<bf16_bits> out(x.size());
      RmsNormRef(x.data(), with_residual ? res.data() : nullptr, w.data(), out.data(), rows, hidden, 1e-5f);
      CAPTURE(hidden);
      CAPTURE(with_residual);
      CHECK(MaxUlpDiff(dout.Download(), out) <= 1);
      if (with_residual) CHECK(MaxUlpDiff(dres.Download(), res) == 0);
    }
}

TEST_CASE("RoPE with llama3 scaling writes rotated q and K and plain V into the paged cache") {
  std::mt19937 rng(12);
  struct Shape {
    int hq, hkv, d, block;
  };
  for (Shape s : {Shape{32, 8, 128, 16}, Shape{14, 2, 64, 2}, Shape{9, 3, 64, 256}, Shape{4, 1, 256, 7}})
    for (bool rotate : {true, false}) {
      const int tokens = 37, layers = 3, layer = 2;
      PagedKvLayout layout{layers, s.hkv, s.block, s.d};
      const int num_blocks = tokens / s.block + 4;
      auto qkv = gputest::RandomBf16(size_t(tokens) * (s.hq + 2 * s.hkv) * s.d, rng, -2, 2);
      std::vector<int32_t> pos(tokens), slots(tokens);
      std::vector<int32_t> perm(num_blocks * s.block);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int t = 0; t < tokens; ++t) {
        pos[t] = 1000 + 517 * t;  // large positions exercise the low-frequency scaling
        slots[t] = t == 5 ? -1 : perm[t];
      }
      RopeConfig rc;
      rc.head_dim = s.d;
      rc.scaling.type = RopeScaling::Type::kLlama3;
      rc.scaling.factor = 8;
      auto inv = RopeInvFreq(rc);
      auto pool = gputest::RandomBf16(num_blocks * layout.BlockElems(), rng);
      DeviceBuffer<bf16_bits> dqkv(qkv), dpool(pool), dq(size_t(tokens) * s.hq * s.d);
      DeviceBuffer<int32_t> dpos(pos), dslots(slots);
      DeviceBuffer<float> dinv(inv);
      dq.Poison();
      KVF_CUDA_OK(LaunchRopeKvStore(dqkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), dinv.get(),
                                    dq.as<__nv_bfloat16>(), dpool.as<__nv_bfloat16>(), layout, layer, tokens, s.hq,
                                    rotate, nullptr));
      KVF_CUDA_OK(cudaDeviceSynchronize());
      std::vector<bf16_bits> q(dq.size());
      RopeKvStoreRef(qkv.data(), pos.data(), slots.data(), inv.data(), q.data(), pool.data(), layout, layer, tokens,
                     s.hq, rotate);
      CAPTURE(s.hq);
      CAPTURE(s.d);
      CAPTURE(rotate);
      CHECK(MaxUlpDiff(dq.Download(), q) <= 1);
      CHECK(MaxUlpDiff(dpool.Download(), pool) <= 1);  // untouched slots stay equal too
    }
}

TEST_CASE("RoPE + K/V store into an fp8 pool writes e4m3(bf16 value / head scale), saturating, other bytes untouched") {
  std::mt19937 rng(13);
  struct Shape {
    int hq, hkv, d, block;
  };
  for (Shape s : {Shape{32, 8, 128, 16}, Shape{9, 3, 64, 1}, Shape{4, 1, 256, 7}}) {
    const int tokens = 29, layers = 2, layer = 1;
    PagedKvLayout layout{layers, s.hkv, s.block, s.d};
    PagedKvLayout layout8 = layout;
    layout8.elem_bytes = 1;
    const int num_blocks = tokens / s.block + 3;
    // Values up to 4 against scales down to 1/448: some saturate at +-448.
    auto qkv = gputest::RandomBf16(size_t(tokens) * (s.hq + 2 * s.hkv) * s.d, rng, -4, 4);
    std::vector<int32_t> pos(tokens), slots(tokens), perm(num_blocks * s.block);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int t = 0; t < tokens; ++t) {
      pos[t] = 3 + 97 * t;
      slots[t] = t == 4 ? -1 : perm[t];
    }
    RopeConfig rc;
    rc.head_dim = s.d;
    auto inv = RopeInvFreq(rc);
    std::vector<float> scales(2 * s.hkv);  // K then V of the layer
    std::uniform_real_distribution<float> u(1.f, 40.f);
    for (float& x : scales) x = u(rng) / kFp8E4m3Max;
    scales[0] = 1.0f / kFp8E4m3Max;  // head 0's K: every |value| above 1 saturates, whatever the draws
    std::vector<fp8_bits> pool8(num_blocks * layout.BlockElems());
    for (auto& b : pool8) b = static_cast<fp8_bits>(rng() % 0x7e);  // finite garbage
    std::vector<bf16_bits> bf16_pool(pool8.size(), 0);
    DeviceBuffer<bf16_bits> dqkv(qkv), dq(size_t(tokens) * s.hq * s.d);
    DeviceBuffer<fp8_bits> dpool(pool8);
    DeviceBuffer<int32_t> dpos(pos), dslots(slots);
    DeviceBuffer<float> dinv(inv), dscales(scales);
    RopeKvExtras ex;
    ex.kv_fp8 = dpool.get();
    ex.scales = {dscales.get(), dscales.get() + s.hkv};
    KVF_CUDA_OK(LaunchRopeKvStore(dqkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), dinv.get(),
                                  dq.as<__nv_bfloat16>(), nullptr, layout8, layer, tokens, s.hq, true, ex, nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bf16_bits> q(dq.size());
    RopeKvStoreRef(qkv.data(), pos.data(), slots.data(), inv.data(), q.data(), bf16_pool.data(), layout, layer, tokens,
                   s.hq, true);
    std::vector<fp8_bits> expect = pool8;
    QuantizeKvSlotsRef(bf16_pool.data(), expect.data(), layout8, layer, slots.data(), tokens, scales.data(),
                       scales.data() + s.hkv);
    const std::vector<fp8_bits> got = dpool.Download();
    // A 1-ulp bf16 difference in a rotated K (as the bf16 test allows) can move its e4m3 code
    // by one step; V and untouched bytes are exact.
    int diff = 0, saturated = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float a = Fp8E4m3ToFloat(got[i]), b = Fp8E4m3ToFloat(expect[i]);
      diff += got[i] != expect[i];
      saturated += (got[i] & 0x7f) == 0x7e && got[i] != pool8[i];
      REQUIRE_MESSAGE(std::fabs(a - b) <= 0.125f * std::max(std::fabs(a), std::fabs(b)) + 0x1p-9f, "byte " << i);
    }
    CAPTURE(s.d);
    CHECK(diff * 100 <= static_cast<int>(got.size()));
    CHECK(saturated > 0);
    CHECK(MaxUlpDiff(dq.Download(), q) <= 1);
  }
}

// Qwen3: q_norm/k_norm over each head before the rotation; dynamic NTK: a frequency row
// per sequence, picked per token. The norm's fp32 sum runs in another order on the GPU
// (warp shuffles) than in the reference (double), so a 1-ulp difference in the normed value
// can grow to 2 after the rotation's roundings.
TEST_CASE("RoPE after Qwen3's per-head q/k RMSNorm, with per-sequence frequency rows, matches the reference") {
  std::mt19937 rng(15);
  struct Shape {
    int hq, hkv, d, block;
  };
  for (Shape s : {Shape{32, 8, 128, 16}, Shape{16, 8, 128, 32}, Shape{4, 2, 64, 8}, Shape{9, 3, 256, 4}})
    for (bool rotate : {true, false})
      for (bool per_seq : {false, true}) {
        const int tokens = 29, layers = 2, layer = 1, seqs = 3;
        PagedKvLayout layout{layers, s.hkv, s.block, s.d};
        const int num_blocks = tokens / s.block + 4;
        auto qkv = gputest::RandomBf16(size_t(tokens) * (s.hq + 2 * s.hkv) * s.d, rng, -4, 4);
        auto q_norm = gputest::RandomBf16(s.d, rng, 0.5, 1.5);
        auto k_norm = gputest::RandomBf16(s.d, rng, 0.5, 1.5);
        std::vector<int32_t> pos(tokens), slots(tokens), row(tokens);
        // Distinct slots: two tokens storing into one slot would race.
        std::vector<int32_t> perm(num_blocks * s.block);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int t = 0; t < tokens; ++t) {
          pos[t] = 40000 + 911 * t;
          slots[t] = t == 3 ? -1 : perm[t];
          row[t] = t % seqs;
        }
        // Three sequences' rows: dynamic NTK frequencies at three lengths past 32768.
        RopeConfig rc;
        rc.head_dim = s.d;
        rc.theta = 1e6;
        rc.max_position_embeddings = 32768;
        rc.scaling.type = RopeScaling::Type::kDynamic;
        rc.scaling.factor = 4;
        std::vector<float> inv;
        for (int q = 0; q < seqs; ++q) {
          auto r = RopeInvFreq(rc, 40000 + 20000 * q);
          inv.insert(inv.end(), r.begin(), r.end());
        }
        auto pool = gputest::RandomBf16(num_blocks * layout.BlockElems(), rng);
        DeviceBuffer<bf16_bits> dqkv(qkv), dpool(pool), dq(size_t(tokens) * s.hq * s.d), dqn(q_norm), dkn(k_norm);
        DeviceBuffer<int32_t> dpos(pos), dslots(slots), drow(row);
        DeviceBuffer<float> dinv(inv);
        dq.Poison();
        RopeKvExtras extras;
        extras.q_norm = dqn.as<__nv_bfloat16>();
        extras.k_norm = dkn.as<__nv_bfloat16>();
        extras.norm_eps = 1e-6f;
        extras.inv_freq_row = per_seq ? drow.get() : nullptr;
        KVF_CUDA_OK(LaunchRopeKvStore(dqkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), dinv.get(),
                                      dq.as<__nv_bfloat16>(), dpool.as<__nv_bfloat16>(), layout, layer, tokens, s.hq,
                                      rotate, extras, nullptr));
        KVF_CUDA_OK(cudaDeviceSynchronize());
        std::vector<bf16_bits> q(dq.size());
        RopeKvStoreRef(qkv.data(), pos.data(), slots.data(), inv.data(), q.data(), pool.data(), layout, layer, tokens,
                       s.hq, rotate, q_norm.data(), k_norm.data(), 1e-6f, per_seq ? row.data() : nullptr);
        CAPTURE(s.hq);
        CAPTURE(s.d);
        CAPTURE(rotate);
        CAPTURE(per_seq);
        CHECK(MaxUlpDiff(dq.Download(), q) <= 2);
        CHECK(MaxUlpDiff(dpool.Download(), pool) <= 2);
      }
  // Norms need both weights, and head_dim up to 256.
  RopeKvExtras half;
  half.q_norm = reinterpret_cast<const __nv_bfloat16*>(&rng);  // never read: refused first
  PagedKvLayout layout{1, 1, 16, 64};
  CHECK(LaunchRopeKvStore(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, layout, 0, 1, 1, true, half,
                          nullptr) == cudaErrorInvalidValue);
}

// Llama 4: RoPE layers rotate interleaved pairs (2i, 2i + 1) in fp32, then (use_qk_norm) L2-
// normalise each q and k head; NoPE layers store q and K unrotated, q scaled by the temperature
// of its position. As with Qwen3's norm, the warp's sum order and rsqrtf may move a normed
// value by an ulp, and the rotation's fp32 products (fused or not) another.
TEST_CASE("Llama 4's q/k transforms (interleaved RoPE, L2 norm, NoPE temperature) match the reference") {
  std::mt19937 rng(16);
  struct Shape {
    int hq, hkv, d, block;
  };
  struct Mode {
    bool rotate, l2_norm, temperature;
  };
  for (Shape s : {Shape{40, 8, 128, 16}, Shape{4, 2, 16, 8}, Shape{5, 5, 64, 1}, Shape{8, 1, 256, 4}})
    for (Mode mode : {Mode{true, true, false}, Mode{true, false, false}, Mode{false, false, true}})
      for (bool per_seq : {false, true}) {
        const int tokens = 33, layers = 2, layer = 1, seqs = 2;
        PagedKvLayout layout{layers, s.hkv, s.block, s.d};
        const int num_blocks = tokens / s.block + 4;
        auto qkv = gputest::RandomBf16(size_t(tokens) * (s.hq + 2 * s.hkv) * s.d, rng, -4, 4);
        std::vector<int32_t> pos(tokens), slots(tokens), row(tokens), perm(num_blocks * s.block);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int t = 0; t < tokens; ++t) {
          pos[t] = 3 + 97 * t;  // temperature 1 below position 7, about 1.58 at the last
          slots[t] = t == 6 ? -1 : perm[t];
          row[t] = t % seqs;
        }
        RopeConfig rc;
        rc.head_dim = s.d;
        rc.interleaved = true;
        std::vector<float> inv = RopeInvFreq(rc);
        rc.theta = 10000.0;  // a second frequency row, picked per token when per_seq
        const std::vector<float> inv2 = RopeInvFreq(rc);
        inv.insert(inv.end(), inv2.begin(), inv2.end());
        auto pool = gputest::RandomBf16(num_blocks * layout.BlockElems(), rng);
        DeviceBuffer<bf16_bits> dqkv(qkv), dpool(pool), dq(size_t(tokens) * s.hq * s.d);
        DeviceBuffer<int32_t> dpos(pos), dslots(slots), drow(row);
        DeviceBuffer<float> dinv(inv);
        dq.Poison();
        RopeKvExtras ex;
        ex.interleaved = true;
        ex.l2_norm = mode.l2_norm;
        ex.norm_eps = 1e-5f;
        ex.temperature_scale = mode.temperature ? 0.1f : 0.f;
        ex.temperature_floor = mode.temperature ? 8.f : 0.f;
        ex.inv_freq_row = per_seq ? drow.get() : nullptr;
        KVF_CUDA_OK(LaunchRopeKvStore(dqkv.as<__nv_bfloat16>(), dpos.get(), dslots.get(), dinv.get(),
                                      dq.as<__nv_bfloat16>(), dpool.as<__nv_bfloat16>(), layout, layer, tokens, s.hq,
                                      mode.rotate, ex, nullptr));
        KVF_CUDA_OK(cudaDeviceSynchronize());
        // The reference takes one frequency row: each token through it alone.
        std::vector<bf16_bits> q(dq.size());
        const int row_elems = (s.hq + 2 * s.hkv) * s.d;
        for (int t = 0; t < tokens; ++t) {
          Llama4QkKvStoreRef(qkv.data() + size_t(t) * row_elems, &pos[t], &slots[t],
                             inv.data() + (per_seq ? size_t(row[t]) * s.d / 2 : 0), q.data() + size_t(t) * s.hq * s.d,
                             pool.data(), layout, layer, 1, s.hq, mode.rotate, mode.l2_norm, 1e-5f,
                             ex.temperature_scale, ex.temperature_floor);
        }
        CAPTURE(s.hq);
        CAPTURE(s.d);
        CAPTURE(mode.rotate);
        CAPTURE(mode.l2_norm);
        CAPTURE(mode.temperature);
        CAPTURE(per_seq);
        // An ulp off in a rotated value (sincosf, a fused multiply-add) moves its normed value by
        // one, the norm's own sum order and rsqrtf by one more, and rounding may add a third;
        // near zero (a pair's cancellation) the fp32 rotation's error is about 1e-6 of the
        // inputs (up to 4 here, unit RMS after the norm), far under the 1e-4 floor.
        const int ulps = mode.l2_norm ? 3 : 2;
        const float floor = mode.rotate ? 1e-4f : 0.f;
        CHECK(MaxUlpDiff(dq.Download(), q, floor) <= ulps);
        CHECK(MaxUlpDiff(dpool.Download(), pool, floor) <= ulps);
        if (mode.temperature) {  // q at the last position really is scaled: not the input
          const size_t q_last = size_t(tokens - 1) * row_elems;
          CHECK(q[size_t(tokens - 1) * s.hq * s.d] != qkv[q_last]);
        }
      }
  // Refused: rotate_half with Llama 4's transforms, and Qwen3's norm weights with them.
  RopeKvExtras l2;
  l2.l2_norm = true;
  PagedKvLayout layout{1, 1, 16, 64};
  CHECK(LaunchRopeKvStore(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, layout, 0, 1, 1, true, l2, nullptr) ==
        cudaErrorInvalidValue);
  l2.interleaved = true;
  l2.q_norm = l2.k_norm = reinterpret_cast<const __nv_bfloat16*>(&rng);  // never read: refused first
  CHECK(LaunchRopeKvStore(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, layout, 0, 1, 1, true, l2, nullptr) ==
        cudaErrorInvalidValue);
  RopeKvExtras f8;  // and an fp8 pool: the Llama 4 kernel stores bf16 only
  f8.interleaved = true;
  f8.kv_fp8 = reinterpret_cast<uint8_t*>(&rng);
  f8.scales = {reinterpret_cast<const float*>(&rng), reinterpret_cast<const float*>(&rng)};
  PagedKvLayout layout8 = layout;
  layout8.elem_bytes = 1;
  CHECK(LaunchRopeKvStore(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, layout8, 0, 1, 1, true, f8, nullptr) ==
        cudaErrorInvalidValue);
}

TEST_CASE("RoPE inverse frequencies follow Llama 3.1's scaling") {
  RopeConfig rc;  // Llama 3.1 8B: theta 500000, factor 8, low 1, high 4, original 8192
  rc.scaling.type = RopeScaling::Type::kLlama3;
  rc.scaling.factor = 8;
  auto inv = RopeInvFreq(rc);
  REQUIRE(inv.size() == 64);
  CHECK(inv[0] == doctest::Approx(1.0));                     // short wavelengths unchanged
  CHECK(inv[63] == doctest::Approx(std::pow(500000.0, -126.0 / 128) / 8).epsilon(1e-5));  // long: / factor
}

TEST_CASE("SiLU-and-mul matches the reference") {
  std::mt19937 rng(13);
  for (int inter : {8, 1536, 4864, 14336}) {
    const int rows = 9;
    auto gu = gputest::RandomBf16(size_t(rows) * 2 * inter, rng, -6, 6);
    DeviceBuffer<bf16_bits> dgu(gu), dout(size_t(rows) * inter);
    dout.Poison();
    KVF_CUDA_OK(LaunchSiluMul(dgu.as<__nv_bfloat16>(), dout.as<__nv_bfloat16>(), rows, inter, nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bf16_bits> out(dout.size());
    SiluMulRef(gu.data(), out.data(), rows, inter);
    CAPTURE(inter);
    CHECK(MaxUlpDiff(dout.Download(), out) <= 1);
  }
}

TEST_CASE("embedding lookup copies rows and zeroes out-of-range ids") {
  std::mt19937 rng(14);
  for (int hidden : {64, 576, 4096}) {
    const int vocab = 1000;
    auto table = gputest::RandomBf16(size_t(vocab) * hidden, rng);
    std::vector<int32_t> ids = {0, 999, 17, -1, 1000, 500, 17};
    DeviceBuffer<bf16_bits> dtable(table), dout(ids.size() * hidden);
    DeviceBuffer<int32_t> dids(ids);
    dout.Poison();
    KVF_CUDA_OK(LaunchEmbedding(dids.get(), dtable.as<__nv_bfloat16>(), dout.as<__nv_bfloat16>(),
                                static_cast<int>(ids.size()), vocab, hidden, nullptr));
    KVF_CUDA_OK(cudaDeviceSynchronize());
    std::vector<bf16_bits> out(dout.size());
    EmbeddingRef(ids.data(), table.data(), out.data(), static_cast<int>(ids.size()), vocab, hidden);
    CHECK(dout.Download() == out);
  }
}

}  // namespace
}  // namespace kvfleet::kernels
