#include "router/routing/policy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "router/routing/peer_policies.h"

namespace kvfleet::router {

Result<Policy> ParsePolicy(std::string_view name) {
  if (name == "round_robin") return Policy::kRoundRobin;
  if (name == "least_loaded") return Policy::kLeastLoaded;
  if (name == "kv") return Policy::kKv;
  if (name == "approx") return Policy::kApprox;
  if (name == "kv_retention") return Policy::kKvRetention;
  if (name == "dynamo") return Policy::kDynamo;
  if (name == "llmd") return Policy::kLlmd;
  if (name == "sglang") return Policy::kSglang;
  if (name == "preble") return Policy::kPreble;
  return InvalidArgument("unknown routing policy '" + std::string(name) +
                         "' (expected round_robin, least_loaded, kv, approx, kv_retention, or for comparison "
                         "dynamo, llmd, sglang or preble)");
}

std::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kRoundRobin: return "round_robin";
    case Policy::kLeastLoaded: return "least_loaded";
    case Policy::kKv: return "kv";
    case Policy::kApprox: return "approx";
    case Policy::kKvRetention: return "kv_retention";
    case Policy::kDynamo: return "dynamo";
    case Policy::kLlmd: return "llmd";
    case Policy::kSglang: return "sglang";
    case Policy::kPreble: return "preble";
  }
  return "?";
}

Status RoutingOptions::Validate() const {
  if (!(temperature >= 0)) return InvalidArgument("routing temperature must be >= 0");
  if (!(hot_spot_factor == 0 || hot_spot_factor >= 1)) {
    return InvalidArgument("hot-spot factor must be 0 (off) or >= 1");
  }
  if (!(default_prefill_tokens_per_s > 0)) return InvalidArgument("default prefill rate must be > 0");
  if (!(onboard_s_per_block >= 0) || !(decode_s_per_running_request >= 0) || !(uncached_work_weight >= 0)) {
    return InvalidArgument("routing cost constants must be >= 0");
  }
  if (!(max_fleet_load >= 0 && max_fleet_load < 1)) return InvalidArgument("max fleet load must be in [0, 1)");
  if (fleet_load_window <= 0) return InvalidArgument("the fleet load window must be > 0");
  if (!(max_queued_requests >= 1)) return InvalidArgument("max queued requests must be >= 1");
  if (predicted_ttl < 0) return InvalidArgument("predicted TTL must be >= 0");
  if (approx_ttl < 0) return InvalidArgument("approx TTL must be >= 0");
  if (!(admission_ttft_s >= 0)) return InvalidArgument("the admission TTFT must be >= 0 seconds");
  if (!(max_waiting_requests >= 1)) return InvalidArgument("max waiting requests must be >= 1");
  return Status::Ok();
}

namespace {

// Per-thread scratch, so that a decision over a large fleet allocates nothing once warm. Each
// vector is used by one function at a time.
struct PickScratch {
  std::vector<double> rates;           // FleetMedian
  std::vector<size_t> eligible, cool;  // Pick
  std::vector<double> loads;           // Pick's hot-spot guard
  std::vector<double> costs, ttfts;    // PickLowestCost
};
thread_local PickScratch t_pick;

// Reorders `values`.
double Median(std::span<double> values) {
  if (values.empty()) return 0;
  size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  double hi = values[mid];
  if (values.size() % 2 == 1) return hi;
  double lo = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lo + hi) / 2;
}

// The median of `value` over the candidates `counts` keeps, `fallback` when it keeps none.
// Fleet-wide figures count each worker once: a pull candidate (pull_blocks > 0) is a second
// option of a worker already counted, not another worker; unless every candidate is one (a
// split request's decode workers, each with the prompt pulled).
template <typename Counts, typename Value>
double FleetMedian(std::span<const Candidate> candidates, Counts counts, Value value, double fallback) {
  const bool all_pulls = std::all_of(candidates.begin(), candidates.end(),
                                     [](const Candidate& c) { return c.pull_blocks > 0; });
  std::vector<double>& values = t_pick.rates;
  values.clear();
  for (const Candidate& c : candidates) {
    if (counts(c) && (c.pull_blocks == 0 || all_pulls)) values.push_back(value(c));
  }
  return values.empty() ? fallback : Median(values);
}

