// Routing policies: which worker of a model's fleet gets a request.
//
// Router::Route (router.h) builds one Candidate per routable worker of the model's fleet
// that serves the request's LoRA adapter: how many of the prompt's leading blocks that
// worker holds (from the policy's index: the global index's events plus the router's
// predicted entries; for `approx` the predicted entries alone; none for round_robin and
// least_loaded) and its load (its reports blended with the router's own in-flight counts).
// Picker::Pick chooses among them. The cost model of the `kv` policy and every constant are
// explained in router/routing/README.md.
//
// Thread safety: Picker is thread-safe (round-robin state is atomic; kv's softmax draw
// and the dynamo and llmd policies' random draws take a mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <span>
#include <string_view>

#include "router/routing/ttft_calibration.h"
#include "common/clock.h"
#include "common/status.h"
#include "router/core/worker.h"
#include "schema/registration.h"

namespace kvfleet::router {

enum class Policy {
  kRoundRobin,   // every live worker in turn
  kLeastLoaded,  // fewest requests running + queued
  kKv,           // least estimated time to first token, from the event-fed index
  kApprox,       // kv's cost over an index of the router's own decisions only (no events)
  kKvRetention,  // kv, each hit discounted by its chance of eviction before the request runs
  // The peers' published rules, for comparison only (peer_policies.h).
  kDynamo,  // NVIDIA Dynamo's KV router cost
  kLlmd,    // llm-d's weighted scorers
  kSglang,  // SGLang router's cache_aware
  kPreble,  // Preble's E2
};

Result<Policy> ParsePolicy(std::string_view name);
std::string_view PolicyName(Policy policy);

// Defaults of RoutingOptions; README.md says why each value.
namespace config {
inline constexpr double kDefaultPrefillTokensPerSecond = 8'000.0;
inline constexpr double kOnboardSecondsPerBlock = 200e-6;
inline constexpr double kDecodeSecondsPerRunningRequest = 1e-3;
inline constexpr double kUncachedWorkWeight = 1.0;
inline constexpr double kMaxFleetLoad = 0.9;
inline constexpr DurationNs kFleetLoadWindow = 5 * kNsPerSec;
inline constexpr double kHotSpotFactor = 2.0;
inline constexpr double kHotSpotMinRequests = 32.0;
inline constexpr double kMaxQueuedRequests = 256.0;
inline constexpr DurationNs kPredictedTtl = 2 * kNsPerSec;
inline constexpr DurationNs kApproxTtl = 120 * kNsPerSec;
// A predicted entry lives predicted_ttl beyond the predicted first token (Router::Commit); a wait
// beyond this is past any first-token timeout, and counts as this (it only bounds the arithmetic).
inline constexpr double kMaxPredictedWaitSeconds = 600.0;
inline constexpr double kMaxWaitingRequests = 4096.0;
inline constexpr double kTransferBytesPerSecond = 2e9;
inline constexpr double kTransferSetupSeconds = 25e-3;
inline constexpr double kTransferIpcBytesPerSecond = 500e9;  // measured 700-930 GB/s, Constants (README)
inline constexpr uint32_t kSplitPrefillTokens = 1024;  // Dynamo's max_local_prefill_length; README.md says why
}  // namespace config

struct RoutingOptions {
  Policy policy = Policy::kKv;  // the default; a request may override it
  // Softmax temperature over costs normalized to [0, 1]; 0 picks the minimum.
  double temperature = 0.0;
  // Equal costs (idle workers holding nothing of the prompt) go to the lower worker id when 0.
  // Routers of one fleet set a salt of their own (Prepare: when gossip names peers), so each
  // ranks tied workers in its own order: with one order they would all send a burst to the
  // same idle worker until the next gossip told them (README.md, "Several routers").
  uint64_t tie_salt = 0;
  // Hot-spot guard: skip a worker running more than factor × the fleet's median
  // requests, unless it runs fewer than hot_spot_min_requests. 0 disables the guard.
  double hot_spot_factor = config::kHotSpotFactor;
  double hot_spot_min_requests = config::kHotSpotMinRequests;
  // Prefill rate assumed for a worker that has not reported one (tokens/s).
  double default_prefill_tokens_per_s = config::kDefaultPrefillTokensPerSecond;
  // Copying one block from the host tier back to the device (seconds).
  double onboard_s_per_block = config::kOnboardSecondsPerBlock;
  // What each running request adds to a new request's first token (seconds): decode
  // tokens go first in every engine step.
  double decode_s_per_running_request = config::kDecodeSecondsPerRunningRequest;
  // The kv cost adds max(weight, the fleet's mean waiting requests) × (uncached tokens / rate)
  // to the estimated TTFT: the prefill a choice adds, once per request it will delay (README.md).
  // 0: pure TTFT on an idle fleet.
  double uncached_work_weight = config::kUncachedWorkWeight;
  // The fleet's load ρ stretches that count to N / (1 − min(ρ, max_fleet_load)) (README.md): the
  // bound keeps one router's rough view of the load from charging a choice without limit.
  double max_fleet_load = config::kMaxFleetLoad;
  // The window over which the router measures the uncached prefill it sends a fleet (ns).
  DurationNs fleet_load_window = config::kFleetLoadWindow;
  // A worker with this many requests queued (not yet running) is saturated.
  double max_queued_requests = config::kMaxQueuedRequests;
  // Lifetime of the predicted index entries inserted after each decision, counted from the
  // decision's predicted first token (Router::Commit; ns). 0: no predicted entries.
  DurationNs predicted_ttl = config::kPredictedTtl;
  // Upper bound on an approx prediction's life (ns); within it the worker's modelled LRU
  // decides (README.md, "approx").
  DurationNs approx_ttl = config::kApproxTtl;
  // Admission (README.md): a request whose predicted time to first token exceeds this on
  // every worker is refused at once (429), rather than answered 504 after the wait. Seconds;
  // 0: no such check. The router's configuration derives it from --first-token-timeout-s.
  double admission_ttft_s = 0;
  // Requests of one model this router has sent and that have no first token yet; beyond it,
  // new ones are refused (429).
  double max_waiting_requests = config::kMaxWaitingRequests;
  // Pulling a prefix from its holder (README.md, "Pulling a prefix"): the bandwidth assumed
  // between two workers (bytes/s; 0: never pull) and the fixed cost of one pull (seconds).
  double transfer_bytes_per_s = config::kTransferBytesPerSecond;
  double transfer_setup_s = config::kTransferSetupSeconds;
  // Between two workers that copy device to device on one host (their Hellos' host ids match).
  double transfer_ipc_bytes_per_s = config::kTransferIpcBytesPerSecond;
  // Price a pull by its pair's measured pulls (their load reports' Load.pulls, PullFit), the
  // flags above being the prior; false: by the flags alone. Off by default: measured pulls are
  // cheaper than the flags' set-up on a mock fleet, and the holder's queue is over-estimated,
  // so pulls escape waits that are not there (README.md, "Pulling a prefix").
  bool transfer_measured = false;
  // Fit the kv cost model's time to first token to the first tokens that come (its queue,
  // own-prefill and step terms; ttft_calibration.h), instead of taking its terms at face value.
  bool calibrate_ttft = true;
  // P/D disaggregation (README.md, "Prefill and decode on different workers"): with prefill
  // workers in the fleet, a request whose prompt has at least this many tokens no
  // decode-capable worker holds is prefilled on a prefill worker and decoded where it is
  // pulled to. 0: never split (prefill workers then get nothing).
  uint32_t split_prefill_tokens = config::kSplitPrefillTokens;

