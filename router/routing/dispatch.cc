#include "router/routing/dispatch.h"

#include <cstdio>
#include <string>
#include <utility>

namespace kvfleet::router {

Dispatcher::Dispatcher(Fleet* fleet, Router* router, const Clock* clock, DurationNs unknown_model_grace)
    : fleet_(fleet),
      router_(router),
      clock_(clock),
      started_(clock->Now()),
      unknown_model_grace_(unknown_model_grace) {}

Result<ServedModel> Dispatcher::Resolve(std::string_view name, Refusal* refusal) const {
  *refusal = Refusal{};
  auto quoted = [name] { return "'" + std::string(name) + "'"; };  // for the errors alone
  std::optional<ServedModel> served = fleet_->Resolve(name);
  if (!served && !fleet_->Ready()) {
    // Nothing is routable at all (a router that just started, before workers register, or a
    // fleet that is down): the model may well exist, so this is "try again", not 404.
    refusal->reason = "no_worker";
    return Unavailable("no live worker yet: cannot tell whether model " + quoted() + " exists");
  }
  if (!served) {
    const DurationNs up = clock_->Now() - started_;
    if (up < unknown_model_grace_) {
      // A router that started moments ago may not have heard from this model's workers yet.
      char since[32];
      std::snprintf(since, sizeof(since), "%.1f", static_cast<double>(up) / kNsPerSec);
      return Unavailable("model " + quoted() + " is not known yet: this router started " + since +
                         " s ago and its workers are still registering");
    }
    return NotFound("The model " + quoted() +
                    " does not exist: no worker serves a model or a LoRA adapter of that name.");
  }
  if (served->fleet.routable.empty()) {
    refusal->reason = "no_worker";
    return Unavailable(served->lora.empty()
                           ? "no live worker serves model " + quoted()
                           : "no live worker serves LoRA adapter " + quoted() + " of model '" + served->model + "'");
  }
  return std::move(*served);
}

Result<Dispatched> Dispatcher::Dispatch(const ServedModel& served, GenerateParams params,
                                        std::optional<Policy> policy, Lane* lane, const SinkFactory& make_sink,
                                        Refusal* refusal, std::string_view constrained_field,
                                        std::string_view request_id) {
  params.model = served.model;
  params.lora = served.lora;
  Prompt prompt{served.model, params.tokens, params.cache_salt, policy.value_or(router_->options().policy)};
  prompt.lora = params.lora;
  prompt.whole = params.sampling.prompt_logprobs;
  prompt.request_id = request_id;
  if (params.sampling.structured.kind != StructuredOutput::Kind::kNone) {
    prompt.constrained_field = constrained_field.empty() ? std::string_view("response_format") : constrained_field;
  }
  KVF_ASSIGN_OR_RETURN(Decision decision, router_->Route(served.fleet, prompt, refusal));

  const uint64_t handle = lane->NewHandle();
  ForwardRequest fwd;
  fwd.worker = decision.worker;
  fwd.prefill_tokens = static_cast<uint32_t>(params.tokens.size()) - decision.predicted_cached_tokens;
  fwd.sink = make_sink(Routed{decision.worker, lane, handle, decision.estimated_ttft_s});
  fwd.reroute = router_->Rerouter(decision);
  if (!decision.split && router_->options().calibrate_ttft) {
    Router* router = router_;
    const bool pulled = !decision.pull.source.empty();
    const double estimated = decision.estimated_ttft_s - decision.pull_bias_s;
    fwd.on_first_token = [router, pulled, estimated, terms = decision.ttft_terms](double seconds) {
      router->ObserveEstimate(pulled, estimated, seconds);
      if (terms) router->ObserveFirstToken(*terms, seconds);
    };
  }
  if (decision.split) {
    // The pull is named once the prefill is done, by the worker that did it (a retry's).
    fwd.prefill = PrefillStage{decision.split->worker,
                               decision.route.prompt_tokens - decision.split->predicted_cached_tokens,
                               router_->PrefillRerouter(decision), router_->SplitPull(decision),
                               decision.split->estimated_ttft_s, nullptr};
    if (decision.split->ttft_terms) {
      Router* router = router_;
      fwd.prefill->on_done = [router, terms = *decision.split->ttft_terms](double seconds) {
        router->ObservePrefillStage(terms, seconds);
      };
    }
  } else {
    params.pull = decision.pull;
  }
  fwd.params = std::move(params);
  // Sent from the caller's thread, whose lane also reads the answer and feeds the sink: no
  // other thread wakes on the request path.
  lane->Submit(handle, std::move(fwd));
  Dispatched out{handle, clock_->Now(), decision.device_blocks + decision.host_blocks,
                 decision.predicted_cached_tokens,
                 decision.pull.source.empty() ? 0 : decision.pull.blocks - decision.device_blocks - decision.host_blocks,
                 decision.split.has_value(), decision.pull_computing};
  const uint32_t reused = out.matched_blocks + out.pulled_blocks;
  if (!decision.split && decision.best_matched_blocks > reused) out.passed_over_blocks = decision.best_matched_blocks - reused;
  // A request routed on another I/O thread meanwhile could miss these entries either way;
  // the window is tens of µs.
  router_->Commit(decision);
  return out;
}

}  // namespace kvfleet::router
