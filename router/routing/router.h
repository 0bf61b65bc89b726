// Router: the routing decision for one request. Given the prompt's tokens, its model's
// fleet, its cache salt and a policy, it hashes the prompt's full blocks (Contract 1), asks
// the policy's index which workers hold its prefix, builds one Candidate per routable worker
// (its matched blocks, and its load: the worker's last report blended with this router's
// own in-flight counts and those of the fleet's other routers, README.md) and lets the Picker
// choose.
//
// A decision is used in two steps, so that the request leaves before the bookkeeping:
//   1. Route() decides; the caller forwards the request to decision.worker.
//   2. Commit() inserts the prompt's blocks as predicted entries for that worker (in the kv
//      index, and in the approx index once the approx policy is in use).
// Rerouter() gives the forwarding lane its retry: a new choice among the same candidates,
// the workers already tried excluded, on their loads at the time of the retry.
//
// Admission (README.md, "Admission"): every candidate's time to first token is predicted
// (Picker::EstimateTtft: the worker's queue as its load report and this router's own
// in-flight counts say, the admission wait it reports, and this request's own prefill).
// Only workers predicted within admission_ttft_s are chosen; when there is none, or the
// model has max_waiting_requests of this router's requests without a first token, or every
// worker is saturated, Route refuses at once and says why (Refusal), with a Retry-After
// derived from the predicted wait. A request no idle worker could serve in time is refused
// as unattainable (503): waiting would not help it.
//
// The fleet's load (README.md, "The kv cost model"): each decision's expected uncached prefill
// tokens feed a per-model DecayedRate; over the fleet's summed prefill rate it is the load ρ
// the kv cost reads (RouteRequest::fleet_load). It sees this router's decisions, and the
// other routers' rates as their gossip says (WorkerLoads::PeerWorkRate).
//
// Thread safety: thread-safe; the HTTP I/O threads route concurrently, each with its own
// scratch (thread_local: a warm thread allocates only the Decision). Besides the indexes',
// the fleet's and the Picker's locks, the Router's own guards the fleet load's rates.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "router/core/worker.h"
#include "router/fleet/fleet.h"
#include "router/index/prefix_index.h"
#include "router/index/retention_estimate.h"
#include "router/routing/decision_log.h"
#include "router/routing/policy.h"
#include "router/routing/work_rate.h"

