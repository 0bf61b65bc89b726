// Router: one request's routing decision over a fake fleet's loads and in-memory indexes.
#include "router/routing/router.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "router/index/retention_estimate.h"
#include "router/routing/predicted_index.h"
#include "tests/router/routing/router_fixture.h"

namespace kvfleet::router {
namespace {

using testing::FakeLoads;
using testing::Fixture;
using testing::kBlockSize;

TEST_CASE("the kv policy picks the worker holding the prompt's prefix") {
  Fixture f;
  f.kv.InsertPredicted(2, f.Hashes(), kNsPerSec);
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->worker == 2);
  CHECK(d->device_blocks == 10);
  CHECK(d->host_blocks == 0);
  CHECK(d->predicted_cached_tokens == 10 * kBlockSize);
  CHECK(d->estimated_ttft_s == 0);  // a whole hit on an idle worker: nothing to wait for
  CHECK(d->hashes == f.Hashes());
  REQUIRE(d->candidates);
  CHECK(d->candidates->size() == 3);
}

TEST_CASE("a conversation's first turn carries the turns seen per start; a later turn none") {
  Fixture f;
  auto conversation = [&](TokenId first_token, int later_turns) {
    std::vector<TokenId> tokens(10 * kBlockSize);
    std::iota(tokens.begin(), tokens.end(), first_token);
    std::vector<double> follow_ups;
    for (int turn = 0; turn <= later_turns; ++turn) {
      f.clock.AdvanceMs(100);
      auto d = f.router.Route(f.fleet, Prompt{"m", tokens, "", Policy::kKv});
      REQUIRE(d.ok());
      follow_ups.push_back(d->route.follow_ups);
      f.router.Commit(*d);  // its prefix predicted where it went: the next turn is a continuation
    }
    return follow_ups;
  };
  // The first request only starts the counts' clock; then a start and its three later turns.
  CHECK(conversation(100, 3) == std::vector<double>{0, 0, 0, 0});
  CHECK(conversation(5000, 3) == std::vector<double>{0, 0, 0, 0});
  // Six continuations over one start counted so far (decayed alike over 0.8 s).
  const std::vector<double> third = conversation(9000, 1);
  CHECK(third[0] == doctest::Approx(6).epsilon(0.1));
  CHECK(third[1] == 0);
}

TEST_CASE("predicted entries stop at the blocks a windowed worker stores: its first window") {
  Fixture f;
  for (WorkerId w : {0u, 1u, 2u}) f.loads.stored_prefix[w] = 3;  // a window of 3 blocks
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  f.router.Commit(*d);
  CHECK(f.Matched(f.kv, d->worker) == 3);
  auto next = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(next.ok());
  CHECK(next->worker == d->worker);
  CHECK(next->predicted_cached_tokens == 3 * kBlockSize);
  // No limit: every block of the prompt.
  Fixture g;
  auto e = g.router.Route(g.fleet, g.PromptOf(Policy::kKv));
  REQUIRE(e.ok());
  g.router.Commit(*e);
  CHECK(g.Matched(g.kv, e->worker) == 10);
}

TEST_CASE("a cache salt puts the prompt in another namespace: no hit") {
  Fixture f;
  f.kv.InsertPredicted(2, f.Hashes(), kNsPerSec);
  Prompt salted{"m", f.tokens, "tenant-a", Policy::kKv};
  auto d = f.router.Route(f.fleet, salted);
  REQUIRE(d.ok());
  CHECK(d->device_blocks == 0);
  CHECK(d->hashes != f.Hashes());
}

TEST_CASE("predicted entries go in only when the decision is committed") {
  Fixture f;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(f.Matched(f.kv, d->worker) == 0);
  f.router.Commit(*d);
  CHECK(f.Matched(f.kv, d->worker) == 10);
  // The next request sharing the prefix goes where the first went.
  auto next = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(next.ok());
  CHECK(next->worker == d->worker);
  CHECK(next->device_blocks == 10);
}

TEST_CASE("--decision-log: one JSON line per decision, every candidate with its estimate") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvfleet_decision_log_" + std::to_string(getpid()) + ".jsonl")).string();
  std::filesystem::remove(path);
  Fixture f;
  auto log = DecisionLog::Open(path);
  REQUIRE(log.ok());
  f.router.SetDecisionLog(log->get());
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  f.router.Commit(*d);
  Prompt named = f.PromptOf(Policy::kKv);
  named.request_id = "bench-1-7";  // the client's X-Request-Id
  auto next = f.router.Route(f.fleet, named);
  REQUIRE(next.ok());
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 2);
  CHECK(lines[0]["request_id"] == "");
  CHECK(lines[1]["request_id"] == "bench-1-7");
  CHECK(lines[1]["policy"] == "kv");
  CHECK(lines[1]["worker"] == next->worker);
  CHECK(lines[1]["estimated_ttft_s"].get<double>() == doctest::Approx(next->estimated_ttft_s));
  CHECK(lines[1]["candidates"].size() == next->candidates->size());
  bool saw_holder = false;
  for (const nlohmann::json& c : lines[1]["candidates"]) {
    if (c["worker"] == d->worker) saw_holder = c["device_blocks"] == 10;
  }
  CHECK(saw_holder);  // the first decision's predicted entries, as the second one saw them
  std::filesystem::remove(path);
  // A log that cannot be opened stops the router at start-up with the reason, not later.
  auto bad = DecisionLog::Open("/nonexistent-dir/decisions.jsonl");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("--decision-log /nonexistent-dir/decisions.jsonl") != std::string::npos);
}

