#include "kernels/sampling_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/sampling_common.h"

namespace kvfleet::kernels {
namespace {

int32_t Argmax(const float* logits, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

bool Greedy(const SamplingRow& row) { return row.temperature <= 0 || row.top_k == 1; }

// The smallest logit key that survives top-k, min_p and top-p (the kernel's radix selections).
uint32_t SurvivorKey(const float* logits, int32_t vocab, const SamplingRow& row) {
  const float max = logits[Argmax(logits, vocab)];
  std::vector<uint32_t> keys(vocab);
  for (int32_t i = 0; i < vocab; ++i) keys[i] = FloatOrderKey(logits[i]);
  uint32_t threshold = 0;
  if (row.top_k > 0 && row.top_k < vocab) {
    std::vector<uint32_t> sorted = keys;
    std::nth_element(sorted.begin(), sorted.begin() + (row.top_k - 1), sorted.end(), std::greater<>());
    threshold = sorted[row.top_k - 1];
  }
  if (row.min_p > 0.f) threshold = std::max(threshold, FloatOrderKey(MinPThreshold(max, row.temperature, row.min_p)));
  if (row.top_p < 1.f) {
    std::vector<std::pair<uint32_t, uint64_t>> kept;  // (key, fixed-point probability)
    uint64_t total = 0;
    for (int32_t i = 0; i < vocab; ++i) {
      if (keys[i] < threshold) continue;
      const float prob = expf((logits[i] - max) / row.temperature);
      const uint64_t fixed = static_cast<uint64_t>(static_cast<double>(prob) * kProbFixedScale);
      kept.emplace_back(keys[i], fixed);
      total += fixed;
    }
    uint64_t target = static_cast<uint64_t>(std::ceil(static_cast<double>(row.top_p) * static_cast<double>(total)));
    target = std::max<uint64_t>(target, 1);
    std::sort(kept.begin(), kept.end(), [](auto& a, auto& b) { return a.first > b.first; });
    uint64_t cum = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      // Equal keys enter together: the threshold is a key, and ties are kept.
      size_t j = i;
      uint64_t mass = 0;
      while (j < kept.size() && kept[j].first == kept[i].first) mass += kept[j++].second;
      cum += mass;
      if (cum >= target) {
        threshold = std::max(threshold, kept[i].first);
        break;
      }
      i = j - 1;
    }
  }
  return threshold;
}

}  // namespace

std::vector<float> AdjustedRowRef(const float* logits, int32_t vocab, const SamplingRow& row) {
  std::vector<float> out(logits, logits + vocab);
  for (const LogitAdjust& a : row.adjust) out[a.token] = AdjustLogit(out[a.token], a);
  if (!row.allowed.empty()) {
    for (int32_t i = 0; i < vocab; ++i) {
      if (!TokenAllowed(row.allowed.data(), i)) out[i] = -INFINITY;
    }
  }
  return out;
}

LogprobsRef RowLogprobsRef(const float* logits, int32_t vocab, int32_t token, int32_t top) {
  double max = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) max = std::max<double>(max, logits[i]);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(logits[i] - max);
  const double lse = max + std::log(sum);
  LogprobsRef out;
  out.token_logprob = logits[token] - lse;
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  top = std::min(top, vocab);
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int32_t k = 0; k < top; ++k) {
    out.top_tokens.push_back(order[k]);
    out.top_logprobs.push_back(logits[order[k]] - lse);
  }
  return out;
}

std::vector<double> SamplingDistributionRef(const float* raw, int32_t vocab, const SamplingRow& row) {
  const std::vector<float> adjusted = AdjustedRowRef(raw, vocab, row);
  const float* logits = adjusted.data();
  std::vector<double> probs(vocab, 0.0);
  if (Greedy(row)) {
    probs[Argmax(logits, vocab)] = 1.0;
    return probs;
  }
  const uint32_t threshold = SurvivorKey(logits, vocab, row);
  const double max = logits[Argmax(logits, vocab)];
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (FloatOrderKey(logits[i]) < threshold) continue;
    probs[i] = std::exp((logits[i] - max) / row.temperature);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  return probs;
}

int32_t SampleRef(const float* raw, int32_t vocab, const SamplingRow& row) {
  const std::vector<float> adjusted = AdjustedRowRef(raw, vocab, row);
  const float* logits = adjusted.data();
  if (Greedy(row)) return Argmax(logits, vocab);
  const uint32_t threshold = SurvivorKey(logits, vocab, row);
  int32_t best = -1;
  float best_score = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) {
    if (FloatOrderKey(logits[i]) < threshold) continue;
    const float u = SampleUniform(row.seed, row.step, static_cast<uint64_t>(i));
    const float score = logits[i] / row.temperature - logf(-logf(u));
    if (best < 0 || score > best_score) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

}  // namespace kvfleet::kernels