namespace kvfleet::router {

// One request, as routing sees it.
struct Prompt {
  std::string_view model;           // its name: part of the blocks' hash namespace
  std::span<const TokenId> tokens;  // REQUIRES: not empty
  std::string_view cache_salt;      // empty: none
  Policy policy = Policy::kKv;
  // The LoRA adapter it runs with (empty: the base model): part of the hash namespace, and
  // only workers serving it (WorkerLoads::AdapterLoadSeconds) are candidates.
  std::string_view lora = {};
  // Never split it between a prefill and a decode worker (prompt logprobs: the worker that
  // streams needs every prompt position's logits, so it computes the prompt itself).
  bool whole = false;
  // Constrained decoding: the request field that asks for it (response_format, guided_json,
  // tool_choice, ...; empty: none). Only workers whose Hello offers structured outputs are
  // candidates, and such a request is never split (a prefill worker need not offer them).
  std::string_view constrained_field = {};
  // The client's X-Request-Id (router/http/api.cc checks it; empty: none): only logged.
  std::string_view request_id = {};
};

// A split request's prefill (README.md, "Prefill and decode on different workers"): the
// prompt is first computed on a prefill worker, whose KV the decision's worker then pulls.
struct SplitPrefill {
  WorkerId worker = 0;                   // a prefill-role worker
  uint32_t predicted_cached_tokens = 0;  // prompt tokens expected cached there
  uint32_t blocks = 0;                   // leading prompt blocks the decode worker pulls from it
  double estimated_ttft_s = 0;           // predicted time to the prefill's end there
  double pull_s = 0;                     // predicted time of the decode worker's pull
  uint32_t pull_deadline_ms = 0;         // its hint's deadline (Picker::PullDeadline)
  std::shared_ptr<const std::vector<Candidate>> candidates;  // the prefill workers considered: its retry's
  // The prefill worker's estimate terms, when calibrating: the stage's end checks them
  // (Router::ObservePrefillStage).
  std::optional<TtftTerms> ttft_terms;
};

struct Decision {
  WorkerId worker = 0;  // the worker that streams the tokens: never a prefill-role worker
  uint32_t device_blocks = 0;            // leading prompt blocks it holds on the device
  uint32_t host_blocks = 0;              // further leading blocks on its host tier
  uint32_t predicted_cached_tokens = 0;  // prompt tokens expected cached there
  double estimated_ttft_s = 0;           // predicted time to first token there (every policy)
  double pull_bias_s = 0;                // of estimated_ttft_s, a pull's bias (Candidate::pull_bias_s)
  // The estimate's terms for the worker (Picker::Terms), when the request neither pulls nor is
  // split and the estimate is calibrated: the first token checks them (Router::ObserveFirstToken).
  std::optional<TtftTerms> ttft_terms;
  // Where the worker pulls the prefix it lacks (README.md, "Pulling a prefix"); empty
  // source: it computes what it does not hold.
  PullHint pull;
  WorkerId pull_from = 0;
  bool pull_computing = false;  // pull_from was still computing the prefix (Candidate::pull_ready_s)
  // The longest leading run any worker of the model matched (its events, or this router's
  // predicted entries): what the decision could have reused at most. The reuse it gives up is
  // this less the worker's own and pulled blocks (Dispatched::passed_over_blocks).
  uint32_t best_matched_blocks = 0;
  // Set when the request is split: `pull` then names split->worker, and the decision's worker
  // gets the request once that prefill is done (ForwardRequest::prefill).
  std::optional<SplitPrefill> split;
  // For Commit and Rerouter.
  Policy policy = Policy::kKv;
  RouteRequest route;
  uint64_t lora_id = 0;           // LoraId(prompt.lora); 0: the base model
  std::vector<BlockHash> hashes;  // the prompt's full blocks
  std::shared_ptr<const std::vector<Candidate>> candidates;  // every worker considered
};

// Why Route refused a request: the label of kvfleet_router_requests_refused_total and when
// a retry may be admitted.
struct Refusal {
  // "queue_full", "saturated", "predicted_ttft" (429), "unattainable" or "no_decode_worker" (503);
  // empty for Route's InvalidArgument (a constrained request no worker of the model can serve: 400)
  std::string_view reason;
  double retry_after_s = 0;  // seconds until a retry may be admitted, from the predicted wait; 0: none
};

class Router {
 public:
  // `kv_index` serves the kv policy (the global index when events are connected),
  // `approx_index` the approx policy; they may be the same. REQUIRES: `loads` and both
  // indexes outlive the Router.
  // `retention` (may be null: kv_retention then routes as kv) estimates how soon each worker
  // evicts what it holds (router/index/retention_estimate.h); the Router enables it when
  // kv_retention is first used. It must outlive the Router.
  // `clock` (not owned) times the fleet load's rates.
  Router(const RoutingOptions& options, const WorkerLoads* loads, PrefixIndex* kv_index, PrefixIndex* approx_index,
         RetentionEstimate* retention = nullptr, const Clock* clock = SystemClock::Default());

  const RoutingOptions& options() const { return picker_.options(); }
  // A request decided with `terms` (Decision::ttft_terms) and answered by the worker it was
  // sent to had its first token `seconds` after it was sent: the estimate's calibration
  // learns from it (ttft_calibration.h; RoutingOptions::calibrate_ttft). Any thread.
  void ObserveFirstToken(const TtftTerms& terms, double seconds) {
    if (options().calibrate_ttft) calibration_.Observe(terms, seconds);
  }
  // A request routed without a split, with a pull or without, estimated at `estimated_s`
  // (Decision::estimated_ttft_s less its pull_bias_s) and answered by the worker it was sent
  // to, had its first token `seconds` after it was sent: what a pull's estimate lacks
  // (TtftCalibration::ObserveEstimate). Any thread.
  void ObserveEstimate(bool pulled, double estimated_s, double seconds) {
    if (options().calibrate_ttft) calibration_.ObserveEstimate(pulled, estimated_s, seconds);
  }
  const TtftCalibration& calibration() const { return calibration_; }
  // The same for a split's prefill stage on a prefill worker (SplitPrefill::ttft_terms), which
  // ended `seconds` after it was sent: the prefill pool's own calibration learns from it. A
  // prefill worker runs no decodes and its queue holds whole prompts, so the decode pool's
  // coefficients do not fit it (README.md, "Calibrating the estimate").
  void ObservePrefillStage(const TtftTerms& terms, double seconds) {
    if (options().calibrate_ttft) prefill_calibration_.Observe(terms, seconds);
  }
  const TtftCalibration& prefill_calibration() const { return prefill_calibration_; }
  // Every decision from now on is also written to `log` (may be null: none), which must outlive
  // the Router. Call before routing starts.
  void SetDecisionLog(DecisionLog* log) { decision_log_ = log; }

