#include "router/routing/ttft_calibration.h"

#include <algorithm>
#include <cmath>

namespace kvfleet::router {

void TtftCalibration::Observe(const TtftTerms& terms, double actual_s) {
  const std::array<double, 4> x = {terms.queue_s, terms.own_s, terms.step_s, 1.0};
  const double y = actual_s - terms.rest_s;
  for (double v : x) {
    if (!std::isfinite(v) || v < 0) return;
  }
  if (!std::isfinite(y)) return;
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) xx_[i][j] = config::kCalibrationForgetting * xx_[i][j] + x[i] * x[j];
    xy_[i] = config::kCalibrationForgetting * xy_[i] + x[i] * y;
  }
  const uint64_t n = observations_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (n >= config::kCalibrationMinObservations && n % config::kCalibrationRefit == 0) Refit();
}

void TtftCalibration::ObserveEstimate(bool pulled, double estimated_s, double actual_s) {
  const double residual = actual_s - estimated_s;
  if (!std::isfinite(residual)) return;
  std::lock_guard lock(mu_);
  Residuals& r = pulled ? pulled_ : stayed_;
  const double f = pulled ? config::kPullResidualForgetting : config::kCalibrationForgetting;
  r.sum = f * r.sum + residual;
  r.weight = f * r.weight + 1;
  ++r.count;
  if (pulled_.count < config::kPullBiasMinObservations || stayed_.count < config::kPullBiasMinObservations) return;
  pull_bias_.store(pulled_.sum / pulled_.weight - stayed_.sum / stayed_.weight, std::memory_order_relaxed);
}

void TtftCalibration::Refit() {
  // Ridge toward θ = (1, 1, 1): (XᵀWX + λ·D) θ = XᵀWy + λ·D·θ₀, D = diag(1, 1, 1, 0). The
  // prior's weight is in observations: λ times the mean square of each term, so it weighs as
  // many observations whatever the terms' scale.
  std::array<std::array<double, 5>, 4> a{};
  const double f = config::kCalibrationForgetting;
  const auto n = static_cast<double>(observations_.load(std::memory_order_relaxed));
  const double weight = std::max((1 - std::pow(f, n)) / (1 - f), 1.0);  // Σ of the observations' weights
  for (size_t i = 0; i < 4; ++i) {
    for (size_t j = 0; j < 4; ++j) a[i][j] = xx_[i][j];
    a[i][4] = xy_[i];
  }
  for (size_t i = 0; i < 3; ++i) {
    const double lambda = config::kCalibrationPriorWeight * std::max(xx_[i][i] / weight, 1e-12);
    a[i][i] += lambda;
    a[i][4] += lambda * 1.0;
  }
  // Gaussian elimination with partial pivoting.
  for (size_t col = 0; col < 4; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < 4; ++r) {
      if (std::abs(a[r][col]) > std::abs(a[pivot][col])) pivot = r;
    }
    if (!(std::abs(a[pivot][col]) > 1e-18)) return;  // singular: keep the last fit
    std::swap(a[col], a[pivot]);
    for (size_t r = 0; r < 4; ++r) {
      if (r == col) continue;
      const double f = a[r][col] / a[col][col];
      for (size_t c = col; c < 5; ++c) a[r][c] -= f * a[col][c];
    }
  }
  std::array<double, 4> theta{};
  for (size_t i = 0; i < 4; ++i) theta[i] = a[i][4] / a[i][i];
  for (double t : theta) {
    if (!std::isfinite(t)) return;
  }
  auto clamp = [](double t) { return std::clamp(t, config::kMinCoefficient, config::kMaxCoefficient); };
  queue_.store(clamp(theta[0]), std::memory_order_relaxed);
  own_.store(clamp(theta[1]), std::memory_order_relaxed);
  step_.store(clamp(theta[2]), std::memory_order_relaxed);
  intercept_.store(theta[3], std::memory_order_relaxed);
}

}  // namespace kvfleet::router
