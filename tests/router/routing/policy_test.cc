// Each routing policy's choice on constructed fleets.
#include "router/routing/policy.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::router {
namespace {

Candidate Idle(WorkerId id) {
  Candidate c;
  c.worker = id;
  c.prefill_tokens_per_s = 10'000;
  return c;
}

}  // namespace

TEST_CASE("policy names parse and print") {
  for (auto name : {"round_robin", "least_loaded", "kv", "approx"}) {
    auto p = ParsePolicy(name);
    REQUIRE(p.ok());
    CHECK(PolicyName(*p) == name);
  }
  CHECK_FALSE(ParsePolicy("random").ok());
}

TEST_CASE("round_robin visits every worker in turn") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  std::map<WorkerId, int> seen;
  for (int i = 0; i < 9; ++i) seen[picker.Pick(Policy::kRoundRobin, {100, 32}, fleet)->worker]++;
  CHECK(seen == std::map<WorkerId, int>{{0, 3}, {1, 3}, {2, 3}});
}

TEST_CASE("least_loaded picks the worker running the fewest requests") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].running_requests = 5;
  fleet[1].running_requests = 2;
  fleet[2].running_requests = 7;
  fleet[1].device_blocks = 0;
  fleet[0].device_blocks = 100;  // ignored by this policy
  CHECK(picker.Pick(Policy::kLeastLoaded, {3200, 32}, fleet)->worker == 1);
}

TEST_CASE("kv prefers the worker holding the prompt's prefix") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[2].device_blocks = 100;  // 3,200 of 4,000 tokens cached
  auto d = picker.Pick(Policy::kKv, {4000, 32}, fleet);
  REQUIRE(d.ok());
  CHECK(d->worker == 2);
  CHECK(d->predicted_cached_tokens == 3200);
  CHECK(d->estimated_ttft_s == doctest::Approx(800.0 / 10'000 + 0).epsilon(1e-9));
}

TEST_CASE("kv weighs a prefix hit against queued prefill work") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].device_blocks = 10;               // saves 320 tokens
  fleet[0].queued_prefill_tokens = 20'000;   // but 2 s of prefill are queued ahead
  fleet[0].running_requests = 3;
  CHECK(picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker == 1);
  fleet[0].queued_prefill_tokens = 100;      // a short queue: the hit wins
  CHECK(picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker == 0);
}

TEST_CASE("kv keeps a burst sharing a new prefix on the worker already computing it") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  // The burst's first request (2,080 shared + 10 own tokens) is still prefilling on 0; its
  // blocks are predicted there. Each later request shares 65 blocks and adds 10 tokens.
  fleet[0].device_blocks = 65;
  for (int queued = 1; queued < 20; ++queued) {
    fleet[0].queued_prefill_tokens = 2090 + 10.0 * (queued - 1);
    fleet[0].running_requests = queued;
    CHECK(picker.Pick(Policy::kKv, {2090, 32}, fleet)->worker == 0);
  }
  // Pure TTFT (no work term) would already send the second request elsewhere.
  RoutingOptions pure;
  pure.uncached_work_weight = 0;
  Picker ttft_only(pure);
  fleet[0].queued_prefill_tokens = 2090;
  fleet[0].running_requests = 1;
  CHECK(ttft_only.Pick(Policy::kKv, {2090, 32}, fleet)->worker != 0);
}

TEST_CASE("under load kv charges the prefill a choice adds once per request waiting in the fleet") {
  // A long prompt, nearly all cached on worker 0 behind 0.74 s of queued prefill; worker 1 is
  // idle and would compute it whole in 0.3 s. Requests waiting elsewhere will queue behind
  // that recompute, so the busier the fleet, the more the hit is worth.
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet;
  for (WorkerId w = 0; w < 8; ++w) fleet.push_back(Idle(w));
  for (Candidate& c : fleet) c.prefill_tokens_per_s = 25'000;
  fleet[0].device_blocks = 228;  // 7,296 of 7,572 tokens
  fleet[0].queued_prefill_tokens = 18'400;
  for (WorkerId w = 2; w < 8; ++w) fleet[w].queued_prefill_tokens = 20'000;
  const RouteRequest r{7572, 32};
  CHECK(picker.DelayedRequests(fleet) == doctest::Approx(1.0));  // nobody waiting: the floor
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 1);         // light load: the sooner first token
  fleet[0].waiting_requests = 4;
  for (WorkerId w = 2; w < 8; ++w) fleet[w].waiting_requests = 4;
  CHECK(picker.DelayedRequests(fleet) == doctest::Approx(28.0 / 8));
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 0);         // loaded: the hit
}