  // Chooses a worker of `fleet` for `prompt`, or refuses it (see Admission above):
  // ResourceExhausted (429: queue_full, saturated, predicted_ttft) or Unavailable (503:
  // unattainable), with *refusal (when given) saying why; Unavailable ("no_worker") when no
  // routable worker serves the prompt's adapter. REQUIRES: !fleet.routable.empty().
  Result<Decision> Route(const ModelFleet& fleet, const Prompt& prompt, Refusal* refusal = nullptr);
  // Inserts the decision's predicted entries (README.md, "Predicted entries"). Call once the
  // request is on its way: the worker starts sooner, and the next request sees them all the same.
  void Commit(const Decision& decision);
  // The retry of a decided request (ForwardRequest::reroute): the decision's candidates less
  // the workers tried, chosen by the same policy. The Router must outlive it.
  std::function<Result<WorkerId>(std::span<const WorkerId> tried)> Rerouter(const Decision& decision);
  // A split decision's prefill retry: another prefill worker, as Rerouter does for the decode.
  // REQUIRES: decision.split.
  std::function<Result<WorkerId>(std::span<const WorkerId> tried)> PrefillRerouter(const Decision& decision);
  // A split decision's pull once its prefill is done on `prefill_worker` (the chosen one, or
  // its retry): the hint naming it; empty when that worker serves no pulls (the decode worker
  // then computes the prompt). REQUIRES: decision.split.
  std::function<PullHint(WorkerId prefill_worker)> SplitPull(const Decision& decision);
  // The uncached prefill tokens per second this router routed to each model lately (its own
  // part of the fleet load): what it tells its peers (router/fleet/gossip.h).
  std::map<std::string, double, std::less<>> RoutedWork(TimeNs now) const;

