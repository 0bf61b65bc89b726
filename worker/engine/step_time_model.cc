#include "worker/engine/step_time_model.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace kvfleet::engine {

namespace {
// Feature scales: a typical step's P, D, K and Q are of order one in these units, so the
// normal equations are well conditioned and the prior weight means the same in every term.
constexpr double kScale[] = {1.0, 1.0, 1024.0, 64.0, 65536.0, 1048576.0};
// A typical step of the prior's GPU and model (a decode of 64 sequences): its weight in the
// fit is 1, which is what the prior's weight and kMinExcitation are counted in.
constexpr double kReferenceUs = 10'000;

// The coefficients in feature order.
std::array<double, 6> AsArray(const StepCoefficients& c) {
  return {c.base_us, c.prefill_step_us, c.prefill_token_us, c.decode_seq_us, c.kv_token_us, c.prefill_pair_us};
}
}  // namespace

void StepShape::AddDecode(uint32_t context) {
  ++decode_seqs;
  kv_tokens += context;
}

void StepShape::AddPrefill(uint32_t start, uint32_t n) {
  prefill_tokens += n;
  kv_tokens += uint64_t{start} + n;
  prefill_pairs += uint64_t{n} * start + uint64_t{n} * (n + 1) / 2;
}

StepShape StepShape::WithPrefill(uint32_t start, uint32_t n) const {
  StepShape s = *this;
  s.AddPrefill(start, n);
  return s;
}

StepTimeModel::StepTimeModel(const StepCoefficients& prior) {
  const std::array<double, kTerms> c = AsArray(prior);
  for (int i = 0; i < kTerms; ++i) {
    KVF_CHECK(std::isfinite(c[i]) && c[i] >= 0) << "step-time prior coefficient " << i << " = " << c[i];
    prior_[i] = c[i] * kScale[i];
  }
  theta_ = prior_;
  coefficients_ = prior;
}

StepTimeModel::Vec StepTimeModel::Features(const StepShape& s) {
  return {1.0,
          s.prefill_tokens > 0 ? 1.0 : 0.0,
          static_cast<double>(s.prefill_tokens) / kScale[2],
          static_cast<double>(s.decode_seqs) / kScale[3],
          static_cast<double>(s.kv_tokens) / kScale[4],
          static_cast<double>(s.prefill_pairs) / kScale[5]};
}

double StepTimeModel::PredictUs(const StepShape& shape) const {
  if (shape.empty()) return 0;
  const Vec x = Features(shape);
  double t = 0;
  for (int i = 0; i < kTerms; ++i) t += theta_[i] * x[i];
  return std::max(t, 0.0);
}

void StepTimeModel::Observe(const StepShape& shape, DurationNs measured) {
  if (shape.empty() || measured <= 0) return;
  const double predicted = std::max(PredictUs(shape), 1.0);
  const double y = static_cast<double>(measured) / static_cast<double>(kNsPerUs);
  const double rel = std::abs(y - predicted) / predicted;
  const double clip = config::kClip * relative_error_;
  double y_fit = y;
  if (rel > clip) {
    y_fit = predicted * (y > predicted ? 1.0 + clip : std::max(1.0 - clip, 0.0));
    ++outliers_;
  }
  relative_error_ += config::kErrorSmoothing * (std::min(rel, clip) - relative_error_);
  relative_error_ = std::max(relative_error_, config::kMinRelativeError);

  // Forget faster while the model is persistently wrong (a new GPU or model): the clipped
  // measurements it kept meanwhile say little about the truth.
  const double speedup = std::clamp(relative_error_ / config::kSettledRelativeError, 1.0, config::kMaxForgetSpeedup);
  const double forget = 1 - (1 - config::kForgetting) * speedup;
  // Relative least squares: a step's error counts in units of its predicted duration, so a
  // 10 ms decode is fitted as closely as a 200 ms prefill (weights are 1 at kReferenceUs).
  const double w = (kReferenceUs / predicted) * (kReferenceUs / predicted);
  const Vec x = Features(shape);
  for (int i = 0; i < kTerms; ++i) {
    for (int j = 0; j < kTerms; ++j) a_[i][j] = forget * a_[i][j] + w * x[i] * x[j];
    b_[i] = forget * b_[i] + w * x[i] * y_fit;
    excitation_[i] = forget * excitation_[i] + (1 - forget) * w * x[i] * x[i];
  }
  prior_weight_ = std::max(prior_weight_ * config::kPriorForgetting, config::kPriorFloor);
  ++observations_;
  Solve();
}

void StepTimeModel::Solve() {
  // Every term is a cost, so none may be negative (a negative one would also make a longer
  // chunk look cheaper): solve, fix the most negative term at zero, solve again (an active
  // set; at most kTerms rounds). Equations too ill-conditioned to solve keep the last fit.
  std::array<bool, kTerms> fixed{};
  Vec theta{};
  for (int round = 0; round < kTerms; ++round) {
    if (!SolveFree(fixed, &theta)) return;
    int worst = -1;
    for (int i = 0; i < kTerms; ++i) {
      if (!fixed[i] && theta[i] < 0 && (worst < 0 || theta[i] < theta[worst])) worst = i;
    }
    if (worst < 0) break;
    fixed[worst] = true;
  }
  for (int i = 0; i < kTerms; ++i) theta_[i] = std::max(theta[i], 0.0);
  coefficients_ = StepCoefficients{theta_[0] / kScale[0], theta_[1] / kScale[1], theta_[2] / kScale[2],
                                   theta_[3] / kScale[3], theta_[4] / kScale[4], theta_[5] / kScale[5]};
}

bool StepTimeModel::SolveFree(const std::array<bool, kTerms>& fixed, Vec* theta) const {
  // M = Λ + A (symmetric positive definite: Λ is diagonal and positive), r = Λθ₀ + b, with
  // the fixed terms' rows and columns replaced by the identity and 0; then Cholesky.
  Mat m = a_;
  Vec r{};
  for (int i = 0; i < kTerms; ++i) {
    const double lambda = prior_weight_ * std::max(excitation_[i], config::kMinExcitation);
    m[i][i] += lambda;
    r[i] = lambda * prior_[i] + b_[i];
  }
  for (int i = 0; i < kTerms; ++i) {
    if (!fixed[i]) continue;
    for (int k = 0; k < kTerms; ++k) m[i][k] = m[k][i] = 0;
    m[i][i] = 1;
    r[i] = 0;
  }
  Mat l{};
  for (int j = 0; j < kTerms; ++j) {
    double d = m[j][j];
    for (int k = 0; k < j; ++k) d -= l[j][k] * l[j][k];
    if (!(d > 0) || !std::isfinite(d)) return false;  // rounding ate the diagonal
    l[j][j] = std::sqrt(d);
    for (int i = j + 1; i < kTerms; ++i) {
      double v = m[i][j];
      for (int k = 0; k < j; ++k) v -= l[i][k] * l[j][k];
      l[i][j] = v / l[j][j];
    }
  }
  Vec z{};
  for (int i = 0; i < kTerms; ++i) {
    double v = r[i];
    for (int k = 0; k < i; ++k) v -= l[i][k] * z[k];
    z[i] = v / l[i][i];
  }
  for (int i = kTerms - 1; i >= 0; --i) {
    double v = z[i];
    for (int k = i + 1; k < kTerms; ++k) v -= l[k][i] * (*theta)[k];
    (*theta)[i] = v / l[i][i];
  }
  for (double t : *theta) {
    if (!std::isfinite(t)) return false;
  }
  return true;
}

}  // namespace kvfleet::engine
