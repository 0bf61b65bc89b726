#include "router/routing/peer_policies.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvfleet::router::peer {
namespace {

double Blocks(double tokens, uint32_t block_size) { return tokens / block_size; }

double CachedTokens(const RouteRequest& r, const Candidate& c) {
  return std::min<double>((static_cast<double>(c.device_blocks) + c.host_blocks) * r.block_size, r.prompt_tokens);
}

// A uniformly random one of the positions whose value equals the best.
size_t RandomAmongBest(const std::vector<double>& values, double best, std::mt19937_64* rng) {
  std::vector<size_t> ties;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == best) ties.push_back(i);
  }
  if (ties.size() == 1) return ties[0];
  return ties[std::uniform_int_distribution<size_t>(0, ties.size() - 1)(*rng)];
}

}  // namespace

double DynamoCost(const RouteRequest& request, const Candidate& c) {
  const double prompt_blocks = Blocks(request.prompt_tokens, request.block_size);
  const double active_prefill_blocks = Blocks(c.queued_prefill_tokens, request.block_size);
  const double credit = config::kDynamoDeviceCredit * c.device_blocks + config::kDynamoHostCredit * c.host_blocks;
  return config::kDynamoOverlapWeight * std::max(active_prefill_blocks + prompt_blocks - credit, 0.0) +
         c.decode_blocks;
}

size_t PickDynamo(const RouteRequest& request, std::span<const Candidate> candidates, std::span<const size_t> eligible,
                  double temperature, std::mt19937_64* rng) {
  std::vector<double> costs;
  for (size_t i : eligible) costs.push_back(DynamoCost(request, candidates[i]));
  const double lo = *std::min_element(costs.begin(), costs.end());
  const double hi = *std::max_element(costs.begin(), costs.end());
  if (temperature <= 0) return RandomAmongBest(costs, lo, rng);
  // Dynamo's softmax_sample: logits min-max normalized, so the temperature means the same
  // whatever the costs' scale; all equal: uniform.
  std::vector<double> weights(costs.size(), 1.0);
  if (hi > lo) {
    for (size_t i = 0; i < costs.size(); ++i) weights[i] = std::exp(-((costs[i] - lo) / (hi - lo)) / temperature);
  }
  std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
  return dist(*rng);
}

std::vector<double> LlmdScores(const RouteRequest& request, std::span<const Candidate> candidates,
                               std::span<const size_t> eligible) {
  double min_q = candidates[eligible[0]].queued_requests;
  double max_q = min_q;
  for (size_t i : eligible) {
    min_q = std::min(min_q, candidates[i].queued_requests);
    max_q = std::max(max_q, candidates[i].queued_requests);
  }
  // The precise prefix scorer's denominator: the prompt's full blocks (the ones it hashes).
  const double prompt_blocks = std::max<double>(1, request.prompt_tokens / request.block_size);
  std::vector<double> scores;
  for (size_t i : eligible) {
    const Candidate& c = candidates[i];
    const double prefix =
        std::min(1.0, (config::kLlmdGpuTierWeight * c.device_blocks + config::kLlmdCpuTierWeight * c.host_blocks) /
                          prompt_blocks);
    const double kv = 1.0 - std::clamp(c.kv_usage, 0.0, 1.0);
    const double queue = max_q == min_q ? 1.0 : (max_q - c.queued_requests) / (max_q - min_q);
    scores.push_back(config::kLlmdPrefixWeight * prefix + config::kLlmdKvUtilizationWeight * kv +
                     config::kLlmdQueueWeight * queue);
  }
  return scores;
}

size_t PickLlmd(const RouteRequest& request, std::span<const Candidate> candidates, std::span<const size_t> eligible,
                std::mt19937_64* rng) {
  std::vector<double> scores = LlmdScores(request, candidates, eligible);
  return RandomAmongBest(scores, *std::max_element(scores.begin(), scores.end()), rng);
}

size_t PickSglang(const RouteRequest& request, std::span<const Candidate> candidates,
                  std::span<const size_t> eligible) {
  auto load = [&](size_t pos) { return candidates[eligible[pos]].running_requests; };
  size_t least = 0;
  size_t most = 0;
  for (size_t p = 1; p < eligible.size(); ++p) {
    if (load(p) < load(least)) least = p;
    if (load(p) > load(most)) most = p;
  }
  // Both conditions, as cache_aware.rs has them: a small absolute gap between lightly
  // loaded workers is not an imbalance, nor is a large one between heavily loaded ones.
  const bool imbalanced = load(most) - load(least) > config::kSglangBalanceAbsThreshold &&
                          load(most) > config::kSglangBalanceRelThreshold * load(least);
  if (imbalanced) return least;
  size_t best = 0;
  for (size_t p = 1; p < eligible.size(); ++p) {
    if (CachedTokens(request, candidates[eligible[p]]) > CachedTokens(request, candidates[eligible[best]])) best = p;
  }
  const double match_rate =
      request.prompt_tokens == 0 ? 0 : CachedTokens(request, candidates[eligible[best]]) / request.prompt_tokens;
  if (match_rate > config::kSglangCacheThreshold) return best;
  size_t smallest = 0;
  for (size_t p = 1; p < eligible.size(); ++p) {
    if (candidates[eligible[p]].device_cached_blocks < candidates[eligible[smallest]].device_cached_blocks) {
      smallest = p;
    }
  }
  return smallest;
}

double PrebleCost(const RouteRequest& request, const Candidate& c, double fleet_rate,
                  double decode_s_per_running_request) {
  const double rate = std::max(c.prefill_tokens_per_s, fleet_rate);
  const double uncached = request.prompt_tokens - CachedTokens(request, c);
  const double load = c.queued_prefill_tokens / rate + c.running_requests * decode_s_per_running_request;
  double eviction = 0;
  if (c.total_device_blocks > 0) {  // known from a load report
    const double empty = std::max(0.0, c.free_device_blocks - c.device_cached_blocks);
    const double evicted = std::max(0.0, std::ceil(Blocks(uncached, request.block_size)) - empty);
    eviction = evicted * request.block_size / rate;
  }
  return load + eviction + uncached / rate;
}

size_t PickPreble(const RouteRequest& request, std::span<const Candidate> candidates, std::span<const size_t> eligible,
                  double fleet_rate, double decode_s_per_running_request) {
  size_t best = 0;
  for (size_t p = 1; p < eligible.size(); ++p) {
    const Candidate& c = candidates[eligible[p]];
    const Candidate& b = candidates[eligible[best]];
    const double cc = CachedTokens(request, c);
    const double cb = CachedTokens(request, b);
    if (cc > cb || (cc == cb && PrebleCost(request, c, fleet_rate, decode_s_per_running_request) <
                                    PrebleCost(request, b, fleet_rate, decode_s_per_running_request))) {
      best = p;
    }
  }
  const double cached = CachedTokens(request, candidates[eligible[best]]);
  if (cached > request.prompt_tokens - cached) return best;  // exploit
  size_t cheapest = 0;
  double cheapest_cost = PrebleCost(request, candidates[eligible[0]], fleet_rate, decode_s_per_running_request);
  for (size_t p = 1; p < eligible.size(); ++p) {
    const double cost = PrebleCost(request, candidates[eligible[p]], fleet_rate, decode_s_per_running_request);
    if (cost < cheapest_cost) {
      cheapest = p;
      cheapest_cost = cost;
    }
  }
  return cheapest;
}

}  // namespace kvfleet::router::peer
