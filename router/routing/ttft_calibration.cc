#include "router/routing/ttft_calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

namespace {

// Solves m[0..n)[0..n) · x = m[0..n)[n] by Gaussian elimination with partial pivoting, in place.
// False when singular.
bool Solve(std::array<std::array<double, 5>, 4>& m, size_t n, std::array<double, 4>* x) {
  for (size_t col = 0; col < n; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < n; ++r) {
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    }
    if (!(std::abs(m[pivot][col]) > 1e-18)) return false;
    std::swap(m[col], m[pivot]);
    for (size_t r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (size_t c = col; c <= n; ++c) m[r][c] -= f * m[col][c];
    }
  }
  for (size_t i = 0; i < n; ++i) (*x)[i] = m[i][n] / m[i][i];
  return true;
}

}  // namespace

void TtftCalibration::Refit() {
  // Ridge toward θ = (1, 1, 1): minimize J(θ) = θᵀAθ − 2θᵀb with A = XᵀWX + λ·D and
  // b = XᵀWy + λ·D·θ₀, D = diag(1, 1, 1, 0). The prior's weight is in observations: λ times the
  // mean square of each term, so it weighs as many observations whatever the terms' scale.
  std::array<std::array<double, 4>, 4> a = xx_;
  std::array<double, 4> b = xy_;
  const double f = config::kCalibrationForgetting;
  const auto n = static_cast<double>(observations_.load(std::memory_order_relaxed));
  const double weight = std::max((1 - std::pow(f, n)) / (1 - f), 1.0);  // Σ of the observations' weights
  for (size_t i = 0; i < 3; ++i) {
    const double lambda = config::kCalibrationPriorWeight * std::max(xx_[i][i] / weight, 1e-12);
    a[i][i] += lambda;
    b[i] += lambda * 1.0;
  }
  // The three coefficients within [kMinCoefficient, kMaxCoefficient], the intercept free. The
  // constrained minimum lies on one face of that box: each coefficient free, at its lower
  // bound or at its upper. Of the 27 faces' minima, the least J among those inside the box is
  // it. (Clamping the unconstrained solution instead, coefficient by coefficient, ignores that
  // correlated terms make up for one another: a clamped queue term left the own term where the
  // queue's excess had pushed it.)
  const double bounds[2] = {config::kMinCoefficient, config::kMaxCoefficient};
  double best_j = std::numeric_limits<double>::infinity();
  std::array<double, 4> best{};
  for (int face = 0; face < 27; ++face) {
    std::array<int, 3> state = {face % 3, face / 3 % 3, face / 9};  // 0 free, 1 at min, 2 at max
    std::array<double, 4> theta{};
    std::array<size_t, 4> free{};
    size_t k = 0;
    for (size_t i = 0; i < 3; ++i) {
      if (state[i] == 0) free[k++] = i;
      else theta[i] = bounds[state[i] - 1];
    }
    free[k++] = 3;  // the intercept
    std::array<std::array<double, 5>, 4> m{};
    for (size_t r = 0; r < k; ++r) {
      double rhs = b[free[r]];
      for (size_t i = 0; i < 3; ++i) {
        if (state[i] != 0) rhs -= a[free[r]][i] * theta[i];
      }
      for (size_t c = 0; c < k; ++c) m[r][c] = a[free[r]][free[c]];
      m[r][k] = rhs;
    }
    std::array<double, 4> x{};
    if (!Solve(m, k, &x)) continue;
    bool inside = true;
    for (size_t r = 0; r < k; ++r) {
      theta[free[r]] = x[r];
      if (!std::isfinite(x[r])) inside = false;
      if (free[r] < 3 && (x[r] < bounds[0] - 1e-12 || x[r] > bounds[1] + 1e-12)) inside = false;
    }
    if (!inside) continue;
    double j = 0;
    for (size_t r = 0; r < 4; ++r) {
      for (size_t c = 0; c < 4; ++c) j += theta[r] * a[r][c] * theta[c];
      j -= 2 * theta[r] * b[r];
    }
    if (j < best_j) {
      best_j = j;
      best = theta;
    }
  }
  if (!std::isfinite(best_j)) return;  // every face singular: keep the last fit
  auto clamp = [](double t) { return std::clamp(t, config::kMinCoefficient, config::kMaxCoefficient); };
  queue_.store(clamp(best[0]), std::memory_order_relaxed);
  own_.store(clamp(best[1]), std::memory_order_relaxed);
  step_.store(clamp(best[2]), std::memory_order_relaxed);
  intercept_.store(best[3], std::memory_order_relaxed);
}

}  // namespace kvfleet::router