  Status Validate() const;
};

// One worker that could take the request, as the router sees it now.
struct Candidate {
  WorkerId worker = 0;
  uint32_t device_blocks = 0;       // leading prompt blocks cached on the device tier
  uint32_t host_blocks = 0;         // further leading blocks cached on the host tier
  // Leading blocks it holds by its own events (PrefixMatch::held_blocks): what a pull from
  // it can bring. Its own, also in a pull candidate (which counts the pulled ones in device_blocks).
  uint32_t held_blocks = 0;
  // Beyond held_blocks, the run is the router's predicted entries: ms until the latest expires
  // (PrefixMatch::predicted_ms_left; 0: none, or not known).
  uint32_t predicted_ms_left = 0;
  double queued_prefill_tokens = 0; // prompt tokens admitted but not yet prefilled
  double running_requests = 0;      // active + queued requests
  double queued_requests = 0;       // waiting for admission
  double prefill_tokens_per_s = 0;  // measured; 0 = unknown
  // The worker's engine step as its last report measured it (its running requests over its decode
  // rate: each step decodes every one); what a request's first token waits for beside its prefill.
  // < 0: not measured, and each running request counts decode_s_per_running_request instead.
  double step_s = -1;
  // The worker's predicted wait beyond its prefill queue: for batch slots or KV blocks
  // (Contract 2's predictedWaitUs less its prefill term; README.md, "Admission"). Seconds.
  double admission_wait_s = 0;
  // The wait to admit a prompt whose prefix comes by a pull, with at most a block left to
  // compute (a split's decode part): Contract 2's pulledWaitUs. A decode-role worker admits
  // such prompts ahead of its queue, so there it is for a batch slot only (README.md,
  // "Prefill and decode on different workers"). Seconds.
  double pulled_wait_s = 0;
  // Seconds of prefill queued on the other workers of its device (their Hellos name the same
  // deviceId), each at its own rate: the device computes them before or beside this one's
  // (README.md, "Workers sharing a device"). 0: its device is its own.
  double device_prefill_s = 0;
  // 1 / the live workers on its device (itself included): the share of the device's compute
  // it counts in the fleet's capacity (Router::FleetLoad), so that ρ counts a device once.
  double device_share = 1;
  // The share of the matched blocks expected still cached when the request's prefill starts
  // (kv_retention: README.md, "Retention-aware routing"); 1 for every other policy.
  double retained_share = 1;
  // Seconds before the request's LoRA adapter is on the worker's device: 0 when resident or
  // for the base model, else the worker's announced load time (README.md, "LoRA adapters").
  double adapter_load_s = 0;
  // Requests there without a first token yet: this router's, and others' queued ones from the
  // report (the kv cost's DelayedRequests, README.md).
  double waiting_requests = 0;
  // For the peer policies (peer_policies.h), from the worker's last load report (0 without one)
  // and the index.
  double decode_blocks = 0;         // blocks held by decoding sequences
  double kv_usage = 0;              // device blocks in use / total, in [0, 1]
  double free_device_blocks = 0;    // free or evictable device blocks
  double total_device_blocks = 0;   // 0: no report
  // Device blocks the index holds for the worker (its cache's size); set for the sglang and
  // preble rules only, the ones that read it.
  double device_cached_blocks = 0;
  // A pull (README.md, "Pulling a prefix"): this candidate is the worker with pull_blocks more
  // leading blocks (counted in device_blocks) pulled from pull_from, which takes pull_s. The
  // pull runs while the request waits in the worker's queue: its first token waits for the
  // longer of the two.
  WorkerId pull_from = 0;
  uint32_t pull_blocks = 0;  // 0: no pull
  double pull_s = 0;
  // Of pull_s, the seconds before pull_from holds the pulled blocks: 0 when its events say it
  // holds them; else the prefix was routed there a moment ago and is still being computed
  // (predicted entries), and its prefill queue ahead is the wait (README.md, "Pulling a prefix
  // being computed").
  double pull_ready_s = 0;
  // Added to a pull's estimate: how much later than estimated pulls' first tokens came, beyond
  // the others' (TtftCalibration::pull_bias_s; 0 for a split's decode worker).
  double pull_bias_s = 0;
  // The share of this worker's pulls from pull_from that failed lately, and what a failure took
  // before its fallback (PullFit::FailedShare, FailedSeconds; 0 without failures): with that
  // share the pull is a wait of pull_failed_s and then the pulled blocks computed here too.
  double pull_failed_share = 0;
  double pull_failed_s = 0;
  // Its --role. A prefill worker's estimate takes the prefill pool's calibration
  // (Picker::Coefficients). A decode worker admits a prompt with at most a block left to compute
  // (a split's, pulled, or a whole request's nearly all cached) ahead of its queued prompts, so
  // such a request's estimate there has no queue term and waits pulled_wait_s for admission.
  WorkerRole role = WorkerRole::kBoth;
  // Its transfer service, as pulls compare it (WorkerLoads::LoadView::transfer_format): 0: it
  // serves no pulls.
  uint32_t transfer_format = 0;
  uint32_t transfer_host = 0;  // 0: no host id
};

struct RouteRequest {
  uint32_t prompt_tokens = 0;
  uint32_t block_size = 32;
  // ρ, the fleet's load in work: the uncached prefill tokens/s this router has sent the
  // model's fleet lately over the fleet's prefill rate (Router; README.md). 0: unknown.
  double fleet_load = 0;
  // The requests tied to a holder that follow each one free to be placed (FollowUps::PerStart;
  // README.md, "A conversation stays where it starts"), for a free request. 0: none, or tied.
  double follow_ups = 0;
};

// What the caller of Pick already computed for the same candidates, so that Pick need not
// again (Router::Route: admission estimated every candidate's TTFT).
struct Prepared {
  double fleet_rate = 0;           // REQUIRES: == Picker::FleetRate(candidates)
  std::span<const double> ttft;    // REQUIRES: [i] == EstimateTtft(request, candidates[i], fleet_rate)
};

// What Pick chose among the candidates.
struct Choice {
  WorkerId worker = 0;
  size_t index = 0;               // into the candidates
  double estimated_ttft_s = 0;    // kv / approx only
  uint32_t predicted_cached_tokens = 0;
};

class Picker {
 public:
  explicit Picker(const RoutingOptions& options, uint64_t seed = 0x6b7666);