TEST_CASE("the busier the fleet in work, the longer its backlog lasts, and the more an added prefill costs") {
  // The holder (worker 0) caches 7,296 of 7,572 tokens behind 0.74 s of queued prefill; worker
  // 1 is idle and computes the prompt whole in 0.3 s. Below one request waiting per worker, the
  // added prefill is charged once and the idle worker wins; with the fleet's prefill rate half
  // used, the backlog it joins lasts twice as long (N / (1 - rho)) and the hit wins.
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet;
  for (WorkerId w = 0; w < 8; ++w) fleet.push_back(Idle(w));
  for (Candidate& c : fleet) c.prefill_tokens_per_s = 25'000;
  fleet[0].device_blocks = 228;
  fleet[0].queued_prefill_tokens = 18'400;
  for (WorkerId w = 0; w < 8; ++w) fleet[w].waiting_requests = w == 1 ? 0 : 1;
  RouteRequest r{7572, 32};
  CHECK(picker.DelayedRequests(fleet, r.fleet_load) == doctest::Approx(1.0));  // 7/8 waiting: the floor
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 1);
  r.fleet_load = 0.5;
  CHECK(picker.DelayedRequests(fleet, r.fleet_load) == doctest::Approx(7.0 / 8 / 0.5));
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 0);
  // Beyond max_fleet_load the stretch stops growing; nobody waiting, nothing to stretch.
  r.fleet_load = 3;
  CHECK(picker.DelayedRequests(fleet, r.fleet_load) ==
        doctest::Approx(7.0 / 8 / (1 - config::kMaxFleetLoad)));
  for (Candidate& c : fleet) c.waiting_requests = 0;
  CHECK(picker.DelayedRequests(fleet, r.fleet_load) == doctest::Approx(1.0));
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 1);
  // max_fleet_load 0: no stretch at all.
  RoutingOptions flat;
  flat.max_fleet_load = 0;
  for (WorkerId w = 0; w < 8; ++w) fleet[w].waiting_requests = w == 1 ? 0 : 1;
  CHECK(Picker(flat).Pick(Policy::kKv, r, fleet)->worker == 1);
}

TEST_CASE("kv: a faster measured rate does not buy seconds of a request's wait, however loaded the fleet") {
  // Mooncake at 1.3x, logged: worker 5 queued 41 K prompt tokens (1.6 s) and, its requests all
  // still waiting, measured 8% faster than worker 2 with 6.5 K queued. At n = 10·N the work
  // charge's 8% of a 14 K-token prefill outweighed 1.3 s of the request's own wait.
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet;
  for (WorkerId w = 0; w < 8; ++w) fleet.push_back(Idle(w));
  for (Candidate& c : fleet) {
    c.prefill_tokens_per_s = 24'000;
    c.queued_prefill_tokens = 9'000;
    c.waiting_requests = 6;
  }
  fleet[5].prefill_tokens_per_s = 26'100;
  fleet[5].queued_prefill_tokens = 41'400;
  fleet[2].queued_prefill_tokens = 6'500;
  RouteRequest r{14'159, 32};
  r.fleet_load = 1.06;
  Choice d = *picker.Pick(Policy::kKv, r, fleet);
  CHECK(d.worker == 2);
  CHECK(d.estimated_ttft_s == doctest::Approx((6'500.0 + 14'159) / 24'000));
  // The work is priced at the fleet's rate: a queue 0.3 s longer than worker 2's loses, however
  // fast worker 5's steps measure while its requests still queue.
  fleet[5].queued_prefill_tokens = 6'500 + 0.3 * 26'100;
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 2);
  // Its faster rate still counts where it makes the first token sooner: the same queue as
  // worker 2's, prefilled faster.
  fleet[5].queued_prefill_tokens = 6'500;
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 5);
  // A hit still holds the request behind the longer queue: the work it spares the fleet (the
  // hit's own case is "under load kv charges the prefill a choice adds once per request waiting").
  fleet[5].queued_prefill_tokens = 41'400;
  fleet[5].device_blocks = 400;  // 12,800 of 14,159 tokens
  CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 5);
}

