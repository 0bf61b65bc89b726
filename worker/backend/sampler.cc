#include "worker/backend/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/check.h"

namespace kvfleet::backend {

Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return InvalidArgument("sampling: temperature must be a finite number >= 0, got " +
                           std::to_string(p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
    return InvalidArgument("sampling: top_p must be in (0, 1], got " + std::to_string(p.top_p));
  }
  if (p.top_k < 0) return InvalidArgument("sampling: top_k must be >= 0, got " + std::to_string(p.top_k));
  return Status::Ok();
}

TokenId ArgMax(std::span<const float> logits) {
  KVF_CHECK(!logits.empty());
  size_t best = 0;
  float best_v = -INFINITY;
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    float v = logits[i];
    if (v > best_v || (!found && !std::isnan(v))) {
      best_v = v;
      best = i;
      found = true;
    }
  }
  return static_cast<TokenId>(best);
}

TokenId Sampler::Sample(std::span<const float> logits, const SamplingParams& p, uint64_t counter) {
  KVF_CHECK(!logits.empty());
  KVF_DCHECK(ValidateSamplingParams(p).ok());
  if (p.temperature == 0.0f || p.top_k == 1) return ArgMax(logits);

  const size_t vocab = logits.size();
  const float max_logit = logits[ArgMax(logits)];
  const float inv_t = 1.0f / p.temperature;
  probs_.resize(vocab);
  for (size_t i = 0; i < vocab; ++i) {
    float e = std::exp((logits[i] - max_logit) * inv_t);
    probs_[i] = std::isnan(e) ? 0.0f : e;
  }
  // Descending probability, lower id first on ties.
  auto more_probable = [this](int32_t a, int32_t b) {
    return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
  };

  const bool top_k_on = p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab;
  const bool top_p_on = p.top_p < 1.0f;
  const float u = SampleUniform(p.seed, counter);
  if (!top_k_on && !top_p_on) {
    double mass = 0.0;
    for (float x : probs_) mass += x;
    const double target = u * mass;
    double run = 0.0;
    for (size_t i = 0; i < vocab; ++i) {
      run += probs_[i];
      if (run > target && probs_[i] > 0.0f) return static_cast<TokenId>(i);
    }
    return ArgMax(logits);  // only rounding can get here: u·mass at the very end
  }

  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  if (top_k_on) {
    std::nth_element(order_.begin(), order_.begin() + p.top_k, order_.end(), more_probable);
    order_.resize(p.top_k);
  }
  if (top_p_on) {
    std::sort(order_.begin(), order_.end(), more_probable);
    double kept_mass = 0.0;
    for (int32_t id : order_) kept_mass += probs_[id];
    const double limit = static_cast<double>(p.top_p) * kept_mass;
    double run = 0.0;
    size_t keep = 0;
    while (keep < order_.size()) {
      run += probs_[order_[keep]];
      ++keep;
      if (run >= limit) break;
    }
    order_.resize(std::max<size_t>(keep, 1));
  }
  std::sort(order_.begin(), order_.end());
  double mass = 0.0;
  for (int32_t id : order_) mass += probs_[id];
  const double target = u * mass;
  double run = 0.0;
  for (int32_t id : order_) {
    run += probs_[id];
    if (run > target && probs_[id] > 0.0f) return static_cast<TokenId>(id);
  }
  return static_cast<TokenId>(order_.back());
}

}  // namespace kvfleet::backend