// 3 s of prefill queued on every worker (the first token ~3 s away wherever it goes), then a
// kv decision committed.
Decision RouteBehindQueues(Fixture& f) {
  for (WorkerId w : f.fleet.routable) {
    f.loads.reported[w].active_prefill_tokens = 30'000;
    f.loads.reported[w].prefill_tokens_per_second = 10'000;
  }
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  REQUIRE(d->estimated_ttft_s > 3.0);
  f.router.Commit(*d);
  return *d;
}

// Issue 34: under overload a request waited longer than the 2 s TTL for its prefill, so the
// predicted entries of its prefix expired before the worker could store the blocks, and the next
// request sharing the prefix saw no holder (approx's 120 s guesses still knew it).
TEST_CASE("a prediction lives the event lag beyond the predicted first token, not from the decision") {
  Fixture f;
  const Decision d = RouteBehindQueues(f);
  const DurationNs ttl = f.router.options().predicted_ttl;
  // Past the TTL counted from the decision, still queued: the prediction stands.
  f.clock.Advance(ttl + kNsPerSec);
  CHECK(f.Matched(f.kv, d.worker) == 10);
  // Past the first token and the event lag after it, no stored event confirmed it: gone.
  f.clock.Advance(static_cast<DurationNs>(d.estimated_ttft_s * kNsPerSec));
  CHECK(f.Matched(f.kv, d.worker) == 0);
}

TEST_CASE("a predicted TTL of 0 turns predictions off, however long the request will wait") {
  RoutingOptions o;
  o.predicted_ttl = 0;
  Fixture f(o);
  const Decision d = RouteBehindQueues(f);
  f.clock.Advance(1);
  CHECK(f.Matched(f.kv, d.worker) == 0);
}

TEST_CASE("a retry chooses among the same candidates, the workers tried excluded") {
  Fixture f;
  f.kv.InsertPredicted(2, f.Hashes(), kNsPerSec);
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  auto reroute = f.router.Rerouter(*d);
  std::vector<WorkerId> tried = {2};
  auto second = reroute(tried);
  REQUIRE(second.ok());
  CHECK(*second != 2);
  tried.push_back(*second);
  auto third = reroute(tried);
  REQUIRE(third.ok());
  CHECK(std::find(tried.begin(), tried.end(), *third) == tried.end());
  tried.push_back(*third);
  CHECK(reroute(tried).status().code() == StatusCode::kUnavailable);
  // A worker that joined after the decision is not a candidate for its retry.
  f.fleet.routable.push_back(3);
  CHECK(!reroute(tried).ok());
}

