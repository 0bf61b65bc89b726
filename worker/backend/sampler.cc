#include "worker/backend/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/check.h"
#include "kernels/sampling_common.h"

namespace kvfleet::backend {

void BuildLogitAdjusts(const SamplingParams& p, std::span<const TokenId> history, size_t prompt_len,
                       std::vector<kernels::LogitAdjust>* out) {
  out->clear();
  if (!p.penalized()) return;
  // (token, generated count) for every token seen; a sort keeps it allocation-light.
  const bool seen_matters = p.repetition_penalty != 1.0f;
  const bool counts_matter = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  std::vector<std::pair<TokenId, uint32_t>> seen;
  if (seen_matters || counts_matter) {
    const size_t from = seen_matters ? 0 : std::min(prompt_len, history.size());
    seen.reserve(history.size() - from);
    for (size_t i = from; i < history.size(); ++i) seen.emplace_back(history[i], i >= prompt_len ? 1u : 0u);
    std::sort(seen.begin(), seen.end());
  }
  auto bias = std::vector<std::pair<TokenId, float>>(p.logit_bias.begin(), p.logit_bias.end());
  std::sort(bias.begin(), bias.end());
  size_t i = 0, b = 0;
  while (i < seen.size() || b < bias.size()) {
    const TokenId t = i < seen.size() && (b == bias.size() || seen[i].first <= bias[b].first) ? seen[i].first
                                                                                              : bias[b].first;
    kernels::LogitAdjust a;
    a.token = static_cast<int32_t>(t);
    if (i < seen.size() && seen[i].first == t) {
      uint32_t generated = 0;
      for (; i < seen.size() && seen[i].first == t; ++i) generated += seen[i].second;
      a.repetition = p.repetition_penalty;
      a.subtract = p.frequency_penalty * static_cast<float>(generated) + (generated > 0 ? p.presence_penalty : 0.0f);
    }
    if (b < bias.size() && bias[b].first == t) a.bias = bias[b++].second;
    out->push_back(a);
  }
}

TokenLogprobs ComputeLogprobs(std::span<const float> logits, TokenId token, int32_t top) {
  KVF_CHECK(token < logits.size() && top >= 0 && static_cast<size_t>(top) <= logits.size());
  double max = -INFINITY;
  for (float l : logits) max = std::max<double>(max, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double lse = max + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(logits[token] - lse);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  auto higher = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + top, order.end(), higher);
  for (int32_t k = 0; k < top; ++k) {
    out.top.emplace_back(static_cast<TokenId>(order[k]), static_cast<float>(logits[order[k]] - lse));
  }
  return out;
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

void MaskLogits(std::span<float> logits, std::span<const uint32_t> allowed) {
  KVF_CHECK(allowed.size() * 32 >= logits.size());
  for (size_t w = 0; w * 32 < logits.size(); ++w) {
    const uint32_t bits = allowed[w];
    if (bits == UINT32_MAX) continue;
    const size_t end = std::min(logits.size(), w * 32 + 32);
    for (size_t i = w * 32; i < end; ++i) {
      if (!kernels::TokenAllowed(allowed.data(), static_cast<int64_t>(i))) logits[i] = -INFINITY;
    }
  }
}

TokenId Sampler::Sample(std::span<const float> logits, const SamplingParams& p, uint64_t seed, uint64_t counter,
                        std::span<const kernels::LogitAdjust> adjust, std::span<const uint32_t> allowed) {
  KVF_CHECK(!logits.empty());
  KVF_DCHECK(ValidateSampling(p).ok());
  if (!adjust.empty() || !allowed.empty()) {
    adjusted_.assign(logits.begin(), logits.end());
    for (const kernels::LogitAdjust& a : adjust) {
      KVF_CHECK(static_cast<size_t>(a.token) < adjusted_.size());
      adjusted_[a.token] = kernels::AdjustLogit(adjusted_[a.token], a);
    }
    if (!allowed.empty()) MaskLogits(adjusted_, allowed);
    logits = adjusted_;
  }
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

  if (p.min_p > 0.0f) {  // probs_ are relative to the top one (exp(0) = 1)
    for (float& x : probs_) x = x >= p.min_p ? x : 0.0f;
  }
  const bool top_k_on = p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab;
  const bool top_p_on = p.top_p < 1.0f;
  const float u = SampleUniform(seed, counter);
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
