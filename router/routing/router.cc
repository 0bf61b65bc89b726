#include "router/routing/router.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "common/check.h"
#include "schema/kv_event.h"

namespace kvfleet::router {

Router::Router(const RoutingOptions& options, const WorkerLoads* loads, PrefixIndex* kv_index,
               PrefixIndex* approx_index, RetentionEstimate* retention, const Clock* clock)
    : picker_(options),
      loads_(loads),
      kv_index_(kv_index),
      approx_index_(approx_index),
      retention_(retention),
      clock_(clock),
      approx_in_use_(options.policy == Policy::kApprox) {
  if (retention_ != nullptr && options.policy == Policy::kKvRetention) retention_->Enable();
  if (options.calibrate_ttft) picker_.SetCalibration(&calibration_, &prefill_calibration_);
}

namespace {

OwnLoadCounts Sum(OwnLoadCounts a, const OwnLoadCounts& b) {
  a.requests += b.requests;
  a.prefill_tokens += b.prefill_tokens;
  a.prompt_tokens += b.prompt_tokens;
  a.waiting += b.waiting;
  return a;
}

// Per-thread scratch of Route, so that a decision over a large fleet allocates little more
// than the Decision it returns once the thread is warm.
struct RouteScratch {
  std::vector<PrefixMatch> matches;
  // By worker id: the index in `matches` of its first match, when its stamp is this decision's.
  std::vector<uint32_t> match_of, match_stamp;
  uint32_t stamp = 0;  // this decision's
  std::vector<WorkerLoads::LoadView> views;
  std::vector<const std::vector<WorkerId>*> mates;
  std::vector<double> ttft;
};
thread_local RouteScratch t_route;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

}  // namespace

OwnLoadCounts Router::AddLoad(Policy policy, const WorkerLoads::LoadView& view, Candidate* c) const {
  const OwnLoadCounts own = view.own;
  // What the routers know of the worker without its report: this router's own requests there
  // and those the other routers' gossip counts (README.md, "Several routers").
  const OwnLoadCounts known = Sum(own, view.peers);
  c->running_requests = known.requests;
  c->queued_prefill_tokens = known.prefill_tokens;
  // Without a report, every request the routers have in flight there may be queued.
  c->queued_requests = known.requests;
  c->waiting_requests = known.waiting;
  c->admission_wait_s = c->pulled_wait_s = 0;
  c->decode_blocks = c->kv_usage = c->free_device_blocks = c->total_device_blocks = 0;
  if (policy == Policy::kApprox) {
    c->prefill_tokens_per_s = 0;
    return own;
  }
  // What the worker announced until it reports a measured rate: a cold router never guesses.
  c->prefill_tokens_per_s = view.announced_prefill_rate;
  const std::optional<WorkerLoad>& load = view.report;
  if (!load) return own;
  const double active = load->active_requests;
  const double queued = load->queued_requests;
  // The report lags and counts a waiting prompt whole, cached prefix included; the routers'
  // counts are fresh and count what each expects uncached. So: the known load now, plus what
  // the report holds beyond what was known there when the report came (requests of routers
  // that do not gossip, or not yet heard; README.md). A peer's request is counted once, by
  // its gossip; twice only while the one report that came before its gossip is the last.
  const OwnLoadCounts then = Sum(view.own_at_report, view.peers_at_report);
  c->running_requests = known.requests + std::max(0.0, active + queued - then.requests);
  // Progress the report shows on this router's own pending prompts: what it expected uncached
  // of them then, less what the worker had left (counting waiting prompts whole, so a lower
  // bound), once every request it had sent there had reached the worker; less the prompts that
  // have left the pending set since (their tokens left the own count already).
  double progress = 0;
  const OwnLoadCounts& own_then = view.own_at_report;
  if (active + queued >= own_then.requests) {
    progress = std::max(0.0, own_then.prefill_tokens - static_cast<double>(load->active_prefill_tokens));
    progress = std::max(0.0, progress - (own.left_prefill_tokens - own_then.left_prefill_tokens));
  }
  c->queued_prefill_tokens =
      std::max(0.0, known.prefill_tokens - std::min(progress, own.prefill_tokens)) +
      std::max(0.0, static_cast<double>(load->active_prefill_tokens) - then.prompt_tokens);
  c->queued_requests = std::max(queued, known.requests - active);
  c->waiting_requests = known.waiting + std::max(0.0, queued - then.waiting);
  if (load->prefill_tokens_per_second > 0) c->prefill_tokens_per_s = load->prefill_tokens_per_second;
  // Each step decodes every running request: running over the decode rate is the step's length,
  // measured, where a constant per running request over- or under-counts it (README.md).
  if (load->decode_tokens_per_second > 0) c->step_s = active / load->decode_tokens_per_second;
  // The worker's predicted wait less its prefill term, which the blend above recounts: what
  // only the worker knows, a batch or KV cache too full to admit one more (README.md).
  const double prefill_s = load->prefill_tokens_per_second > 0
                               ? static_cast<double>(load->active_prefill_tokens) / load->prefill_tokens_per_second
                               : 0;
  c->admission_wait_s = std::max(0.0, static_cast<double>(load->predicted_wait_us) / 1e6 - prefill_s);
  // A worker older than pulledWaitUs: its admission wait, as for any prompt (README.md).
  c->pulled_wait_s = load->pulled_wait_us == kPulledWaitUnknown ? c->admission_wait_s
                                                                 : static_cast<double>(load->pulled_wait_us) / 1e6;
  // What the peer policies weigh besides (peer_policies.h).
  const auto device = static_cast<size_t>(kv::Tier::kDevice);
  c->decode_blocks = static_cast<double>(load->active_decode_blocks);
  c->total_device_blocks = static_cast<double>(load->total_blocks[device]);
  c->free_device_blocks = static_cast<double>(load->free_blocks[device]);
  if (c->total_device_blocks > 0) c->kv_usage = 1.0 - c->free_device_blocks / c->total_device_blocks;
  return own;
}

void Router::AddDeviceLoad(Policy policy, std::span<const std::vector<WorkerId>* const> mates,
                           std::vector<Candidate>* candidates) const {
  std::vector<WorkerId> ids;
  for (const std::vector<WorkerId>* m : mates) ids.insert(ids.end(), m->begin(), m->end());
  if (ids.empty()) return;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<WorkerLoads::LoadView> views;
  loads_->Loads(ids, &views);
  std::vector<double> queued_s(ids.size());  // each mate's prefill queue at its own rate
  for (size_t i = 0; i < ids.size(); ++i) {
    Candidate mate;
    AddLoad(policy, views[i], &mate);
    const double rate = mate.prefill_tokens_per_s > 0 ? mate.prefill_tokens_per_s : options().default_prefill_tokens_per_s;
    queued_s[i] = mate.queued_prefill_tokens / rate;
  }
  for (size_t c = 0; c < candidates->size(); ++c) {
    double s = 0;
    for (WorkerId m : *mates[c]) s += queued_s[std::lower_bound(ids.begin(), ids.end(), m) - ids.begin()];
    (*candidates)[c].device_prefill_s = s;
    (*candidates)[c].device_share = 1.0 / static_cast<double>(1 + mates[c]->size());
  }
}

bool Router::AddAdapter(uint64_t lora_id, Candidate* c) const {
  c->adapter_load_s = 0;
  if (lora_id == 0) return true;
  const std::optional<double> load_s = loads_->AdapterLoadSeconds(c->worker, lora_id);
  if (!load_s) return false;
  c->adapter_load_s = *load_s;
  return true;
}

void Router::DiscountHits(const RouteRequest& route, std::span<const BlockHash> hashes,
                          std::vector<Candidate>* candidates) const {
  if (retention_ == nullptr) return;
  retention_->Enable();  // from the first kv_retention request on (retention_estimate.h)
  const double fleet_rate = picker_.FleetRate(*candidates);
  for (Candidate& c : *candidates) {
    const size_t matched = std::min<size_t>(hashes.size(), size_t{c.device_blocks} + c.host_blocks);
    if (matched == 0) continue;
    // The wait before this request's prefill starts there: the prefill queued ahead and the
    // worker's own admission wait. The queue ahead allocates its uncached blocks meanwhile;
    // the worker evicts only once its unused blocks are gone. Unused is at least free (free
    // or evictable, the load report) less every block the events say it holds.
    const double horizon_s =
        c.queued_prefill_tokens / std::max(c.prefill_tokens_per_s, fleet_rate) + c.device_prefill_s + c.admission_wait_s;
    const double demand = c.queued_prefill_tokens / route.block_size;
    double spare = 0;
    if (const std::optional<WorkerLoad> load = loads_->ReportedLoad(c.worker)) {
      const double free = static_cast<double>(load->free_blocks[0]) / loads_->KvBlocksPerBlock(c.worker);
      spare = std::max(0.0, free - static_cast<double>(retention_->Held(c.worker)));
    }
    const double kept =
        retention_->ExpectedSurvivingBlocks(c.worker, hashes.first(matched), horizon_s, spare, demand);
    c.retained_share = kept / static_cast<double>(matched);
  }
}

uint32_t Router::PullDeadlineMs(const RouteRequest& route, const Candidate& c, double fleet_rate) const {
  return std::max<uint32_t>(static_cast<uint32_t>(std::ceil(1e3 * picker_.PullDeadline(route, c, fleet_rate))), 10);
}

double Router::FleetLoad(std::string_view model, std::span<const Candidate> candidates, double fleet_rate,
                         TimeNs now) {
  double capacity = 0;
  // Workers sharing a device share its compute: each counts its share, so the device counts once.
  for (const Candidate& c : candidates) capacity += c.device_share * std::max(c.prefill_tokens_per_s, fleet_rate);
  double sent = loads_->PeerWorkRate(model);  // the other routers' work, as their gossip says
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    auto it = traffic_.find(model);
    if (it != traffic_.end()) sent += it->second.work.PerSecond(now);
  }
  return capacity > 0 ? sent / capacity : 0;
}

