// The routing rules the peers publish, as kvfleet policies for comparison (`kvfleet bench
// --compare kv,dynamo,llmd,sglang,preble`). Each function implements one peer's rule over the
// same Candidates the kv policy sees (the event-fed index's matches and the blended load),
// with the peer's published constants (namespace config below, each with its source). None
// is a default. README.md ("The peer policies") gives each formula.
//
// What the peers see that kvfleet does not, or the reverse, is said at each rule: kvfleet
// has no disk tier (Dynamo's 0.25 credit never applies), and its index is the event-fed one
// for every policy (SGLang's router keeps its own approximate tree instead).
//
// Thread safety: pure functions; the caller serializes use of `rng`.
#pragma once

#include <cstddef>
#include <random>
#include <span>
#include <vector>

#include "router/routing/policy.h"

namespace kvfleet::router::peer {

namespace config {
// NVIDIA Dynamo KV router (docs.nvidia.com/dynamo, components/router, "Cost Function";
// lib/llm/src/kv_router/scheduler.rs): cost = overlap_weight × prefill blocks + decode blocks.
// --kv-overlap-score-weight defaults to 1: a prefill block and a decode block count the same.
inline constexpr double kDynamoOverlapWeight = 1.0;
// Overlap credit per matched block by tier (Dynamo's tiered overlap: device blocks are free,
// host blocks cost an onboard, disk blocks a read): 1.0 device, 0.75 host, 0.25 disk.
inline constexpr double kDynamoDeviceCredit = 1.0;
inline constexpr double kDynamoHostCredit = 0.75;
// llm-d inference scheduler (llm-d/llm-d-inference-scheduler, default EPP profile, and
// llm-d-kv-cache-manager's precise prefix scorer): score = 2·prefix + 1·kv-utilization + 1·queue.
inline constexpr double kLlmdPrefixWeight = 2.0;
inline constexpr double kLlmdKvUtilizationWeight = 1.0;
inline constexpr double kLlmdQueueWeight = 1.0;
// The precise prefix scorer's tier weights (kv-cache-manager's BackendConfigs: "gpu" 1.0, "cpu" 0.8).
inline constexpr double kLlmdGpuTierWeight = 1.0;
inline constexpr double kLlmdCpuTierWeight = 0.8;
// SGLang router cache_aware policy (sgl-project/sglang, sgl-router src/policies/cache_aware.rs,
// CacheAwareConfig defaults): the load is imbalanced when max − min > 64 requests and
// max > 1.5 × min; a match counts when it covers more than 0.3 of the prompt.
inline constexpr double kSglangBalanceAbsThreshold = 64.0;
inline constexpr double kSglangBalanceRelThreshold = 1.5;
inline constexpr double kSglangCacheThreshold = 0.3;
}  // namespace config

// Dynamo: the least cost_w = overlap_weight · max(active_prefill_blocks_w + prompt_blocks −
// credit_w, 0) + decode_blocks_w, credit_w = 1.0·device_blocks_w + 0.75·host_blocks_w. At
// temperature > 0, a draw from softmax(−ĉ / temperature) over costs normalized to [0, 1]
// (uniform when all are equal). Ties at temperature 0 go to a random one of the best, as in
// Dynamo. Returns a position in `eligible`. REQUIRES: !eligible.empty().
size_t PickDynamo(const RouteRequest& request, std::span<const Candidate> candidates,
                  std::span<const size_t> eligible, double temperature, std::mt19937_64* rng);
double DynamoCost(const RouteRequest& request, const Candidate& c);

// llm-d: the highest 2·prefix_w + kv_w + queue_w, where prefix_w = (1.0·device_blocks_w +
// 0.8·host_blocks_w) / prompt_blocks, kv_w = 1 − kv_usage_w and queue_w = (max_q − q_w) /
// (max_q − min_q) over the queued requests (1 for all when max_q == min_q, as in the Gateway
// API inference extension's queue scorer). Ties go to a random one of the best (its
// max-score picker shuffles first). Returns a position in `eligible`.
size_t PickLlmd(const RouteRequest& request, std::span<const Candidate> candidates, std::span<const size_t> eligible,
                std::mt19937_64* rng);
// Each eligible candidate's llm-d score, in `eligible` order.
std::vector<double> LlmdScores(const RouteRequest& request, std::span<const Candidate> candidates,
                               std::span<const size_t> eligible);

// SGLang cache_aware: when the running requests are imbalanced (max − min > 64 and max > 1.5·min),
// the fewest running requests; else the best match when its share of the prompt exceeds 0.3;
// else the worker caching the fewest blocks (SGLang's smallest tree). Returns a position in
// `eligible`.
size_t PickSglang(const RouteRequest& request, std::span<const Candidate> candidates, std::span<const size_t> eligible);

// Preble E2 (Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
// Serving", ICLR 2025, §3.2): exploit when the best match caches more of the prompt than it
// leaves uncached (the longest match; ties: the lighter load); else explore: the least
// load + eviction + prefill cost (PrebleCost). `fleet_rate` is the fleet's median prefill
// rate (Picker::FleetRate), a floor under each worker's. Returns a position in `eligible`.
size_t PickPreble(const RouteRequest& request, std::span<const Candidate> candidates,
                  std::span<const size_t> eligible, double fleet_rate, double decode_s_per_running_request);
// Preble's explore cost in seconds: L = the worker's queued prefill at its rate plus its
// running requests' decode (the paper sums the prefill and decode time of its recent requests),
// M = recomputing what must be evicted to fit the request's uncached blocks (blocks beyond its
// free, uncached ones), P = the request's uncached prefill at its rate.
double PrebleCost(const RouteRequest& request, const Candidate& c, double fleet_rate,
                  double decode_s_per_running_request);

}  // namespace kvfleet::router::peer