TEST_CASE("a retry does not aim at a candidate that left after the decision") {
  Fixture f;
  f.kv.InsertPredicted(2, f.Hashes(), kNsPerSec);
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  REQUIRE(d->worker == 2);
  auto reroute = f.router.Rerouter(*d);
  const std::vector<WorkerId> tried = {2};
  auto before = reroute(tried);
  REQUIRE(before.ok());
  const WorkerId left = *before;  // the retry's choice, until it leaves
  f.loads.gone.insert(left);
  auto after = reroute(tried);
  REQUIRE(after.ok());
  CHECK(*after != left);
  CHECK(*after != 2);
  // Every other candidate gone: nothing to retry on.
  for (WorkerId w : f.fleet.routable) f.loads.gone.insert(w);
  CHECK(reroute(tried).status().code() == StatusCode::kUnavailable);
}

TEST_CASE("the approx policy reads and feeds the approx index, not the kv index") {
  Fixture f;
  f.kv.InsertPredicted(0, f.Hashes(), kNsPerSec);
  f.approx.InsertPredicted(1, f.Hashes(), kNsPerSec);
  auto kv = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(kv.ok());
  CHECK(kv->worker == 0);
  // Before any approx request, kv decisions do not feed the approx index.
  f.router.Commit(*kv);
  CHECK(f.Matched(f.approx, 0) == 0);
  auto approx = f.router.Route(f.fleet, f.PromptOf(Policy::kApprox));
  REQUIRE(approx.ok());
  CHECK(approx->worker == 1);
  f.router.Commit(*approx);
  // From the first approx request on, every decision feeds both.
  auto again = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(again.ok());
  f.router.Commit(*again);
  CHECK(f.Matched(f.approx, again->worker) == 10);
}

TEST_CASE("a load report is blended with this router's own counts, then and now") {
  Fixture f;
  f.fleet.routable = {0};
  WorkerLoad report;
  report.active_requests = 3;
  report.queued_requests = 2;
  report.active_prefill_tokens = 5000;
  report.prefill_tokens_per_second = 20000;
  report.received_at = 777;
  f.loads.reported[0] = report;
  // When the report came, 4 of its requests (4,000 prompt tokens) were this router's; now it
  // has 2 in flight, expected to prefill 300 uncached tokens.
  f.loads.own_then[0] = OwnLoadCounts{4, 1000, 4000, 1};
  f.loads.own[0] = OwnLoadCounts{2, 300, 2500, 2};
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(f.loads.asked_at == 777);
  const Candidate& c = d->candidates->at(0);
  CHECK(c.running_requests == doctest::Approx(2 + (3 + 2 - 4)));
  CHECK(c.queued_prefill_tokens == doctest::Approx(300 + (5000 - 4000)));
  CHECK(c.queued_requests == doctest::Approx(2));  // max(reported queued, own - reported active)
  CHECK(c.prefill_tokens_per_s == doctest::Approx(20000));
  CHECK(c.waiting_requests == doctest::Approx(2 + (2 - 1)));  // own now + the report's queued beyond own then
  CHECK(c.step_s < 0);  // no decode rate reported: the constant per running request
  f.loads.reported[0].decode_tokens_per_second = 250;  // 3 running: a 12 ms step
  auto measured = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(measured.ok());
  CHECK(measured->candidates->at(0).step_s == doctest::Approx(0.012));
  // The approx policy knows no reports: its own counts alone.
  auto a = f.router.Route(f.fleet, f.PromptOf(Policy::kApprox));
  REQUIRE(a.ok());
  const Candidate& ca = a->candidates->at(0);
  CHECK(ca.running_requests == doctest::Approx(2));
  CHECK(ca.queued_prefill_tokens == doctest::Approx(300));
  CHECK(ca.queued_requests == doctest::Approx(2));
  CHECK(ca.prefill_tokens_per_s == 0);
  CHECK(ca.step_s < 0);
  CHECK(ca.waiting_requests == doctest::Approx(2));
}