std::map<std::string, double, std::less<>> Router::RoutedWork(TimeNs now) const {
  std::map<std::string, double, std::less<>> out;
  std::lock_guard<std::mutex> lock(work_mu_);
  for (const auto& [model, traffic] : traffic_) out.emplace(model, traffic.work.PerSecond(now));
  return out;
}

void Router::CountRoutedWork(std::string_view model, TimeNs now, double uncached_tokens, bool continues) {
  std::lock_guard<std::mutex> lock(work_mu_);
  auto it = traffic_.find(model);
  if (it == traffic_.end()) it = traffic_.try_emplace(std::string(model), options().fleet_load_window).first;
  it->second.work.Add(now, uncached_tokens);
  it->second.follow_ups.Count(now, continues);
}

double Router::FollowUpsPerStart(std::string_view model, TimeNs now) const {
  std::lock_guard<std::mutex> lock(work_mu_);
  auto it = traffic_.find(model);
  return it == traffic_.end() ? 0 : it->second.follow_ups.PerStart(now);
}

std::vector<Candidate> Router::Admissible(const RouteRequest& route, std::span<const Candidate> candidates,
                                          std::vector<double>* ttft) const {
  const double fleet_rate = picker_.FleetRate(candidates);
  const double bound = options().admission_ttft_s;
  std::vector<Candidate> out;
  out.reserve(candidates.size());
  ttft->clear();
  ttft->reserve(candidates.size());
  for (const Candidate& c : candidates) {
    ttft->push_back(picker_.EstimateTtft(route, c, fleet_rate));
    if (bound == 0 || ttft->back() <= bound) out.push_back(c);
  }
  return out;
}

