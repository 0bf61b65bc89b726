#include "router/routing/router.h"

#include <algorithm>

namespace kvfleet::router {

Router::Router(const RoutingOptions& options, const WorkerLoads* loads, PrefixIndex* kv_index,
               PrefixIndex* approx_index)
    : picker_(options),
      loads_(loads),
      kv_index_(kv_index),
      approx_index_(approx_index),
      approx_in_use_(options.policy == Policy::kApprox) {}

void Router::AddLoad(Policy policy, Candidate* c) const {
  const OwnLoadCounts own = loads_->OwnLoad(c->worker);
  c->running_requests = own.requests;
  c->queued_prefill_tokens = own.prefill_tokens;
  // Without a report, every request this router has in flight there may be queued.
  c->queued_requests = own.requests;
  if (policy == Policy::kApprox) return;
  const std::optional<WorkerLoad> load = loads_->ReportedLoad(c->worker);
  if (!load) return;
  const double active = load->active_requests;
  const double queued = load->queued_requests;
  // The report lags and counts a waiting prompt whole, cached prefix included; the router's
  // own count is fresh and counts what it expects uncached. So: the router's own load now,
  // plus what the report holds beyond what this router had in flight there when the report
  // came (other routers' requests; README.md).
  const OwnLoadCounts then = loads_->OwnLoadAt(c->worker, load->received_at);
  c->running_requests = own.requests + std::max(0.0, active + queued - then.requests);
  c->queued_prefill_tokens =
      own.prefill_tokens + std::max(0.0, static_cast<double>(load->active_prefill_tokens) - then.prompt_tokens);
  c->queued_requests = std::max(queued, own.requests - active);
  c->prefill_tokens_per_s = load->prefill_tokens_per_second;
}

Result<Decision> Router::Route(const ModelFleet& fleet, const Prompt& prompt) {
  Decision d;
  d.policy = prompt.policy;
  d.route = RouteRequest{static_cast<uint32_t>(prompt.tokens.size()), fleet.block_size};
  BlockHasher hasher(fleet.block_size, HashNamespace{prompt.model, "", prompt.cache_salt});
  d.hashes = hasher.HashAll(prompt.tokens);
  std::vector<PrefixMatch> matches;
  if (d.policy == Policy::kKv || d.policy == Policy::kApprox) {
    PrefixIndex* index = d.policy == Policy::kApprox ? approx_index_ : kv_index_;
    index->FindMatches(d.hashes, &matches);
  }
  auto candidates = std::make_shared<std::vector<Candidate>>();
  candidates->reserve(fleet.routable.size());
  for (WorkerId id : fleet.routable) {
    Candidate c;
    c.worker = id;
    for (const PrefixMatch& m : matches) {
      if (m.worker == id) {
        c.device_blocks = m.device_blocks;
        c.host_blocks = m.host_blocks;
      }
    }
    AddLoad(d.policy, &c);
    candidates->push_back(c);
  }
  KVF_ASSIGN_OR_RETURN(Choice choice, picker_.Pick(d.policy, d.route, *candidates));
  const Candidate& chosen = (*candidates)[choice.index];
  d.worker = choice.worker;
  d.device_blocks = chosen.device_blocks;
  d.host_blocks = chosen.host_blocks;
  d.predicted_cached_tokens = choice.predicted_cached_tokens;
  d.estimated_ttft_s = choice.estimated_ttft_s;
  d.candidates = std::move(candidates);
  return d;
}

void Router::Commit(const Decision& decision) {
  const DurationNs ttl = picker_.options().predicted_ttl;
  kv_index_->InsertPredicted(decision.worker, decision.hashes, ttl);
  if (decision.policy == Policy::kApprox) approx_in_use_.store(true, std::memory_order_relaxed);
  if (approx_index_ != kv_index_ && approx_in_use_.load(std::memory_order_relaxed)) {
    approx_index_->InsertPredicted(decision.worker, decision.hashes, ttl);
  }
}

std::function<Result<WorkerId>(std::span<const WorkerId> tried)> Router::Rerouter(const Decision& decision) {
  return [this, policy = decision.policy, route = decision.route,
          candidates = decision.candidates](std::span<const WorkerId> tried) -> Result<WorkerId> {
    std::vector<Candidate> rest;
    for (const Candidate& c : *candidates) {
      if (std::find(tried.begin(), tried.end(), c.worker) == tried.end()) rest.push_back(c);
    }
    if (rest.empty()) return Unavailable("no other live worker to retry on");
    KVF_ASSIGN_OR_RETURN(Choice choice, picker_.Pick(policy, route, rest));
    return choice.worker;
  };
}

}  // namespace kvfleet::router
