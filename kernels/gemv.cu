#include "kernels/gemv.cuh"

namespace kvfleet::kernels {
namespace {

template <int kN, typename OutT, int kEpi, bool kNorm>
cudaError_t Launch(const gemv::Args& a, cudaStream_t stream) {
  // A warp takes two rows, or one pair (a.m counts pairs then).
  const int rows_per_block = kEpi == gemv::kStore ? gemv::kWarps * gemv::kRowsPerWarp : gemv::kWarps;
  const int64_t blocks = (a.m + rows_per_block - 1) / rows_per_block;
  auto kernel = gemv::GemvKernel<kN, OutT, kEpi, kNorm>;
  size_t smem = 0;
  if constexpr (kNorm) {
    smem = size_t{kN} * a.k * sizeof(__nv_bfloat16);
    if (smem > 48 * 1024) {
      const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (e != cudaSuccess) return e;
    }
  }
  return LaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)), gemv::kThreads, smem, stream, a);
}

template <typename OutT, int kEpi, bool kNorm>
cudaError_t Dispatch(const gemv::Args& a, int32_t n, cudaStream_t stream) {
  switch (n) {
    case 1: return Launch<1, OutT, kEpi, kNorm>(a, stream);
    case 2: return Launch<2, OutT, kEpi, kNorm>(a, stream);
    case 3: return Launch<3, OutT, kEpi, kNorm>(a, stream);
    case 4: return Launch<4, OutT, kEpi, kNorm>(a, stream);
    case 5: return Launch<5, OutT, kEpi, kNorm>(a, stream);
    case 6: return Launch<6, OutT, kEpi, kNorm>(a, stream);
    case 7: return Launch<7, OutT, kEpi, kNorm>(a, stream);
    default: return Launch<8, OutT, kEpi, kNorm>(a, stream);
  }
}

// The RoPE epilogue's row counts: at most kGemvRopeKvMaxRows.
template <bool kNorm>
cudaError_t DispatchRope(const gemv::Args& a, int32_t n, cudaStream_t stream) {
  static_assert(kGemvRopeKvMaxRows == 4);
  switch (n) {
    case 1: return Launch<1, __nv_bfloat16, gemv::kRopeKv, kNorm>(a, stream);
    case 2: return Launch<2, __nv_bfloat16, gemv::kRopeKv, kNorm>(a, stream);
    case 3: return Launch<3, __nv_bfloat16, gemv::kRopeKv, kNorm>(a, stream);
    default: return Launch<4, __nv_bfloat16, gemv::kRopeKv, kNorm>(a, stream);
  }
}

bool Supported(const __nv_bfloat16* w, const __nv_bfloat16* x, int32_t n, int32_t k) {
  return n >= 1 && n <= kGemvMaxRows && k > 0 && k % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 == 0;
}

}  // namespace

cudaError_t LaunchGemv(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, void* y,
                       bool out_f32, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (!Supported(w, x, n, k)) return cudaErrorInvalidValue;
  const gemv::Args a{w, x, bias, y, m, k, {}, {}};
  return out_f32 ? Dispatch<float, gemv::kStore, false>(a, n, stream)
                 : Dispatch<__nv_bfloat16, gemv::kStore, false>(a, n, stream);
}

cudaError_t LaunchGemvSiluMul(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                              __nv_bfloat16* out, int32_t inter, int32_t n, int32_t k, cudaStream_t stream) {
  if (inter <= 0) return cudaSuccess;
  if (!Supported(w, x, n, k)) return cudaErrorInvalidValue;
  return Dispatch<__nv_bfloat16, gemv::kSiluMul, false>(gemv::Args{w, x, bias, out, inter, k, {}, {}}, n, stream);
}

namespace {
bool NormSupported(const GemvRmsNorm& norm, const __nv_bfloat16* w, int32_t n, int32_t k) {
  return Supported(w, norm.x, n, k) && norm.weight != nullptr && int64_t{n} * k * 2 <= kGemvRmsNormMaxXBytes &&
         (norm.residual_out == nullptr || norm.residual_in != nullptr) &&
         (reinterpret_cast<uintptr_t>(norm.residual_in) | reinterpret_cast<uintptr_t>(norm.residual_out) |
          reinterpret_cast<uintptr_t>(norm.weight)) % 16 == 0;
}
}  // namespace

cudaError_t LaunchRmsNormGemv(const GemvRmsNorm& norm, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                              __nv_bfloat16* y, bool silu_mul, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (!NormSupported(norm, w, n, k)) return cudaErrorInvalidValue;
  const gemv::Args a{w, norm.x, bias, y, m, k, norm, {}};
  return silu_mul ? Dispatch<__nv_bfloat16, gemv::kSiluMul, true>(a, n, stream)
                  : Dispatch<__nv_bfloat16, gemv::kStore, true>(a, n, stream);
}

namespace {
bool RopeSupported(const GemvRopeKvStore& rope) {
  const int32_t D = rope.layout.head_dim;
  return D > 0 && D % 2 == 0 && rope.num_q_heads > 0 && rope.layout.num_kv_heads > 0 && rope.q_out != nullptr &&
         rope.positions != nullptr && rope.slots != nullptr && rope.inv_freq != nullptr &&
         rope.layout.elem_bytes == (rope.kv_fp8 != nullptr ? 1 : 2) &&
         (rope.kv_fp8 == nullptr || (rope.scales.k != nullptr && rope.scales.v != nullptr));
}
int32_t RopePairs(const GemvRopeKvStore& rope) {
  return (rope.num_q_heads + 2 * rope.layout.num_kv_heads) * (rope.layout.head_dim / 2);
}
}  // namespace

cudaError_t LaunchGemvRopeKv(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                             const GemvRopeKvStore& rope, int32_t n, int32_t k, cudaStream_t stream) {
  if (!Supported(w, x, n, k) || n > kGemvRopeKvMaxRows || !RopeSupported(rope)) return cudaErrorInvalidValue;
  const gemv::Args a{w, x, bias, nullptr, RopePairs(rope), k, {}, rope};
  return DispatchRope<false>(a, n, stream);
}

cudaError_t LaunchRmsNormGemvRopeKv(const GemvRmsNorm& norm, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                                    const GemvRopeKvStore& rope, int32_t n, int32_t k, cudaStream_t stream) {
  if (!NormSupported(norm, w, n, k) || n > kGemvRopeKvMaxRows || !RopeSupported(rope)) return cudaErrorInvalidValue;
  const gemv::Args a{w, norm.x, bias, nullptr, RopePairs(rope), k, norm, rope};
  return DispatchRope<true>(a, n, stream);
}

}  // namespace kvfleet::kernels