Result<Decision> Router::Route(const ModelFleet& fleet, const Prompt& prompt, Refusal* refusal) {
  RouteScratch& s = t_route;
  Decision d;
  d.policy = prompt.policy;
  d.route = RouteRequest{static_cast<uint32_t>(prompt.tokens.size()), fleet.block_size};
  d.lora_id = LoraId(prompt.lora);
  BlockHasher hasher(fleet.block_size, HashNamespace{prompt.model, prompt.lora, prompt.cache_salt});
  d.hashes = hasher.HashAll(prompt.tokens);
  std::vector<PrefixMatch>& matches = s.matches;
  matches.clear();
  const bool by_prefix = d.policy != Policy::kRoundRobin && d.policy != Policy::kLeastLoaded;
  if (by_prefix) {
    PrefixIndex* index = d.policy == Policy::kApprox ? approx_index_ : kv_index_;
    index->FindMatches(d.hashes, &matches);
    auto by_worker = [](const PrefixMatch& a, const PrefixMatch& b) { return a.worker < b.worker; };
    if (!std::is_sorted(matches.begin(), matches.end(), by_worker)) {
      std::sort(matches.begin(), matches.end(), by_worker);
    }
  }
  // Every worker of a large fleet may match a shared prefix: each one's match by its id, not a
  // search per worker. The first of a worker's matches, as a search of the sorted ones finds.
  if (++s.stamp == 0) {  // wrapped: no entry may look current
    std::fill(s.match_stamp.begin(), s.match_stamp.end(), 0);
    s.stamp = 1;
  }
  for (size_t i = 0; i < matches.size(); ++i) {
    const WorkerId id = matches[i].worker;
    if (id >= s.match_of.size()) {
      s.match_of.resize(size_t{id} + 1);
      s.match_stamp.resize(size_t{id} + 1, 0);
    }
    if (s.match_stamp[id] != s.stamp) {
      s.match_stamp[id] = s.stamp;
      s.match_of[id] = static_cast<uint32_t>(i);
    }
  }
  // The candidates are built in the decision's own vector: when every one is admitted (the
  // usual case) it becomes Decision::candidates as it is.
  auto owned = std::make_shared<std::vector<Candidate>>();
  std::vector<Candidate>& candidates = *owned;
  // Room for every worker's pull options too (AddPulls: two sources), so decode_pool below stays valid.
  candidates.reserve(3 * fleet.routable.size());
  std::vector<WorkerLoads::LoadView>& views = s.views;
  loads_->Loads(fleet.routable, &views);
  double waiting = 0;  // this router's requests of the model without a first token
  std::vector<const std::vector<WorkerId>*>& mates = s.mates;  // the candidates' device mates
  mates.clear();
  bool shared_device = false;
  size_t not_constrained = 0;     // workers left out: they offer no constrained decoding
  for (size_t i = 0; i < fleet.routable.size(); ++i) {
    const WorkerId id = fleet.routable[i];
    Candidate c;
    c.worker = id;
    if (!AddAdapter(d.lora_id, &c)) continue;  // it does not serve the adapter
    if (!prompt.constrained_field.empty() && !views[i].structured_outputs) {
      ++not_constrained;
      continue;
    }
    if (id < s.match_stamp.size() && s.match_stamp[id] == s.stamp) {
      const PrefixMatch* m = &matches[s.match_of[id]];
      c.device_blocks = m->device_blocks;
      c.host_blocks = m->host_blocks;
      c.held_blocks = m->held_blocks;
      c.predicted_ms_left = m->predicted_ms_left;
    }
    if (d.policy == Policy::kSglang || d.policy == Policy::kPreble) {  // the rules that read it
      c.device_cached_blocks = static_cast<double>(kv_index_->CachedBlocks(id));
    }
    waiting += AddLoad(d.policy, views[i], &c).waiting;
    c.transfer_format = views[i].transfer_format;
    c.transfer_host = views[i].transfer_host;
    c.role = views[i].role;
    candidates.push_back(c);
    d.best_matched_blocks = std::max(d.best_matched_blocks, c.device_blocks + c.host_blocks);
    mates.push_back(&views[i].device_mates);
    shared_device = shared_device || !views[i].device_mates.empty();
  }
  if (shared_device) AddDeviceLoad(d.policy, mates, &candidates);
  if (candidates.empty() && not_constrained > 0) {
    if (refusal != nullptr) *refusal = Refusal{};  // a bad request for this fleet, not a refusal for load
    return InvalidArgument("'" + std::string(prompt.constrained_field) + "' needs constrained decoding, which the " +
                           "workers of model '" + std::string(prompt.model) + "' do not offer (none of its live " +
                           "workers announces structured outputs)");
  }
  if (candidates.empty()) {
    if (refusal != nullptr) *refusal = Refusal{"no_worker", 0};
    return Unavailable("no live worker of model '" + std::string(prompt.model) + "' serves LoRA adapter '" +
                       std::string(prompt.lora) + "'");
  }
  if (d.policy == Policy::kKvRetention) DiscountHits(d.route, d.hashes, &candidates);
  const TimeNs now = clock_->Now();
  const double everyone_rate = picker_.FleetRate(candidates);
  // Each worker once: before the pull options.
  d.route.fleet_load = FleetLoad(prompt.model, candidates, everyone_rate, now);
  // A request more than half held is tied to its holder (moving it pays for most of its prompt
  // again); a free one is priced for the tied requests that follow each (FollowUps).
  const bool continues = 2 * uint64_t{d.best_matched_blocks} * d.route.block_size > d.route.prompt_tokens;
  d.route.follow_ups = continues ? 0 : FollowUpsPerStart(prompt.model, now);
  // P/D disaggregation (README.md): prefill-role workers take no request whole; they hold
  // prefixes the decode-capable workers may pull, and take split prefills (TrySplit, below).
  std::vector<Candidate> everyone;  // every candidate, when some are prefill workers
  std::vector<Candidate> prefill_pool;
  if (std::any_of(candidates.begin(), candidates.end(),
                  [](const Candidate& c) { return c.role == WorkerRole::kPrefill; })) {
    everyone = candidates;
    candidates.clear();
    for (const Candidate& c : everyone) (ServesDecode(c.role) ? candidates : prefill_pool).push_back(c);
    if (candidates.empty()) {
      if (refusal != nullptr) *refusal = Refusal{"no_decode_worker", 0};
      return Unavailable("model '" + std::string(prompt.model) + "' has only prefill workers (--role prefill) live: "
                         "no worker can decode the request (start workers with --role decode or both)");
    }
  }
  // The candidates without pull options: AddPulls only appends, within the capacity reserved.
  const std::span<const Candidate> decode_pool(candidates.data(), candidates.size());
  const bool by_cost = d.policy == Policy::kKv || d.policy == Policy::kKvRetention;
  // Pull options do not count in it (Picker::FleetRate), so it is the decode pool's: everyone's
  // when no candidate is a prefill worker.
  const double fleet_rate = everyone.empty() ? everyone_rate : picker_.FleetRate(candidates);
  if (by_cost) AddPulls(everyone.empty() ? decode_pool : everyone, fleet_rate, &candidates);
  KVF_CHECK(candidates.data() == decode_pool.data());

  // Admission (Admissible's, in place when every candidate is admitted).
  std::vector<double>& ttft = s.ttft;
  ttft.clear();
  const double bound = options().admission_ttft_s;
  bool all_admitted = true;
  double best = std::numeric_limits<double>::infinity();  // the soonest first token
  for (const Candidate& c : candidates) {
    ttft.push_back(picker_.EstimateTtft(d.route, c, fleet_rate));
    all_admitted = all_admitted && (bound == 0 || ttft.back() <= bound);
    best = std::min(best, ttft.back());
  }
  std::shared_ptr<std::vector<Candidate>> admitted = owned;
  if (!all_admitted) {
    admitted = std::make_shared<std::vector<Candidate>>();
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (ttft[i] <= bound) admitted->push_back(candidates[i]);
    }
  }
  // A retry may be admitted once the best worker's queue has drained below the bound (or,
  // within it, once the requests ahead have their first tokens): at least a second.
  const double retry_after = std::max(1.0, best > bound ? best - bound : best);
  auto refuse = [&](Status why, std::string_view reason, double after) -> Status {
    if (refusal != nullptr) *refusal = Refusal{reason, after};
    return why;
  };
  if (waiting >= options().max_waiting_requests) {
    return refuse(ResourceExhausted("model '" + std::string(prompt.model) + "' has " +
                                    std::to_string(static_cast<int64_t>(waiting)) +
                                    " requests waiting for their first token at this router (the bound, "
                                    "--max-waiting-requests)"),
                  "queue_full", retry_after);
  }
  // A split prefills the prompt on a prefill worker (TrySplit's conditions below).
  const bool may_split = by_cost && !prompt.whole && prompt.constrained_field.empty() && !prefill_pool.empty();
  if (may_split && TrySplit(prefill_pool, decode_pool, best, &d)) {
    CountRoutedWork(prompt.model, now,
                    static_cast<double>(d.route.prompt_tokens - d.split->predicted_cached_tokens), continues);
    if (decision_log_ != nullptr) decision_log_->Write(d, prompt.request_id, now, fleet_rate, picker_);
    return d;
  }
  if (admitted->empty()) {
    // Would an idle fleet serve it in time? Its own prefill alone, on the fastest worker, or
    // split where it may be: on a prefill worker, then pulled (a decode worker computes
    // prompts slowly beside its decodes, so its own figure alone would call a busy prefill
    // pool's request impossible).
    double alone = best;
    for (const Candidate& c : candidates) alone = std::min(alone, picker_.EstimateTtft(d.route, Idle(c), fleet_rate));
    if (may_split) {
      alone = std::min(alone, IdleSplitTtft(prefill_pool, decode_pool, d.route,
                                            static_cast<uint32_t>(d.hashes.size())));
    }
    if (alone > bound) {
      return refuse(Unavailable("no worker of model '" + std::string(prompt.model) + "' can give the first token of " +
                                std::to_string(prompt.tokens.size()) + " prompt tokens within " + Seconds(bound) +
                                " (--admission-ttft-s; by default 0.8 x --first-token-timeout-s): its prefill "
                                "alone takes about " + Seconds(alone)),
                    "unattainable", 0);
    }
    return refuse(ResourceExhausted("every worker of model '" + std::string(prompt.model) +
                                    "' would give the first token later than " + Seconds(bound) +
                                    " (--admission-ttft-s; by default 0.8 x --first-token-timeout-s): the soonest "
                                    "in about " + Seconds(best)),
                  "predicted_ttft", retry_after);
  }
  // Every candidate admitted: Pick's fleet rate and TTFTs are those above.
  const Prepared prepared{fleet_rate, ttft};
  auto choice = picker_.Pick(d.policy, d.route, *admitted, all_admitted ? &prepared : nullptr);
  if (!choice.ok()) return refuse(choice.status(), "saturated", retry_after);
  const Candidate& chosen = (*admitted)[choice->index];
  d.worker = choice->worker;
  d.device_blocks = chosen.device_blocks;
  d.host_blocks = chosen.host_blocks;
  d.predicted_cached_tokens = choice->predicted_cached_tokens;
  CountRoutedWork(prompt.model, now, static_cast<double>(d.route.prompt_tokens - d.predicted_cached_tokens),
                  continues);
  d.estimated_ttft_s = picker_.EstimateTtft(d.route, chosen, fleet_rate);
  if (chosen.pull_blocks == 0 && options().calibrate_ttft) d.ttft_terms = picker_.Terms(d.route, chosen, fleet_rate);
  d.pull_bias_s = chosen.pull_bias_s;
  if (chosen.pull_blocks > 0) {
    if (std::shared_ptr<const TransferPeer> peer = loads_->Transfer(chosen.pull_from)) {
      // Past its break-even a pull is better recomputed.
      d.pull = PullHint{peer->endpoint, peer->key, chosen.device_blocks + chosen.host_blocks, peer->name,
                        PullDeadlineMs(d.route, chosen, fleet_rate)};
      d.pull_from = chosen.pull_from;
      d.pull_computing = chosen.pull_ready_s > 0;
      d.device_blocks -= chosen.pull_blocks;  // what the worker holds itself
    }
  }
  d.candidates = std::move(admitted);
  if (decision_log_ != nullptr) decision_log_->Write(d, prompt.request_id, now, fleet_rate, picker_);
  return d;
}