uint32_t CachedTokens(const RouteRequest& r, const Candidate& c) {
  const double blocks = (static_cast<double>(c.device_blocks) + c.host_blocks) * std::clamp(c.retained_share, 0.0, 1.0);
  const uint64_t cached = static_cast<uint64_t>(blocks * r.block_size);
  return static_cast<uint32_t>(std::min<uint64_t>(cached, r.prompt_tokens));
}

// A worker is never costed as slower than the fleet's median: a measured rate depends on
// the prompts the worker happened to get (a long prompt prefills slower, its attention
// reads growing with the context), and a worker rated slow after a few long prompts would
// get no work and so never measure again (README.md, "prefill rate").
double EffectiveRate(const Candidate& c, double fleet_rate) { return std::max(c.prefill_tokens_per_s, fleet_rate); }

// The wait before a prefill starts on `c`, whose queued prefill takes `queue_s` by its figures,
// with `admission_s` for a batch slot or KV blocks.
double QueueWait(const Candidate& c, double queue_s, double admission_s, const TtftCoefficients& k) {
  return k.queue * queue_s + c.device_prefill_s + admission_s;
}

// Whether `c` admits the request ahead of its queued prompts: a decode-role worker does so
// for a prompt with at most a block left to compute there (Candidate::role).
bool AheadOfQueue(const RouteRequest& request, const Candidate& c) {
  return c.role == WorkerRole::kDecode && request.prompt_tokens - CachedTokens(request, c) <= request.block_size;
}

// The wait `c` makes the request's prefill start after, beyond its queue: for admission.
double AdmissionWait(const RouteRequest& request, const Candidate& c) {
  return AheadOfQueue(request, c) ? c.pulled_wait_s : c.admission_wait_s;
}

}  // namespace

Picker::Picker(const RoutingOptions& options, uint64_t seed) : options_(options), rng_(seed) {}

TtftCoefficients Picker::Coefficients() const {
  return calibration_ != nullptr ? calibration_->coefficients() : TtftCoefficients{};
}

TtftCoefficients Picker::Coefficients(const Candidate& c) const {
  if (c.role == WorkerRole::kPrefill) return prefill_calibration_ != nullptr ? prefill_calibration_->coefficients() : TtftCoefficients{};
  return Coefficients();
}

double Picker::QueuedSeconds(const Candidate& c, double fleet_rate) const {
  return QueueWait(c, c.queued_prefill_tokens / EffectiveRate(c, fleet_rate), c.admission_wait_s, Coefficients(c));
}

double Picker::EstimateTtft(const RouteRequest& request, const Candidate& c, double fleet_rate) const {
  const TtftTerms t = Terms(request, c, fleet_rate);
  const TtftCoefficients k = Coefficients(c);
  // A pull overlaps the wait for the prefill queued ahead and for admission; what its first
  // tokens showed beyond that is its bias (ttft_calibration.h).
  const double queued = QueueWait(c, t.queue_s, AdmissionWait(request, c), k);
  double wait = std::max(queued, c.pull_s);
  if (c.pull_failed_share > 0) {
    // A pair whose pulls fail: the expected wait, a failure being its fallback's wait and then
    // the pulled blocks computed with the rest.
    const double pulled_s = static_cast<double>(c.pull_blocks) * request.block_size / EffectiveRate(c, fleet_rate);
    const double failed = std::max(queued, c.pull_failed_s) + k.own * pulled_s;
    wait += c.pull_failed_share * (failed - wait);
  }
  return wait + k.own * t.own_s + c.host_blocks * options_.onboard_s_per_block + k.step * t.step_s +
         c.adapter_load_s + c.pull_bias_s;
}

TtftTerms Picker::Terms(const RouteRequest& request, const Candidate& c, double fleet_rate) const {
  const double rate = EffectiveRate(c, fleet_rate);
  TtftTerms t;
  t.queue_s = AheadOfQueue(request, c) ? 0 : c.queued_prefill_tokens / rate;
  t.own_s = static_cast<double>(request.prompt_tokens - CachedTokens(request, c)) / rate;
  t.step_s = DecodeSeconds(c);
  t.rest_s = c.device_prefill_s + AdmissionWait(request, c) + c.host_blocks * options_.onboard_s_per_block +
             c.adapter_load_s;
  return t;
}

double Picker::DecodeSeconds(const Candidate& c) const {
  if (c.step_s < 0) return c.running_requests * options_.decode_s_per_running_request;
  return c.running_requests > 0 ? c.step_s : 0;
}

