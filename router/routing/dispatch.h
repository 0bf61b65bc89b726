// Dispatcher: the routing side of one request, for the HTTP layer. It owns the protocol a
// request goes through between its parse and its answer, so the API does not run it by hand:
//   1. Resolve(name): the workers that may serve the request's `model` (Fleet::Resolve: a
//      model, else a LoRA adapter), or why none can now.
//   2. Dispatch(): Router::Route decides (admission, README.md: refused at once with a
//      Refusal); the caller's sink is made for the chosen worker; the request leaves on the
//      caller's lane with Router::Rerouter as its retry; then Router::Commit inserts the
//      predicted entries, once the request is on its way (the worker starts sooner, and the
//      next request this thread routes sees them all the same). A split decision (P/D,
//      router/routing/README.md) leaves with its prefill stage (ForwardRequest::prefill).
//
// Thread safety: thread-safe; the HTTP I/O threads dispatch concurrently, each on its own lane.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "router/fleet/fleet.h"
#include "router/fleet/lane.h"
#include "router/routing/router.h"

namespace kvfleet::router {

// Where a dispatched request went, for the sink made for it (before it leaves).
struct Routed {
  WorkerId worker = 0;
  Lane* lane = nullptr;      // the caller's
  uint64_t handle = 0;       // the request's on `lane`: Lane::Cancel(handle) ends it
  double estimated_ttft_s = 0;  // predicted time to first token there
};

// A request on its way.
struct Dispatched {
  uint64_t handle = 0;                   // on the lane
  TimeNs sent = 0;                       // handed to the worker's socket
  uint32_t matched_blocks = 0;           // leading prompt blocks the worker holds, device and host
  uint32_t predicted_cached_tokens = 0;  // prompt tokens expected cached there
  uint32_t pulled_blocks = 0;            // of those blocks, the ones it is asked to pull (Decision::pull)
  bool split = false;                    // prefilled on another worker first (Decision::split)
  bool pull_computing = false;           // pulled from a worker still computing it (Decision::pull_computing)
  // Leading blocks another worker matched beyond what this one holds or pulls: reuse given up
  // for load (Decision::best_matched_blocks less matched and pulled; 0 for a split request).
  uint32_t passed_over_blocks = 0;
};

class Dispatcher {
 public:
  // Every pointer must outlive the Dispatcher. `unknown_model_grace`: for this long after
  // the Dispatcher is made, a name no worker has announced is Unavailable, not NotFound (a
  // restarted router re-learns the fleet from the workers' Hellos).
  Dispatcher(Fleet* fleet, Router* router, const Clock* clock, DurationNs unknown_model_grace);

  // The model or adapter `name` names, with its workers. Errors, with *refusal's reason set
  // where the refusal counts as one for load ("no_worker"; empty otherwise):
  //   Unavailable: no model has a routable worker (nothing to tell whether `name` exists;
  //     "no_worker"), the router started within the grace, or `name` has no routable worker
  //     ("no_worker").
  //   NotFound: no worker serves a model or an adapter of that name.
  Result<ServedModel> Resolve(std::string_view name, Refusal* refusal) const;

  // Makes the request's sink once its worker is chosen; called at most once, before the
  // request leaves (a refused request makes none).
  using SinkFactory = std::function<std::shared_ptr<ResponseSink>(const Routed&)>;

  // Routes `params` (tokens set; model and lora are set here from `served`) by `policy`
  // (none: the router's) and sends it on `lane`. Route's refusals come back as its Status
  // with *refusal set (Router::Route). REQUIRES: !params.tokens.empty(),
  // !served.fleet.routable.empty(); on `lane`'s thread. `constrained_field`: the request
  // field that set params.sampling.structured, for a refusal's message (Prompt::constrained_field).
  // `request_id`: the client's X-Request-Id, for the decision log (Prompt::request_id).
  Result<Dispatched> Dispatch(const ServedModel& served, GenerateParams params, std::optional<Policy> policy,
                              Lane* lane, const SinkFactory& make_sink, Refusal* refusal,
                              std::string_view constrained_field = {}, std::string_view request_id = {});

 private:
  Fleet* fleet_;
  Router* router_;
  const Clock* clock_;
  const TimeNs started_;
  const DurationNs unknown_model_grace_;
};

}  // namespace kvfleet::router
