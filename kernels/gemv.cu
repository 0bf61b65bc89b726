#include "kernels/gemv.cuh"

namespace kvfleet::kernels {
namespace {

template <int kN>
cudaError_t Launch(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, void* y, bool out_f32,
                   int32_t m, int32_t k, cudaStream_t stream) {
  constexpr int kRowsPerBlock = gemv::kWarps * gemv::kRowsPerWarp;
  const dim3 grid((m + kRowsPerBlock - 1) / kRowsPerBlock);
  if (out_f32) {
    return LaunchKernel(gemv::GemvKernel<kN, float>, grid, gemv::kThreads, 0, stream, w, x, bias,
                        static_cast<float*>(y), m, k);
  }
  return LaunchKernel(gemv::GemvKernel<kN, __nv_bfloat16>, grid, gemv::kThreads, 0, stream, w, x, bias,
                      static_cast<__nv_bfloat16*>(y), m, k);
}

template <int kN>
cudaError_t LaunchSilu(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, __nv_bfloat16* out,
                       int32_t inter, int32_t k, cudaStream_t stream) {
  const dim3 grid((inter + gemv::kWarps - 1) / gemv::kWarps);  // one gate/up pair per warp
  return LaunchKernel(gemv::GemvKernel<kN, __nv_bfloat16, true>, grid, gemv::kThreads, 0, stream, w, x, bias, out,
                      inter, k);
}

bool Supported(const __nv_bfloat16* w, const __nv_bfloat16* x, int32_t n, int32_t k) {
  return n >= 1 && n <= kGemvMaxRows && k > 0 && k % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16 == 0;
}

}  // namespace

cudaError_t LaunchGemvSiluMul(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias,
                              __nv_bfloat16* out, int32_t inter, int32_t n, int32_t k, cudaStream_t stream) {
  if (inter <= 0) return cudaSuccess;
  if (!Supported(w, x, n, k)) return cudaErrorInvalidValue;
  switch (n) {
    case 1: return LaunchSilu<1>(w, x, bias, out, inter, k, stream);
    case 2: return LaunchSilu<2>(w, x, bias, out, inter, k, stream);
    case 3: return LaunchSilu<3>(w, x, bias, out, inter, k, stream);
    case 4: return LaunchSilu<4>(w, x, bias, out, inter, k, stream);
    case 5: return LaunchSilu<5>(w, x, bias, out, inter, k, stream);
    case 6: return LaunchSilu<6>(w, x, bias, out, inter, k, stream);
    case 7: return LaunchSilu<7>(w, x, bias, out, inter, k, stream);
    default: return LaunchSilu<8>(w, x, bias, out, inter, k, stream);
  }
}

cudaError_t LaunchGemv(const __nv_bfloat16* w, const __nv_bfloat16* x, const __nv_bfloat16* bias, void* y,
                       bool out_f32, int32_t m, int32_t n, int32_t k, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (!Supported(w, x, n, k)) return cudaErrorInvalidValue;
  switch (n) {
    case 1: return Launch<1>(w, x, bias, y, out_f32, m, k, stream);
    case 2: return Launch<2>(w, x, bias, y, out_f32, m, k, stream);
    case 3: return Launch<3>(w, x, bias, y, out_f32, m, k, stream);
    case 4: return Launch<4>(w, x, bias, y, out_f32, m, k, stream);
    case 5: return Launch<5>(w, x, bias, y, out_f32, m, k, stream);
    case 6: return Launch<6>(w, x, bias, y, out_f32, m, k, stream);
    case 7: return Launch<7>(w, x, bias, y, out_f32, m, k, stream);
    default: return Launch<8>(w, x, bias, y, out_f32, m, k, stream);
  }
}

}  // namespace kvfleet::kernels