double Picker::FleetStepPerRequest(std::span<const Candidate> candidates) const {
  return FleetMedian(
      candidates, [](const Candidate& c) { return c.step_s > 0 && c.running_requests > 0; },
      [](const Candidate& c) { return c.step_s / c.running_requests; }, options_.decode_s_per_running_request);
}

double Picker::PullDeadline(const RouteRequest& request, const Candidate& c, double fleet_rate) const {
  const double rate = EffectiveRate(c, fleet_rate);
  const double queued = QueuedSeconds(c, fleet_rate);
  const double recompute = static_cast<double>(c.pull_blocks) * request.block_size / rate;
  return std::max(2 * c.pull_s, queued + recompute);
}

double Picker::FleetRate(std::span<const Candidate> candidates) const {
  return FleetMedian(
      candidates, [](const Candidate& c) { return c.prefill_tokens_per_s > 0; },
      [](const Candidate& c) { return static_cast<double>(c.prefill_tokens_per_s); },
      options_.default_prefill_tokens_per_s);
}

double Picker::DelayedRequests(std::span<const Candidate> candidates, double fleet_load) const {
  double waiting = 0;
  size_t workers = 0;
  for (const Candidate& c : candidates) {
    if (c.pull_blocks > 0) continue;
    waiting += c.waiting_requests;
    ++workers;
  }
  const double mean = workers == 0 ? 0 : waiting / static_cast<double>(workers);
  // An M/G/1 busy period started by work V lasts V / (1 − ρ) (Kleinrock, Queueing Systems
  // vol. 1, §5.8): the requests the backlog delays keep arriving for that long.
  const double rho = std::clamp(fleet_load, 0.0, options_.max_fleet_load);
  return std::max(options_.uncached_work_weight, mean / (1 - rho));
}

// The work is priced at the fleet's rate, not the worker's own: a worker's measured rate is the
// prefill share of its steps, high while few of its requests decode (its queue still holds
// them), and those decodes progress in the same steps elsewhere. Priced at its own rate, a
// worker with a long queue measured fastest and drew the long prompts behind it
// (README.md, "A long queue does not buy long prompts"). Its own rate stays in its TTFT.
double Picker::CostWithTtft(const RouteRequest& request, const Candidate& c, double fleet_rate, double delayed,
                            double step_per_request, double ttft) const {
  double uncached = static_cast<double>(request.prompt_tokens - CachedTokens(request, c));
  // The tied requests that follow each free one (RouteRequest::follow_ups; 0 for a tied request)
  // go where their prefix is cached, seconds later, and each waits on that worker's steps then.
  // What lasts that long is the requests it runs (their conversations), not its measured step:
  // a worker's step off the fleet's mean did not outlast half a second (README.md).
  const double follow_ups = request.follow_ups * Coefficients(c).step * c.running_requests * step_per_request;
  return ttft + delayed * uncached / fleet_rate + follow_ups;
}