void Router::Commit(const Decision& decision) {
  // A prediction stands in for the worker's stored events until they can have come: after the
  // request's prefill, which starts only once the queue ahead of it has drained. So it lives the
  // event lag (predicted_ttl) beyond the predicted first token, not from the decision: under
  // overload a queue outlasts a fixed 2 s, and the prefix was forgotten while it waited (README.md,
  // "Predicted entries").
  // A TTL of 0 turns predictions off (the index then knows what the events say, no more).
  const DurationNs event_lag = picker_.options().predicted_ttl;
  const double wait_s = std::clamp(decision.estimated_ttft_s, 0.0, config::kMaxPredictedWaitSeconds);
  const DurationNs ttl = event_lag <= 0 ? 0 : event_lag + static_cast<DurationNs>(wait_s * kNsPerSec);
  // Predicted entries only for what the worker will store: a windowed pool keeps a
  // sequence's first window, no more (README.md, "Windowed models").
  auto stored_by = [&](WorkerId worker) {
    std::span<const BlockHash> stored = decision.hashes;
    if (const uint32_t limit = loads_->StoredPrefixBlocks(worker); limit > 0 && stored.size() > limit) {
      stored = stored.first(limit);
    }
    return stored;
  };
  const std::span<const BlockHash> stored = stored_by(decision.worker);
  kv_index_->InsertPredicted(decision.worker, stored, ttl);
  // A split request's prefill worker keeps the prompt's blocks too (its pool's limit alike).
  if (decision.split) kv_index_->InsertPredicted(decision.split->worker, stored_by(decision.split->worker), ttl);
  if (decision.policy == Policy::kApprox) approx_in_use_.store(true, std::memory_order_relaxed);
  if (approx_index_ != kv_index_ && approx_in_use_.load(std::memory_order_relaxed)) {
    // Without events the worker's cache is modelled as its own LRU (README.md, "approx").
    approx_index_->SetCapacity(decision.worker, loads_->CacheBlocks(decision.worker));
    approx_index_->InsertPredicted(decision.worker, stored, picker_.options().approx_ttl);
  }
}