TEST_CASE("the prefill a report shows done on this router's pending prompts is not counted again") {
  Fixture f;
  f.fleet.routable = {0};
  WorkerLoad report;
  report.active_requests = 1;
  report.active_prefill_tokens = 2000;  // 8,000 of the 10,000-token prompt prefilled
  report.prefill_tokens_per_second = 20000;
  report.received_at = 777;
  f.loads.reported[0] = report;
  f.loads.own_then[0] = OwnLoadCounts{1, 10000, 10000, 1, 0};
  f.loads.own[0] = OwnLoadCounts{1, 10000, 10000, 1, 0};
  auto route = [&] {
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    return d->candidates->at(0).queued_prefill_tokens;
  };
  CHECK(route() == doctest::Approx(2000));  // counted whole, it was 10,000
  // Its first token came since the report, and a 3,000-token prompt was sent: the progress
  // left with it, and is not taken off the new prompt.
  f.loads.own[0] = OwnLoadCounts{2, 3000, 3000, 1, 10000};
  CHECK(route() == doctest::Approx(3000));
  // A prompt sent before the report was read but after it was written: the worker did not have
  // it yet (its counts hold fewer requests than this router had there), so its absence from the
  // report is no progress.
  f.loads.own_then[0] = OwnLoadCounts{2, 13000, 13000, 2, 0};
  f.loads.own[0] = OwnLoadCounts{2, 13000, 13000, 2, 0};
  CHECK(route() == doctest::Approx(13000));
  // A second router's prompts in the report hide the progress (a lower bound, never more).
  f.loads.reported[0].active_requests = 3;
  f.loads.reported[0].active_prefill_tokens = 2000 + 9000;
  f.loads.own_then[0] = OwnLoadCounts{1, 10000, 10000, 1, 0};
  f.loads.own[0] = OwnLoadCounts{1, 10000, 10000, 1, 0};
  CHECK(route() == doctest::Approx(10000 + 1000));
}

TEST_CASE("the fleet's load is the uncached prefill this router sent the model lately over its prefill rate") {
  RoutingOptions o;
  o.fleet_load_window = kNsPerSec;
  Fixture f(o);
  for (WorkerId w : {0u, 1u, 2u}) {
    WorkerLoad report;
    report.prefill_tokens_per_second = 1000;  // the fleet prefills 3,000 tokens/s
    f.loads.reported[w] = report;
  }
  const double prompt = static_cast<double>(f.tokens.size());
  auto first = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(first.ok());
  CHECK(first->route.fleet_load == 0);  // nothing sent yet; the first prompt starts the clock
  f.clock.Advance(kNsPerSec / 2);
  auto second = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(second.ok());
  CHECK(second->route.fleet_load == 0);  // one request is no rate yet
  // One uncached prompt in the 0.5 s since the first (issue 34: not in the whole 1 s window,
  // which a fresh router has not yet observed).
  const double observed = -std::expm1(-0.5);  // the share of the window's weight 0.5 s fills
  auto third = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(third.ok());
  CHECK(third->route.fleet_load == doctest::Approx(prompt / observed / 3000));
  CHECK(third->route.fleet_load > 1.8 * prompt / 3000);
  // Another model's fleet has its own load.
  auto other = f.router.Route(f.fleet, Prompt{"other", f.tokens, "", Policy::kKv});
  REQUIRE(other.ok());
  CHECK(other->route.fleet_load == 0);
  // A hit sends only the uncached rest: once the prompt is predicted cached, nothing.
  f.router.Commit(*third);
  auto cached = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(cached.ok());
  CHECK(cached->predicted_cached_tokens == prompt);
  CHECK(cached->route.fleet_load == doctest::Approx(2 * prompt / observed / 3000));
  auto after_hit = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(after_hit.ok());
  CHECK(after_hit->route.fleet_load == doctest::Approx(2 * prompt / observed / 3000));
  // Many windows later the sum is full-weight, and it has decayed by e per window.
  f.clock.Advance(10 * kNsPerSec);
  auto later = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(later.ok());
  CHECK(later->route.fleet_load == doctest::Approx(2 * prompt / 3000 / std::exp(10.0)).epsilon(1e-3));
}

TEST_CASE("a fleet whose every worker is saturated is refused") {
  Fixture f;
  for (WorkerId w : f.fleet.routable) {
    WorkerLoad full;
    full.queued_requests = static_cast<uint32_t>(config::kMaxQueuedRequests);
    f.loads.reported[w] = full;
  }
  Refusal why;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv), &why);
  CHECK(d.status().code() == StatusCode::kResourceExhausted);
  CHECK(why.reason == "saturated");
  CHECK(why.retry_after_s >= 1);
}

