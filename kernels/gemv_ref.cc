#include "kernels/gemv_ref.h"

namespace kvfleet::kernels {

void GemvRef(const bf16_bits* w, const bf16_bits* x, const bf16_bits* bias, float* y, int32_t m, int32_t n,
             int32_t k) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double acc = bias != nullptr ? Bf16ToFloat(bias[i]) : 0.0;
      for (int64_t c = 0; c < k; ++c) acc += double(Bf16ToFloat(w[i * k + c])) * Bf16ToFloat(x[j * k + c]);
      y[j * m + i] = static_cast<float>(acc);
    }
}

}  // namespace kvfleet::kernels