std::function<Result<WorkerId>(std::span<const WorkerId> tried)> Router::Rerouter(const Decision& decision) {
  return MakeRerouter(decision.policy, decision.route, decision.lora_id, decision.candidates);
}

std::function<Result<WorkerId>(std::span<const WorkerId> tried)> Router::MakeRerouter(
    Policy policy, const RouteRequest& route, uint64_t lora_id, std::shared_ptr<const std::vector<Candidate>> candidates) {
  return [this, policy, route, lora_id, candidates = std::move(candidates)](std::span<const WorkerId> tried) -> Result<WorkerId> {
    std::vector<Candidate> rest;
    for (Candidate c : *candidates) {
      if (std::find(tried.begin(), tried.end(), c.worker) != tried.end()) continue;
      if (!loads_->Routable(c.worker)) continue;  // it left since the decision
      if (!AddAdapter(lora_id, &c)) continue;     // it dropped the adapter since
      rest.push_back(c);
    }
    std::vector<WorkerId> ids;
    for (const Candidate& c : rest) ids.push_back(c.worker);
    std::vector<WorkerLoads::LoadView> views;
    loads_->Loads(ids, &views);
    std::vector<const std::vector<WorkerId>*> mates;
    for (size_t i = 0; i < rest.size(); ++i) {
      AddLoad(policy, views[i], &rest[i]);  // its load now, not at the decision
      mates.push_back(&views[i].device_mates);
    }
    AddDeviceLoad(policy, mates, &rest);
    if (rest.empty()) return Unavailable("no other live worker to retry on");
    std::vector<double> ttft;
    rest = Admissible(route, rest, &ttft);
    if (rest.empty()) {
      return ResourceExhausted("no other worker can give the first token within " +
                               Seconds(options().admission_ttft_s) + " (--admission-ttft-s)");
    }
    KVF_ASSIGN_OR_RETURN(Choice choice, picker_.Pick(policy, route, rest));
    return choice.worker;
  };
}

}  // namespace kvfleet::router