// A worker whose last report holds `queued_prefill` prompt tokens at 10,000 tokens/s and
// `admission_s` of wait for batch slots or KV blocks (its predictedWaitUs beyond them).
WorkerLoad Busy(double queued_prefill, double admission_s = 0) {
  WorkerLoad l;
  l.active_prefill_tokens = static_cast<uint64_t>(queued_prefill);
  l.prefill_tokens_per_second = 10'000;
  l.predicted_wait_us = static_cast<uint64_t>((queued_prefill / 10'000 + admission_s) * 1e6);
  return l;
}

RoutingOptions AdmitWithin(double seconds) {
  RoutingOptions o;
  o.admission_ttft_s = seconds;
  return o;
}

TEST_CASE("admission: no worker predicted to give the first token in time, so a 429 now, not a 504 later") {
  for (Policy policy : {Policy::kRoundRobin, Policy::kLeastLoaded, Policy::kKv}) {
    CAPTURE(PolicyName(policy));
    Fixture f(AdmitWithin(1.0));
    // 2.5 s of prefill queued on each: the 40-token prompt's first token ~2.5 s away.
    for (WorkerId w : f.fleet.routable) f.loads.reported[w] = Busy(25'000);
    Refusal why;
    auto d = f.router.Route(f.fleet, f.PromptOf(policy), &why);
    CHECK(d.status().code() == StatusCode::kResourceExhausted);
    CHECK(d.status().message().find("--first-token-timeout-s") != std::string::npos);
    CHECK(why.reason == "predicted_ttft");
    // Retry once the soonest worker's queue is down to the bound: ~1.5 s.
    CHECK(why.retry_after_s == doctest::Approx(2.5 + 40.0 / 10'000 - 1.0).epsilon(0.01));

    // One worker's queue shrinks to 0.5 s: every policy sends the request there, and only there.
    f.loads.reported[1] = Busy(5'000);
    for (int i = 0; i < 3; ++i) {
      auto ok = f.router.Route(f.fleet, f.PromptOf(policy));
      REQUIRE(ok.ok());
      CHECK(ok->worker == 1);
      CHECK(ok->estimated_ttft_s == doctest::Approx(0.5 + 40.0 / 10'000).epsilon(0.01));
      CHECK(ok->candidates->size() == 1);
    }
  }
}

TEST_CASE("admission: the wait a worker reports beyond its prefill queue (a full batch or KV cache) counts") {
  Fixture f(AdmitWithin(1.0));
  f.fleet.routable = {0, 1};
  f.loads.reported[0] = Busy(1'000, 3.0);  // a short queue, but no room before 3 s of decodes end
  f.loads.reported[1] = Busy(6'000);
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->worker == 1);
  f.loads.reported[1] = Busy(1'000, 2.0);
  Refusal why;
  CHECK(f.router.Route(f.fleet, f.PromptOf(Policy::kKv), &why).status().code() == StatusCode::kResourceExhausted);
  CHECK(why.retry_after_s == doctest::Approx(0.1 + 2.0 + 40.0 / 10'000 - 1.0).epsilon(0.01));
}

TEST_CASE("admission: this router's requests sent since the last report count against the bound") {
  Fixture f(AdmitWithin(1.0));
  f.fleet.routable = {0};
  f.loads.reported[0] = Busy(2'000);  // 0.2 s when the report was written
  CHECK(f.router.Route(f.fleet, f.PromptOf(Policy::kKv)).ok());
  // Since then this router sent 9,000 more uncached prompt tokens there.
  f.loads.own[0] = OwnLoadCounts{3, 9'000, 9'000, 3};
  CHECK(f.router.Route(f.fleet, f.PromptOf(Policy::kKv)).status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("admission: a prompt whose prefill alone exceeds the bound on an idle fleet is 503, not worth a retry") {
  Fixture f(AdmitWithin(0.002));  // 40 tokens at the 8,000 tokens/s prior take 5 ms
  Refusal why;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv), &why);
  CHECK(d.status().code() == StatusCode::kUnavailable);
  CHECK(why.reason == "unattainable");
  CHECK(why.retry_after_s == 0);
}

TEST_CASE("the requests of a model waiting for their first token at this router are bounded") {
  RoutingOptions o;
  o.max_waiting_requests = 5;
  Fixture f(o);
  f.loads.own[0] = OwnLoadCounts{4, 100, 100, 2};
  f.loads.own[2] = OwnLoadCounts{3, 100, 100, 2};  // 4 waiting: one more may come
  CHECK(f.router.Route(f.fleet, f.PromptOf(Policy::kRoundRobin)).ok());
  f.loads.own[1] = OwnLoadCounts{1, 100, 100, 1};
  Refusal why;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kRoundRobin), &why);
  CHECK(d.status().code() == StatusCode::kResourceExhausted);
  CHECK(d.status().message().find("--max-waiting-requests") != std::string::npos);
  CHECK(why.reason == "queue_full");
}

TEST_CASE("a retry is admitted on the workers' loads at the time of the retry") {
  Fixture f(AdmitWithin(1.0));
  for (WorkerId w : f.fleet.routable) f.loads.reported[w] = Busy(1'000);
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  auto reroute = f.router.Rerouter(*d);
  std::vector<WorkerId> tried = {d->worker};
  CHECK(reroute(tried).ok());
  // Meanwhile the others filled up: the retry is refused rather than sent to wait.
  for (WorkerId w : f.fleet.routable) {
    if (w != d->worker) f.loads.reported[w] = Busy(50'000);
  }
  CHECK(reroute(tried).status().code() == StatusCode::kResourceExhausted);
}

}  // namespace
TEST_CASE("the peer policies see the index's matches and the report's decode blocks and KV usage") {
  Fixture f;
  f.kv.InsertPredicted(1, f.Hashes(), kNsPerSec);
  WorkerLoad report;
  report.active_decode_blocks = 12;
  report.free_blocks = {250, 0};
  report.total_blocks = {1000, 0};
  f.loads.reported[2] = report;
  for (Policy p : {Policy::kDynamo, Policy::kLlmd, Policy::kSglang, Policy::kPreble}) {
    CAPTURE(PolicyName(p));
    auto d = f.router.Route(f.fleet, f.PromptOf(p));
    REQUIRE(d.ok());
    CHECK(d->worker == 1);  // the whole prompt cached there, every worker otherwise idle
    CHECK(d->device_blocks == 10);
    const Candidate& c = d->candidates->at(2);
    CHECK(c.decode_blocks == 12);
    CHECK(c.kv_usage == doctest::Approx(0.75));
    CHECK(c.free_device_blocks == 250);
    CHECK(c.total_device_blocks == 1000);
    CHECK(d->candidates->at(0).total_device_blocks == 0);  // no report: unknown
  }
}

}  // namespace kvfleet::router

namespace kvfleet::router {

// Two workers hold the prompt's whole prefix. On worker 0 it is at the default priority on
// a cache turning over every half second; on worker 1 it is pinned at priority 100. Worker
// 1's queue is slightly longer, so kv (which trusts every hit) picks worker 0, where the
// prefix will likely be gone before the request's prefill starts; kv_retention picks 1.
TEST_CASE("kv_retention favours the worker where the prefix is pinned over one about to evict it") {
  ManualClock clock;
  FakeLoads loads;
  PredictedIndex kv(&clock), approx(&clock);
  RetentionEstimate retention(&clock);
  RoutingOptions options;
  options.policy = Policy::kKvRetention;  // the router's policy: the estimate tracks from the start
  Router router(options, &loads, &kv, &approx, &retention);
  REQUIRE(retention.enabled());
  ModelFleet fleet;
  fleet.block_size = 4;
  fleet.routable = {0, 1};
  fleet.workers = 2;
  std::vector<TokenId> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 100);
  const std::vector<BlockHash> hashes = BlockHasher(4, HashNamespace{"m", "", ""}).HashAll(tokens);
  for (WorkerId w : {0u, 1u}) kv.InsertPredicted(w, hashes, 60 * kNsPerSec);
  // Worker 0: 100 blocks of priority 35 (the prefix among them), 200 evictions/s.
  std::vector<BlockOp> ops;
  for (BlockHash h : hashes) ops.push_back(BlockOp{h, BlockOp::kStore, kv::Tier::kDevice, 35});
  BlockHash next = 1;
  for (int i = 0; i < 90; ++i) ops.push_back(BlockOp{next++, BlockOp::kStore, kv::Tier::kDevice, 35});
  retention.Apply(0, ops);
  BlockHash oldest = 1;
  for (int tick = 0; tick < 300; ++tick) {
    clock.AdvanceMs(50);
    ops.clear();
    for (int i = 0; i < 10; ++i) ops.push_back(BlockOp{oldest++, BlockOp::kRemove, kv::Tier::kDevice});
    for (int i = 0; i < 10; ++i) ops.push_back(BlockOp{next++, BlockOp::kStore, kv::Tier::kDevice, 35});
    retention.Apply(0, ops);
  }
  // Worker 1: the prefix at priority 100 amid the same churn at 35.
  ops.clear();
  for (BlockHash h : hashes) ops.push_back(BlockOp{h, BlockOp::kStore, kv::Tier::kDevice, 100});
  retention.Apply(1, ops);
  for (int tick = 0; tick < 40; ++tick) {
    ops.clear();
    for (int i = 0; i < 10; ++i) ops.push_back(BlockOp{next + i, BlockOp::kStore, kv::Tier::kDevice, 35});
    for (int i = 0; i < 10; ++i) ops.push_back(BlockOp{next + i, BlockOp::kRemove, kv::Tier::kDevice});
    next += 10;
    retention.Apply(1, ops);
  }
  REQUIRE(retention.Lifetime(0, 35) < 1.0);
  // About a second of prefill queued on each (the default 8,000 tokens/s), no spare blocks.
  loads.own[0] = OwnLoadCounts{1, 8'000, 8'000, 1};
  loads.own[1] = OwnLoadCounts{1, 8'040, 8'040, 1};

  auto plain = router.Route(fleet, Prompt{"m", tokens, "", Policy::kKv});
  REQUIRE(plain.ok());
  CHECK(plain->worker == 0);
  CHECK(plain->predicted_cached_tokens == 40);
  auto aware = router.Route(fleet, Prompt{"m", tokens, "", Policy::kKvRetention});
  REQUIRE(aware.ok());
  CHECK(aware->worker == 1);
  CHECK(aware->predicted_cached_tokens == 40);
  // With unused blocks enough for the queue ahead, worker 0 evicts nothing first: as kv.
  WorkerLoad roomy;
  roomy.free_blocks = {10'000, 0};
  loads.reported[0] = roomy;
  loads.reported[1] = roomy;
  auto spare = router.Route(fleet, Prompt{"m", tokens, "", Policy::kKvRetention});
  REQUIRE(spare.ok());
  CHECK(spare->worker == 0);
}

TEST_CASE("the retention estimate starts tracking with the first kv_retention request") {
  ManualClock clock;
  FakeLoads loads;
  PredictedIndex kv(&clock), approx(&clock);
  RetentionEstimate retention(&clock);
  Router router(RoutingOptions{}, &loads, &kv, &approx, &retention);
  ModelFleet fleet;
  fleet.block_size = 4;
  fleet.routable = {0};
  fleet.workers = 1;
  std::vector<TokenId> tokens(8, 1);
  REQUIRE(router.Route(fleet, Prompt{"m", tokens, "", Policy::kKv}).ok());
  CHECK_FALSE(retention.enabled());
  REQUIRE(router.Route(fleet, Prompt{"m", tokens, "", Policy::kKvRetention}).ok());
  CHECK(retention.enabled());
}

TEST_CASE("kv_retention without a retention estimate routes as kv") {
  ManualClock clock;
  FakeLoads loads;
  PredictedIndex kv(&clock), approx(&clock);
  Router router(RoutingOptions{}, &loads, &kv, &approx);
  ModelFleet fleet;
  fleet.block_size = 4;
  fleet.routable = {0, 1};
  fleet.workers = 2;
  std::vector<TokenId> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 100);
  kv.InsertPredicted(1, BlockHasher(4, HashNamespace{"m", "", ""}).HashAll(tokens), kNsPerSec);
  auto d = router.Route(fleet, Prompt{"m", tokens, "", Policy::kKvRetention});
  REQUIRE(d.ok());
  CHECK(d->worker == 1);
  CHECK(d->predicted_cached_tokens == 40);
}

}  // namespace kvfleet::router