 private:
  // How much the worker of `c` is loaded, now: its last report blended with this router's own
  // counts (kv, least_loaded, round_robin), or this router's counts alone (approx). Returns
  // this router's own counts there.
  OwnLoadCounts AddLoad(Policy policy, const WorkerLoads::LoadView& view, Candidate* c) const;
  // Each candidate's device_prefill_s: the prefill queued on the other workers of its device
  // (`mates[i]`, candidate i's; their loads blended as AddLoad's), each at its own rate.
  void AddDeviceLoad(Policy policy, std::span<const std::vector<WorkerId>* const> mates,
                     std::vector<Candidate>* candidates) const;
  // Sets c->adapter_load_s for adapter `lora_id` (0: the base model); false when the worker
  // does not serve it.
  bool AddAdapter(uint64_t lora_id, Candidate* c) const;
  // kv_retention: each candidate's retained_share, the part of its matched prefix expected
  // still cached when this request's prefill starts there (README.md).
  void DiscountHits(const RouteRequest& route, std::span<const BlockHash> hashes,
                    std::vector<Candidate>* candidates) const;
  // kv, kv_retention: for each candidate that holds less of the prompt than the best holder
  // serving pulls (the longest run by its own events, Candidate::held_blocks), one more
  // candidate: the same worker with the holder's prefix pulled (README.md, "Pulling a prefix").
  // And where a worker is computing a longer run (its predicted entries), one more: the same
  // worker with that run pulled once it is stored, after that worker's queue ahead at
  // `fleet_rate` (Candidate::pull_ready_s; README.md, "Pulling a prefix being computed").
  // Holders are looked for among `holders` (every worker of the model: a prefill worker's
  // cache serves the decode pool too).
  void AddPulls(std::span<const Candidate> holders, double fleet_rate, std::vector<Candidate>* candidates) const;
  // Whether pull options read each pair's measured pulls (PullFit), as of `now`: with
  // --transfer-measured, or while some worker's failed pull is recent. Taken once per decision.
  struct PairReads {
    TimeNs now = 0;
    bool read = false;
  };
  PairReads ReadPairs() const;
  // `c` with `blocks` more leading blocks pulled from `source` (whose transfer service is
  // `peer`) into it. Priced by what c's pulls from that holder took (its load reports,
  // router/core/pull_fit.h) where `reads` says so, regularized toward the flags: the
  // device-to-device bandwidth when their Hellos name one host (`same_host`), else the
  // network's, and the set-up per pull; weighed by the pair's failed pulls.
  Candidate WithPull(const Candidate& c, WorkerId source, const TransferPeer& peer, bool same_host, uint32_t blocks,
                     const PairReads& reads) const;
  // The hint's deadline for `c`'s pull: Picker::PullDeadline in ms, at least 10.
  uint32_t PullDeadlineMs(const RouteRequest& route, const Candidate& c, double fleet_rate) const;
  // P/D disaggregation (split.cc; README.md): whether `prompt` is split, and if so fills *d
  // (worker, pull, split, candidates) from a prefill worker among `prefill_pool` and a decode
  // worker among `decode_pool` (each without pull options). `whole_ttft_s`: the soonest first
  // token routed whole (the decode pool's best prediction). False: route it whole.
  bool TrySplit(std::span<const Candidate> prefill_pool, std::span<const Candidate> decode_pool, double whole_ttft_s,
                Decision* d);
  // The soonest first token a split of `route` could give on an idle fleet (split.cc): the
  // quickest prefill worker serving pulls computing the prompt (its cached prefix counted), then
  // the cheapest pull of its `full_blocks` to a decode worker of its KV format and that worker's
  // part. Infinity when none can. For telling a busy fleet from an impossible request (Route's
  // admission): not a decision.
  double IdleSplitTtft(std::span<const Candidate> prefill_pool, std::span<const Candidate> decode_pool,
                       const RouteRequest& route, uint32_t full_blocks) const;
  // `c` on an idle fleet: nothing queued or running there or on its device, no admission wait.
  static Candidate Idle(Candidate c) {
    c.queued_prefill_tokens = c.running_requests = c.admission_wait_s = c.pulled_wait_s = c.device_prefill_s = 0;
    return c;
  }
  std::function<Result<WorkerId>(std::span<const WorkerId> tried)> MakeRerouter(
      Policy policy, const RouteRequest& route, uint64_t lora_id,
      std::shared_ptr<const std::vector<Candidate>> candidates);
  // ρ for `model` now: the uncached prefill tokens/s this router sent it lately over the
  // candidates' summed prefill rates (each at least the fleet's median, `fleet_rate` =
  // Picker::FleetRate(candidates), as the cost has it, and each times its
  // Candidate::device_share: a shared device counts once).
  double FleetLoad(std::string_view model, std::span<const Candidate> candidates, double fleet_rate, TimeNs now);
  // Also counts the request as free or tied (FollowUps; `continues`: more than half of its
  // prompt held in the fleet).
  void CountRoutedWork(std::string_view model, TimeNs now, double uncached_tokens, bool continues);
  double FollowUpsPerStart(std::string_view model, TimeNs now) const;
  // The candidates whose predicted time to first token is within admission_ttft_s (all of
  // them when it is 0), and each one's prediction in *ttft.
  std::vector<Candidate> Admissible(const RouteRequest& route, std::span<const Candidate> candidates,
                                    std::vector<double>* ttft) const;

  TtftCalibration calibration_;          // before picker_, which reads them
  TtftCalibration prefill_calibration_;  // of the prefill-role workers' estimates
  Picker picker_;
  DecisionLog* decision_log_ = nullptr;
  const WorkerLoads* loads_;
  PrefixIndex* kv_index_;
  PrefixIndex* approx_index_;
  RetentionEstimate* retention_;
  const Clock* clock_;
  mutable std::mutex work_mu_;
  // What this router has sent a model's fleet: the uncached prefill (its load ρ) and the
  // continuations per start (follow-ups), counted together in CountRoutedWork.
  struct ModelTraffic {
    explicit ModelTraffic(DurationNs window) : work(window), follow_ups(window) {}
    DecayedRate work;
    FollowUps follow_ups;
  };
  std::map<std::string, ModelTraffic, std::less<>> traffic_;  // GUARDED_BY(work_mu_), by model
  // The approx index learns decisions only once the approx policy is in use (the router's
  // default, or a request's override): feeding it on every kv-routed request cost ~5% of
  // the router's CPU at 200 req/s of 8K-token prompts for an index nobody read. The first
  // request that asks for approx therefore sees what a freshly started router would.
  std::atomic<bool> approx_in_use_;
};

}  // namespace kvfleet::router