TEST_CASE("kv: of two equal hits, the worker whose queue drains later loses, however loaded the fleet") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  for (Candidate& c : fleet) {
    c.device_blocks = 20;  // 640 of 1,000 tokens
    c.waiting_requests = 3;
  }
  fleet[0].queued_prefill_tokens = 5'000;
  fleet[1].queued_prefill_tokens = 2'000;
  fleet[2].queued_prefill_tokens = 9'000;
  for (double rho : {0.0, 0.5, 0.95}) {
    RouteRequest r{1000, 32};
    r.fleet_load = rho;
    CHECK(picker.Pick(Policy::kKv, r, fleet)->worker == 1);
  }
}

TEST_CASE("kv counts a worker's measured step for its running requests, not a constant per request") {
  // Conversations on 8 mock workers, logged: a first token came 10-12 ms after the prefill
  // queued ahead and its own, whether 5 or 65 requests were running there; at 1 ms each the
  // router saw 60 ms between those workers, and pulled prefixes to escape a wait that was not there.
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].running_requests = 65;
  fleet[0].step_s = 0.013;
  fleet[1].running_requests = 5;
  fleet[1].step_s = 0.008;
  CHECK(picker.EstimateTtft({100, 32}, fleet[0], 10'000) == doctest::Approx(0.01 + 0.013));
  CHECK(picker.EstimateTtft({100, 32}, fleet[1], 10'000) == doctest::Approx(0.01 + 0.008));
  fleet[1].running_requests = 0;  // nothing running: no step to wait for
  CHECK(picker.EstimateTtft({100, 32}, fleet[1], 10'000) == doctest::Approx(0.01));
  fleet[1].step_s = -1;  // not measured: the constant for each running request
  fleet[1].running_requests = 5;
  CHECK(picker.EstimateTtft({100, 32}, fleet[1], 10'000) ==
        doctest::Approx(0.01 + 5 * config::kDecodeSecondsPerRunningRequest));
}

TEST_CASE("kv prices the steps a request's follow-ups will wait on where it goes, not only its own") {
  // Conversations at 0.9x of capacity on 8 mock workers, logged: a first turn went where its first
  // token was ~1 ms sooner (the step's length at 30 running against 10), and the turns after it
  // followed to that worker, whose requests then ran 2x those of the idlest.
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].running_requests = 30;
  fleet[0].step_s = 0.012;
  fleet[1].running_requests = 10;
  fleet[1].step_s = 0.009;
  fleet[1].queued_prefill_tokens = 40;  // its first token 1 ms later: 4 ms of queue, a step 3 ms shorter
  fleet[2].running_requests = 20;
  fleet[2].step_s = 0.0105;
  fleet[2].queued_prefill_tokens = 40;
  RouteRequest alone{100, 32};
  CHECK(picker.Pick(Policy::kKv, alone, fleet)->worker == 0);
  RouteRequest conversation = alone;
  conversation.follow_ups = 5;  // 5 turns after this one, on average
  CHECK(picker.Pick(Policy::kKv, conversation, fleet)->worker == 1);
  // Its own estimate is what it was: the follow-ups are in the choice's cost only.
  CHECK(picker.Pick(Policy::kKv, conversation, fleet)->estimated_ttft_s ==
        doctest::Approx(picker.EstimateTtft(alone, fleet[1], 10'000)));
  // A worker running nothing has no step for them to wait on.
  fleet[2].running_requests = 0;
  CHECK(picker.Pick(Policy::kKv, conversation, fleet)->worker == 2);
}

TEST_CASE("the follow-ups wait on the requests a worker runs, priced at the fleet's step per request, not its own step") {
  // Logged on conversations at 0.9x (8 mock workers): a worker's step off the fleet's mean did
  // not outlast half a second (its correlation 0.01-0.07 at 0.5 s), while its running requests'
  // lasted (0.64-0.68). Priced at each worker's own step, a first turn gave up 3 ms of its own
  // first token in a third of the starts for a step ~1.5 ms shorter at that moment.
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].running_requests = 15;
  fleet[0].step_s = 0.008;  // measured shorter this step
  fleet[0].queued_prefill_tokens = 40;  // 4 ms of queue
  fleet[1].running_requests = 15;
  fleet[1].step_s = 0.010;
  RouteRequest start{100, 32};
  start.follow_ups = 5;
  const double own0 = picker.EstimateTtft(start, fleet[0], 10'000), own1 = picker.EstimateTtft(start, fleet[1], 10'000);
  REQUIRE(own1 < own0);
  CHECK(picker.Pick(Policy::kKv, start, fleet)->worker == 1);  // the sooner first token: same load
  CHECK(picker.FleetStepPerRequest(fleet) == doctest::Approx(0.009 / 15));
  // With more running there, the follow-ups outweigh its sooner first token.
  fleet[1].running_requests = 25;
  fleet[1].step_s = 0.009;
  REQUIRE(picker.EstimateTtft(start, fleet[1], 10'000) < own0);
  CHECK(picker.Pick(Policy::kKv, start, fleet)->worker == 0);
  // No worker reports a step: the constant per running request.
  for (Candidate& c : fleet) c.step_s = -1;
  CHECK(picker.FleetStepPerRequest(fleet) == RoutingOptions{}.decode_s_per_running_request);
}

TEST_CASE("a decode-role worker admits a prompt with at most a block left ahead of its queue: no queue in its estimate") {
  Picker picker(RoutingOptions{});
  Candidate c = Idle(0);
  c.queued_prefill_tokens = 10'000;  // 1 s of prompts queued there
  c.admission_wait_s = 2;            // and 2 s before one more is admitted behind them
  c.pulled_wait_s = 0.25;            // a batch slot for one admitted ahead
  c.role = WorkerRole::kDecode;
  c.device_blocks = 124;  // 3,968 of 4,000 tokens cached: 32 left, one block
  const RouteRequest nearly{4000, 32};
  CHECK(picker.EstimateTtft(nearly, c, 10'000) == doctest::Approx(0.25 + 32.0 / 10'000));
  CHECK(picker.Terms(nearly, c, 10'000).queue_s == 0);
  CHECK(picker.Terms(nearly, c, 10'000).rest_s == doctest::Approx(0.25));
  c.device_blocks = 123;  // 64 left: it queues like any prompt
  CHECK(picker.EstimateTtft(nearly, c, 10'000) == doctest::Approx(1 + 2 + 64.0 / 10'000));
  c.device_blocks = 124;
  c.role = WorkerRole::kBoth;  // a role-both worker admits it in order
  CHECK(picker.EstimateTtft(nearly, c, 10'000) == doctest::Approx(1 + 2 + 32.0 / 10'000));
}

TEST_CASE("kv charges host-tier hits their onboarding cost") {
  RoutingOptions o;
  o.onboard_s_per_block = 0.01;  // slow onboarding: a host hit is worth less than a device hit
  Picker picker(o);
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].host_blocks = 10;     // 320 tokens = 32 ms of prefill, but 100 ms to onboard
  fleet[1].device_blocks = 5;    // 160 tokens = 16 ms
  CHECK(picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker == 1);
  o.onboard_s_per_block = 0.0001;
  Picker fast(o);
  CHECK(fast.Pick(Policy::kKv, {1000, 32}, fleet)->worker == 0);
}

TEST_CASE("kv uses the fleet's median prefill rate for a worker without one") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[2].prefill_tokens_per_s = 0;
  Candidate probe = fleet[2];
  CHECK(picker.EstimateTtft({1000, 32}, probe, 10'000) == doctest::Approx(0.1));
  fleet[0].running_requests = 1;
  fleet[1].running_requests = 1;
  // Same rate assumed, fewer running requests: worker 2 wins.
  CHECK(picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker == 2);
}

TEST_CASE("kv never rates a worker slower than the fleet's median: a slow measurement cannot starve it") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  // Worker 2's last steps were long prompts (attention-bound): it measured 500 tokens/s.
  fleet[2].prefill_tokens_per_s = 500;
  CHECK(picker.EstimateTtft({1000, 32}, fleet[2], 10'000) == doctest::Approx(0.1));
  fleet[0].running_requests = 1;
  fleet[1].running_requests = 1;
  // Idle and costed at the fleet's rate, it gets the request.
  CHECK(picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker == 2);
  // A worker measured faster than the median keeps its own rate.
  fleet[0].prefill_tokens_per_s = 40'000;
  CHECK(picker.EstimateTtft({1000, 32}, fleet[0], 10'000) == doctest::Approx(0.025 + 0.001));
}

TEST_CASE("the hot-spot guard skips a worker far above the fleet's median load") {
  RoutingOptions o;
  o.hot_spot_factor = 2;
  o.hot_spot_min_requests = 4;
  o.decode_s_per_running_request = 0;  // only the guard keeps traffic off the hot worker
  Picker picker(o);
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].device_blocks = 120;  // everyone's shared system prompt is here
  fleet[0].running_requests = 10;
  fleet[1].running_requests = 2;
  fleet[2].running_requests = 3;
  CHECK(picker.Pick(Policy::kKv, {4000, 32}, fleet)->worker != 0);
  o.hot_spot_factor = 0;  // guard off: the hit wins
  Picker unguarded(o);
  CHECK(unguarded.Pick(Policy::kKv, {4000, 32}, fleet)->worker == 0);
  // Below the absolute floor the guard does not act.
  fleet[0].running_requests = 4;
  fleet[1].running_requests = 0;
  fleet[2].running_requests = 0;
  CHECK(picker.Pick(Policy::kKv, {4000, 32}, fleet)->worker == 0);
}

TEST_CASE("a softmax temperature spreads choices, mostly to the cheapest") {
  RoutingOptions o;
  o.temperature = 0.5;
  Picker picker(o, 42);
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].device_blocks = 30;
  fleet[1].device_blocks = 15;
  std::map<WorkerId, int> seen;
  for (int i = 0; i < 2000; ++i) seen[picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker]++;
  CHECK(seen[0] > seen[1]);
  CHECK(seen[1] > seen[2]);
  CHECK(seen[2] > 0);
}

TEST_CASE("equal costs: the lowest id alone, each router's own order beside other routers") {
  const std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2), Idle(3), Idle(4), Idle(5), Idle(6), Idle(7)};
  CHECK(Picker(RoutingOptions{}).Pick(Policy::kKv, {1000, 32}, fleet)->worker == 0);
  // Eight routers (each its salt) facing the same idle fleet: not all on one worker, and each
  // always on the same one (the order is the router's, not a coin's).
  std::map<WorkerId, int> first;
  for (uint64_t r = 1; r <= 8; ++r) {
    RoutingOptions o;
    o.tie_salt = std::hash<std::string>{}("router-" + std::to_string(r)) | 1;
    Picker picker(o);
    const WorkerId w = picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker;
    CHECK(picker.Pick(Policy::kKv, {1000, 32}, fleet)->worker == w);
    first[w]++;
  }
  CHECK(first.size() >= 4);
  // A cost difference still decides: the salt orders only ties.
  std::vector<Candidate> held = fleet;
  held[6].device_blocks = 10;
  for (uint64_t salt : {uint64_t{3}, uint64_t{0x1234567}}) {
    RoutingOptions o;
    o.tie_salt = salt;
    CHECK(Picker(o).Pick(Policy::kKv, {1000, 32}, held)->worker == 6);
  }
}

TEST_CASE("saturated workers are skipped, and a saturated fleet is refused") {
  RoutingOptions o;
  o.max_queued_requests = 8;
  Picker picker(o);
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].queued_requests = 8;
  fleet[0].device_blocks = 100;
  for (Policy p : {Policy::kRoundRobin, Policy::kLeastLoaded, Policy::kKv}) {
    CHECK(picker.Pick(p, {4000, 32}, fleet)->worker == 1);
  }
  fleet[1].queued_requests = 9;
  auto d = picker.Pick(Policy::kKv, {4000, 32}, fleet);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("options are validated") {
  RoutingOptions o;
  CHECK(o.Validate().ok());
  o.temperature = -1;
  CHECK_FALSE(o.Validate().ok());
  o = {};
  o.hot_spot_factor = 0.5;
  CHECK_FALSE(o.Validate().ok());
  o = {};
  o.max_fleet_load = 1;  // an unbounded stretch
  CHECK(o.Validate().message().find("max fleet load") != std::string::npos);
  o = {};
  o.fleet_load_window = 0;
  CHECK(o.Validate().message().find("fleet load window") != std::string::npos);
}

}  // namespace kvfleet::router

namespace kvfleet::router {
namespace {

TEST_CASE("a pull option is a second option of a worker, not another worker: fleet figures count each worker once") {
  Picker picker(RoutingOptions{});
  Candidate a;
  a.worker = 0;
  a.waiting_requests = 4;
  a.prefill_tokens_per_s = 10'000;
  Candidate b;
  b.worker = 1;
  b.prefill_tokens_per_s = 30'000;
  const std::vector<Candidate> workers{a, b};
  Candidate pulled = b;
  pulled.pull_from = 0;
  pulled.pull_blocks = 8;
  pulled.device_blocks = 8;
  const std::vector<Candidate> with_pull{a, b, pulled};
  CHECK(picker.DelayedRequests(with_pull) == picker.DelayedRequests(workers));
  CHECK(picker.DelayedRequests(workers) == 2);
  CHECK(picker.FleetRate(with_pull) == picker.FleetRate(workers));
}

}  // namespace
}  // namespace kvfleet::router
