// Helpers for the GPU kernel tests and benches: an owning device buffer, a CUDA-call check,
// seeded random bf16 data, the relative error of a result against its reference, and the
// median time of a launch by CUDA events (benches).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/bf16.h"

namespace kvfleet::gputest {

// Aborts with the call site on any CUDA error (tests and benches only).
#define KVF_CUDA_OK(call)                                                                                 \
  do {                                                                                                    \
    cudaError_t _e = (call);                                                                              \
    if (_e != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(_e)); \
      std::abort();                                                                                       \
    }                                                                                                     \
  } while (0)

// A device allocation of n elements of T, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { KVF_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void Upload(const std::vector<T>& host) {
    KVF_CUDA_OK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    KVF_CUDA_OK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills every byte with 0xff: a bf16 / fp32 NaN, so unwritten outputs show.
  void Poison() { KVF_CUDA_OK(cudaMemset(ptr_, 0xff, n_ * sizeof(T))); }
  T* get() const { return ptr_; }
  template <typename U>
  U* as() const {
    return reinterpret_cast<U*>(ptr_);
  }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

inline std::vector<kernels::bf16_bits> RandomBf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<kernels::bf16_bits> v(n);
  for (auto& x : v) x = kernels::FloatToBf16(dist(rng));
  return v;
}

// ||out - ref|| / ||ref||, or infinity when out holds a NaN or infinity.
inline double RelativeError(const std::vector<kernels::bf16_bits>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = kernels::Bf16ToFloat(out[i]);
    if (!std::isfinite(o)) return INFINITY;
    num += (o - ref[i]) * (o - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline std::vector<float> ToFloat(const std::vector<kernels::bf16_bits>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = kernels::Bf16ToFloat(v[i]);
  return f;
}

// Median milliseconds of one call of fn on the default stream: `reps` rounds of `per_round`
// calls between two events, after `warmup` calls.
inline double MedianCallMs(const std::function<void()>& fn, int reps, int warmup, int per_round = 1) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  KVF_CUDA_OK(cudaEventCreate(&a));
  KVF_CUDA_OK(cudaEventCreate(&b));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    KVF_CUDA_OK(cudaEventRecord(a));
    for (int j = 0; j < per_round; ++j) fn();
    KVF_CUDA_OK(cudaEventRecord(b));
    KVF_CUDA_OK(cudaEventSynchronize(b));
    KVF_CUDA_OK(cudaEventElapsedTime(&ms[i], a, b));
  }
  KVF_CUDA_OK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2] / per_round;
}

}  // namespace kvfleet::gputest