  const RoutingOptions& options() const { return options_; }

  // Chooses a worker. Candidates that are saturated are skipped; when all are,
  // returns ResourceExhausted. REQUIRES: !candidates.empty(). `prepared` (may be null): the
  // candidates' figures already known; the choice is the same with or without them.
  Result<Choice> Pick(Policy policy, const RouteRequest& request, std::span<const Candidate> candidates,
                      const Prepared* prepared = nullptr);

  // The prefill rate standing in for workers that report none: the median of the
  // candidates' reported rates, else default_prefill_tokens_per_s.
  double FleetRate(std::span<const Candidate> candidates) const;
  // Estimated seconds to the first token of `request` on `c`. `fleet_rate` (the fleet's
  // median reported prefill rate) is a floor under c's own rate, and stands in for it when
  // c reports none (README.md, "prefill rate").
  double EstimateTtft(const RouteRequest& request, const Candidate& c, double fleet_rate) const;
  // EstimateTtft's terms, before the calibration's coefficients; `c` without a pull.
  TtftTerms Terms(const RouteRequest& request, const Candidate& c, double fleet_rate) const;
  // Scales EstimateTtft's terms by `calibration`'s coefficients (ttft_calibration.h), a
  // prefill-role candidate's by `prefill`'s; null (the default): by 1. REQUIRES: both outlive
  // the Picker; set before routing starts.
  void SetCalibration(const TtftCalibration* calibration, const TtftCalibration* prefill = nullptr) {
    calibration_ = calibration;
    prefill_calibration_ = prefill;
  }
  TtftCoefficients Coefficients() const;                    // the decode-capable workers'
  TtftCoefficients Coefficients(const Candidate& c) const;  // c's: its pool's
  // How long a pull candidate's worker waits for its pull before computing the prefix itself
  // (README.md, "Pulling a prefix"): twice the predicted pull_s, or the break-even with not
  // pulling, whichever is longer. The request waits for the prefill queued ahead anyway, and
  // the pulled blocks would take pull_blocks x B / rate to compute: a pull ending before that
  // still beats recomputing them on that worker.
  double PullDeadline(const RouteRequest& request, const Candidate& c, double fleet_rate) const;
  // Seconds before a request's prefill starts on `c`: the prefill queued ahead there (at its
  // rate, at least `fleet_rate`, times the calibration's queue coefficient), that of its
  // device mates and its admission wait.
  double QueuedSeconds(const Candidate& c, double fleet_rate) const;
  // Seconds the decodes running on `c` add to a request's first token: its measured step while
  // it runs any (Candidate::step_s), else decode_s_per_running_request each.
  double DecodeSeconds(const Candidate& c) const;
  // The fleet's step per running request: the median over the candidates that run requests and
  // report a step of step_s / running_requests (each worker once, as FleetRate counts them);
  // decode_s_per_running_request when none does.
  double FleetStepPerRequest(std::span<const Candidate> candidates) const;
  // How many later requests the prefill a choice adds will delay (README.md, "kv cost"): the
  // candidates' mean waiting_requests N (by Little's law, about as many arrive per worker
  // while the fleet's backlog drains), stretched by the backlog's busy period at the fleet's
  // load ρ (`fleet_load`), N / (1 − ρ), and at least uncached_work_weight.
  double DelayedRequests(std::span<const Candidate> candidates, double fleet_load = 0) const;

 private:
  size_t PickLowestCost(const RouteRequest& request, std::span<const Candidate> candidates,
                        std::span<const size_t> eligible, const Prepared* prepared, double* cost);
  // The kv cost of `c`, whose EstimateTtft at `fleet_rate` is `ttft`: that plus the prefill work
  // the choice adds at `fleet_rate`, times `delayed` (DelayedRequests), plus the steps the tied
  // requests that follow will wait on there (RouteRequest::follow_ups), its running requests at
  // `step_per_request` (FleetStepPerRequest) each (README.md).
  double CostWithTtft(const RouteRequest& request, const Candidate& c, double fleet_rate, double delayed,
                      double step_per_request, double ttft) const;

  RoutingOptions options_;
  const TtftCalibration* calibration_ = nullptr;
  const TtftCalibration* prefill_calibration_ = nullptr;
  std::atomic<uint64_t> next_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_;  // GUARDED_BY(rng_mu_)
};

}  // namespace kvfleet::router