namespace {
// A worker's place among equal costs under a router's salt: splitmix64's finalizer, so each
// salt orders the workers differently (ids are distinct, so ranks are).
uint64_t TieRank(WorkerId worker, uint64_t salt) {
  uint64_t x = (uint64_t{worker} + 1) * 0x9E3779B97F4A7C15ULL ^ salt;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

size_t Picker::PickLowestCost(const RouteRequest& request, std::span<const Candidate> candidates,
                              std::span<const size_t> eligible, const Prepared* prepared, double* cost) {
  // The fleet's median rate: a floor under each worker's own (EffectiveRate).
  const double fallback = prepared != nullptr ? prepared->fleet_rate : FleetRate(candidates);
  const double delayed = DelayedRequests(candidates, request.fleet_load);
  const double step_per_request = request.follow_ups > 0 ? FleetStepPerRequest(candidates) : 0;
  std::vector<double>& costs = t_pick.costs;
  std::vector<double>& ttfts = t_pick.ttfts;
  costs.resize(eligible.size());
  ttfts.resize(eligible.size());
  for (size_t i = 0; i < eligible.size(); ++i) {
    const Candidate& c = candidates[eligible[i]];
    ttfts[i] = prepared != nullptr ? prepared->ttft[eligible[i]] : EstimateTtft(request, c, fallback);
    costs[i] = CostWithTtft(request, c, fallback, delayed, step_per_request, ttfts[i]);
  }
  auto better = [&](size_t a, size_t b) {  // positions in eligible
    if (costs[a] != costs[b]) return costs[a] < costs[b];
    const Candidate& ca = candidates[eligible[a]];
    const Candidate& cb = candidates[eligible[b]];
    if (ca.device_blocks != cb.device_blocks) return ca.device_blocks > cb.device_blocks;
    if (options_.tie_salt != 0) return TieRank(ca.worker, options_.tie_salt) < TieRank(cb.worker, options_.tie_salt);
    return ca.worker < cb.worker;
  };
  size_t best = 0;
  for (size_t i = 1; i < eligible.size(); ++i) {
    if (better(i, best)) best = i;
  }
  if (options_.temperature > 0 && eligible.size() > 1) {
    // Dynamo-style: softmax over costs normalized to [0, 1], so the temperature means the
    // same thing whatever the absolute TTFTs are.
    // Every candidate has its chance: the operator asked for spread.
    double lo = *std::min_element(costs.begin(), costs.end());
    double hi = *std::max_element(costs.begin(), costs.end());
    double span = hi - lo;
    if (span > 0) {
      std::vector<double> weights(costs.size());
      for (size_t i = 0; i < costs.size(); ++i) {
        weights[i] = std::exp(-((costs[i] - lo) / span) / options_.temperature);
      }
      std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
      std::lock_guard<std::mutex> lock(rng_mu_);
      best = dist(rng_);
    }
  }
  *cost = ttfts[best];
  return eligible[best];
}

Result<Choice> Picker::Pick(Policy policy, const RouteRequest& request, std::span<const Candidate> candidates,
                            const Prepared* prepared) {
  std::vector<size_t>& eligible = t_pick.eligible;
  eligible.clear();
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].queued_requests < options_.max_queued_requests) eligible.push_back(i);
  }
  if (eligible.empty()) {
    return ResourceExhausted("every worker serving the model has " +
                             std::to_string(static_cast<int64_t>(options_.max_queued_requests)) +
                             " or more requests queued");
  }
  Choice d;
  switch (policy) {
    case Policy::kRoundRobin:
      d.index = eligible[next_.fetch_add(1, std::memory_order_relaxed) % eligible.size()];
      break;
    case Policy::kLeastLoaded: {
      d.index = eligible[0];
      for (size_t i : eligible) {
        const Candidate& c = candidates[i];
        const Candidate& b = candidates[d.index];
        if (c.running_requests < b.running_requests ||
            (c.running_requests == b.running_requests && c.queued_prefill_tokens < b.queued_prefill_tokens)) {
          d.index = i;
        }
      }
      break;
    }
    case Policy::kKv:
    case Policy::kApprox:
    case Policy::kKvRetention: {
      if (options_.hot_spot_factor > 0) {
        std::vector<double>& loads = t_pick.loads;
        loads.clear();
        for (size_t i : eligible) {
          if (candidates[i].pull_blocks == 0) loads.push_back(candidates[i].running_requests);
        }
        double limit = std::max(options_.hot_spot_factor * Median(loads), options_.hot_spot_min_requests);
        std::vector<size_t>& cool = t_pick.cool;
        cool.clear();
        for (size_t i : eligible) {
          if (candidates[i].running_requests <= limit) cool.push_back(i);
        }
        // The least loaded worker is never above the median, so `cool` is empty only
        // when the limit is below it, which max() with min_requests >= 0 rules out.
        if (!cool.empty()) eligible.swap(cool);
      }
      d.index = PickLowestCost(request, candidates, eligible, prepared, &d.estimated_ttft_s);
      break;
    }
    case Policy::kDynamo: {
      std::lock_guard<std::mutex> lock(rng_mu_);
      d.index = eligible[peer::PickDynamo(request, candidates, eligible, options_.temperature, &rng_)];
      break;
    }
    case Policy::kLlmd: {
      std::lock_guard<std::mutex> lock(rng_mu_);
      d.index = eligible[peer::PickLlmd(request, candidates, eligible, &rng_)];
      break;
    }
    case Policy::kSglang:
      d.index = eligible[peer::PickSglang(request, candidates, eligible)];
      break;
    case Policy::kPreble:
      d.index = eligible[peer::PickPreble(request, candidates, eligible,
                                          prepared != nullptr ? prepared->fleet_rate : FleetRate(candidates),
                                          options_.decode_s_per_running_request)];
      break;
  }
  d.worker = candidates[d.index].worker;
  d.predicted_cached_tokens = CachedTokens(request, candidates[d.index]);
  return d;
}

}  // namespace kvfleet::router
