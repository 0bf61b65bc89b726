// Router: the prefill rate a worker announces, and pulling a prefix from its holder
// (README.md, "Pulling a prefix"), over the fake fleet of router_fixture.h.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "router/index/global_index.h"
#include "router/routing/router.h"
#include "tests/router/routing/router_fixture.h"

namespace kvfleet::router {
namespace {

using testing::Fixture;
using testing::kBlockSize;

TEST_CASE("a cold router costs a worker at the prefill rate its Hello announced until a report measures one") {
  Fixture f;
  for (WorkerId w : {0u, 1u, 2u}) f.loads.announced[w] = 2'000;  // 4x slower than the default guess
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  // 40 uncached tokens at the announced 2,000 tokens/s, not the default 8,000.
  CHECK(d->estimated_ttft_s == doctest::Approx(40.0 / 2'000));
  SUBCASE("a measured rate in a report replaces it") {
    WorkerLoad load;
    load.prefill_tokens_per_second = 4'000;
    for (WorkerId w : {0u, 1u, 2u}) f.loads.reported[w] = load;
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->estimated_ttft_s == doctest::Approx(40.0 / 4'000));
  }
  SUBCASE("a report not yet measured keeps the announced one") {
    for (WorkerId w : {0u, 1u, 2u}) f.loads.reported[w] = WorkerLoad{};
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->estimated_ttft_s == doctest::Approx(40.0 / 2'000));
  }
}

// Three workers serving pulls (64 KiB blocks) over the event-fed index, at 1,000 prefill tokens/s
// (the prompt's 40 tokens take 40 ms to recompute); worker 2 has 80 s of prefill queued.
struct BusyHolder {
  static RoutingOptions Slow() {
    RoutingOptions o;
    o.default_prefill_tokens_per_s = 1'000;
    return o;
  }
  BusyHolder() : slow(Slow()), f(slow), global({}, &f.clock), router(slow, &f.loads, &global, &f.approx, nullptr, &f.clock) {
    for (WorkerId w : {0u, 1u, 2u}) {
      f.loads.transfer[w] =
          TransferPeer{"w" + std::to_string(w), "tcp://h" + std::to_string(w) + ":5559", "", "bf16", 64u << 10, ""};
    }
    busy.requests = 20;
    busy.prefill_tokens = 80'000;
    f.loads.own[2] = busy;
    hashes = f.Hashes();
  }
  RoutingOptions slow;
  Fixture f;
  GlobalIndex global;
  Router router;
  OwnLoadCounts busy;
  std::vector<BlockHash> hashes;
};

TEST_CASE("a pull of blocks the router only predicts waits for their prefill; stored ones come at once") {
  // The router predicts a prompt's blocks on the worker it sent the prompt to; until that
  // worker computes them, a pull from it waits (the holder answers once they are stored).
  BusyHolder h;
  auto& [slow, f, global, router, busy, hashes] = h;
  // Its first token predicted in a second (a prediction lives the event lag beyond it).
  global.InsertPredicted(2, hashes, slow.predicted_ttl + kNsPerSec);
  auto d = router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->pull.source.empty());  // predicted only, done in ~1 s: recomputing the 40 tokens is sooner
  CHECK(d->best_matched_blocks == 10);  // worker 2's predicted run: given up for its queue
  CHECK(d->device_blocks == 0);
  for (size_t i = 0; i < 6; ++i) global.Store(2, hashes[i], kv::Tier::kDevice);
  d = router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->worker != 2);
  CHECK(d->pull.source == "tcp://h2:5559");
  CHECK(d->pull.blocks == 6);  // the six its events show, not the ten predicted
  CHECK_FALSE(d->pull_computing);
  CHECK(d->best_matched_blocks == 10);
}

TEST_CASE("a busy worker still computing a prefix is pulled from once its prefill is done, not queued behind") {
  // Worker 2 got the prompt a moment ago (predicted entries, first token predicted in 10 ms)
  // and has 80 s of other prefill queued since. An idle worker pulls the prefix once stored.
  BusyHolder h;
  auto& [slow, f, global, router, busy, hashes] = h;
  global.InsertPredicted(2, hashes, slow.predicted_ttl + 10 * kNsPerMs);
  auto d = router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->worker != 2);
  CHECK(d->pull.source == "tcp://h2:5559");
  CHECK(d->pull.blocks == 10);
  CHECK(d->pull_computing);
  // Ready in ~10 ms, then the ~26 ms pull: under the 40 ms recompute, and nothing like the queue.
  CHECK(d->estimated_ttft_s < 0.04);
  CHECK(d->estimated_ttft_s > 0.03);
  // The deadline covers the wait: twice ~36 ms.
  CHECK(d->pull.deadline_ms >= 70);
  CHECK(d->pull.deadline_ms <= 75);

  SUBCASE("a holder whose queue ahead is shorter than the prediction is ready when that queue is done") {
    busy.prefill_tokens = 5;  // 5 ms at 1,000 tokens/s
    f.loads.own[2] = busy;
    global.InsertPredicted(2, hashes, slow.predicted_ttl + kNsPerSec);  // the prediction: 1 s
    auto e = router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    // Either the holder itself (its 5 ms queue) or a pull after that queue: never a recompute.
    CHECK(e->predicted_cached_tokens == 10 * kBlockSize);
  }
  SUBCASE("once its prefill is predicted later than recomputing, the prefix is recomputed") {
    global.InsertPredicted(2, hashes, slow.predicted_ttl + 500 * kNsPerMs);
    auto e = router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker != 2);
    CHECK(e->pull.source.empty());
  }
  SUBCASE("a holder whose events show the prefix is pulled from at once instead") {
    for (size_t i = 0; i < 10; ++i) global.Store(1, hashes[i], kv::Tier::kDevice);
    f.loads.own[1] = busy;
    auto e = router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker == 0);
    CHECK(e->pull.source == "tcp://h1:5559");
    CHECK_FALSE(e->pull_computing);
  }
}

// A pair's fit after 30 pulls of the test's 10-block run (640 KiB), each taking `seconds`.
PullFit PullsOfTheRun(double seconds) {
  PullFit fit;
  for (int i = 0; i < 30; ++i) fit.Add(1, 655'360, seconds);
  return fit;
}

TEST_CASE("a busy holder's prefix is pulled by an idle worker instead of recomputed or queued for") {
  RoutingOptions slow;
  slow.default_prefill_tokens_per_s = 1'000;  // the 40 tokens take 40 ms to recompute
  slow.transfer_measured = true;              // no pair has measured pulls but where a subcase says
  slow.transfer_bytes_per_s = 0.5e9;
  Fixture f(slow);
  for (WorkerId w : {0u, 1u, 2u}) {
    // 64 KiB a block: 10 blocks pull in ~26 ms at 0.5 GB/s and the default 25 ms setup.
    f.loads.transfer[w] = TransferPeer{"w" + std::to_string(w), "tcp://h" + std::to_string(w) + ":5559", "", "bf16", 64u << 10};
  }
  f.kv.InsertPredicted(2, f.Hashes(), kNsPerSec);
  OwnLoadCounts busy;
  busy.requests = 20;
  busy.prefill_tokens = 80'000;  // 80 s of prefill queued
  f.loads.own[2] = busy;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->worker != 2);
  CHECK(d->pull.source == "tcp://h2:5559");
  CHECK(d->pull.blocks == 10);
  CHECK(d->pull.worker_id == "w2");
  CHECK(d->pull.deadline_ms == 53);  // twice the predicted 26.3 ms
  CHECK(d->pull_from == 2);
  CHECK(d->device_blocks == 0);  // what the worker holds itself
  CHECK(d->predicted_cached_tokens == 10 * kBlockSize);
  // The pull's 640 KiB at 0.5 GB/s and its setup: ~26 ms, not the holder's 80 s queue.
  CHECK(d->estimated_ttft_s < 0.05);

  SUBCASE("a worker with prefill queued ahead waits for its pull until recomputing would have been done") {
    OwnLoadCounts queued;
    queued.requests = 1;
    queued.prefill_tokens = 100;  // 100 ms at 1,000 tokens/s, which the pull overlaps
    f.loads.own[0] = f.loads.own[1] = queued;
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker != 2);
    CHECK(e->pull.source == "tcp://h2:5559");
    // The queue's 100 ms, then the 40 pulled tokens' 40 ms: not twice the pull's 26.3 ms.
    CHECK(e->pull.deadline_ms == 140);
  }
  SUBCASE("pulls whose first tokens came later than estimated, beyond the others', carry that in their estimate") {
    auto observe = [&](double pulled_late_s, int n) {
      for (int i = 0; i < n; ++i) {
        f.router.ObserveEstimate(true, 0.03, 0.03 + 0.009 + pulled_late_s);
        f.router.ObserveEstimate(false, 0.02, 0.02 + 0.009);  // the others: 9 ms after theirs
      }
    };
    observe(0.005, config::kPullBiasMinObservations - 1);
    auto early = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(early.ok());
    CHECK(early->pull_bias_s == 0);  // not before kPullBiasMinObservations of each
    CHECK(early->estimated_ttft_s == doctest::Approx(d->estimated_ttft_s));
    observe(0.005, 1);
    CHECK(f.router.calibration().pull_bias_s() == doctest::Approx(0.005));
    auto late = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(late.ok());
    CHECK(late->pull.source == "tcp://h2:5559");  // 5 ms later: still sooner than recomputing
    CHECK(late->pull_bias_s == doctest::Approx(0.005));
    CHECK(late->estimated_ttft_s == doctest::Approx(d->estimated_ttft_s + 0.005));
    // Pulls 80 ms late (the recent ones count most): recomputing the 40 tokens (40 ms, and as
    // much again for the work it adds to the fleet) is cheaper than the pull's ~106 ms.
    observe(0.080, 200);
    CHECK(f.router.calibration().pull_bias_s() == doctest::Approx(0.080).epsilon(0.05));
    auto slow_pulls = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(slow_pulls.ok());
    CHECK(slow_pulls->worker != 2);
    CHECK(slow_pulls->pull.source.empty());
    CHECK(slow_pulls->pull_bias_s == 0);
    // Garbage is not taken; pulls sooner than estimated make them cheaper.
    f.router.ObserveEstimate(true, std::nan(""), 1);
    CHECK(f.router.calibration().pull_bias_s() == doctest::Approx(0.080).epsilon(0.05));
    observe(-0.004, 400);
    CHECK(f.router.calibration().pull_bias_s() == doctest::Approx(-0.004).epsilon(0.05));
  }
  SUBCASE("a pull slower than recomputing is not chosen") {
    for (auto& [w, t] : f.loads.transfer) t.bytes_per_block = 16u << 20;  // 160 MiB: 0.36 s against 40 ms
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker != 2);
    CHECK(e->pull.source.empty());
  }
  SUBCASE("workers on one host pull at the device-to-device bandwidth, others at the network's") {
    for (auto& [w, t] : f.loads.transfer) t.bytes_per_block = 16u << 20;  // slower than recomputing over TCP
    f.loads.transfer[0].host_id = f.loads.transfer[2].host_id = "boot-a";
    f.loads.transfer[1].host_id = "boot-b";
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker == 0);  // 160 MiB at the default 500 GB/s: ~0.3 ms, not 0.36 s
    CHECK(e->pull.source == "tcp://h2:5559");
    CHECK(e->estimated_ttft_s < 0.05);
  }
  SUBCASE("with --transfer-measured, a pair's measured pulls price its pull instead of the flags") {
    // Worker 0's pulls from worker 2 took 0.5 s each (a link far slower than the flags say):
    // worker 1, with no pulls measured, pulls at the flags' price.
    const PullFit slow_pair = PullsOfTheRun(0.5);
    f.loads.measured[{0, "tcp://h2:5559"}] = slow_pair;
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker == 1);
    CHECK(e->pull.source == "tcp://h2:5559");
    CHECK(e->pull.deadline_ms == 53);
    // Slower from both: recomputing (40 ms) beats a pull.
    f.loads.measured[{1, "tcp://h2:5559"}] = slow_pair;
    auto g = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(g.ok());
    CHECK(g->worker != 2);
    CHECK(g->pull.source.empty());
    SUBCASE("without it, every pair is priced by the flags") {
      RoutingOptions flags_only = slow;
      flags_only.transfer_measured = false;
      Fixture h(flags_only);
      h.loads = f.loads;
      h.kv.InsertPredicted(2, h.Hashes(), kNsPerSec);
      auto k = h.router.Route(h.fleet, h.PromptOf(Policy::kKv));
      REQUIRE(k.ok());
      CHECK(k->worker != 2);
      CHECK(k->pull.source == "tcp://h2:5559");
    }
    SUBCASE("and a fast pair is priced by what it measured, not by the flags' set-up") {
      f.loads.measured[{0, "tcp://h2:5559"}] = PullsOfTheRun(0.002);
      auto h = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
      REQUIRE(h.ok());
      CHECK(h->worker == 0);
      CHECK(h->pull.source == "tcp://h2:5559");
      CHECK(h->estimated_ttft_s < 0.026);  // below the flags' 25 ms set-up alone
    }
  }
  SUBCASE("a pair whose pulls fail is weighed by its failures, measured pulls or not, until they age") {
    RoutingOptions flags_only = slow;
    flags_only.transfer_measured = false;
    Fixture h(flags_only);
    h.loads = f.loads;
    h.clock.AdvanceMs(1'000);
    h.kv.InsertPredicted(2, h.Hashes(), kNsPerSec);
    // Worker 0's last nine pulls from worker 2 failed, each after 0.5 s (a link that drops them).
    PullFit failing;
    failing.AddOutcomes(h.clock.Now(), 0, 9, 4.5);
    h.loads.measured[{0, "tcp://h2:5559"}] = failing;
    h.loads.last_pull_failure = h.clock.Now();
    auto e = h.router.Route(h.fleet, h.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker == 1);  // the pair that has not failed pulls
    CHECK(e->pull.source == "tcp://h2:5559");
    CHECK(e->estimated_ttft_s < 0.05);
    // Failing from both: recomputing the 40 tokens (40 ms) beats a pull that fails nine times in ten.
    h.loads.measured[{1, "tcp://h2:5559"}] = failing;
    auto g = h.router.Route(h.fleet, h.PromptOf(Policy::kKv));
    REQUIRE(g.ok());
    CHECK(g->worker != 2);
    CHECK(g->pull.source.empty());
    // Long after the last failure, the pairs are tried again.
    h.clock.AdvanceMs(static_cast<int64_t>(1e3 * 10 * config::kPullFailureHalfLifeSeconds) + 1);
    h.kv.InsertPredicted(2, h.Hashes(), kNsPerSec);
    auto k = h.router.Route(h.fleet, h.PromptOf(Policy::kKv));
    REQUIRE(k.ok());
    CHECK(k->pull.source == "tcp://h2:5559");
  }
  SUBCASE("an idle holder keeps its prefix's requests: no pull") {
    f.loads.own.erase(2);
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->worker == 2);
    CHECK(e->pull.source.empty());
  }
  SUBCASE("workers whose block formats differ, or that serve no pulls, do not pull") {
    f.loads.transfer[0].format = f.loads.transfer[1].format = "fp8e4m3";
    auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->pull.source.empty());
    f.loads.transfer.erase(2);
    f.loads.transfer[0].format = f.loads.transfer[1].format = "bf16";
    auto g = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(g.ok());
    CHECK(g->pull.source.empty());
  }
  SUBCASE("the peers' policies and approx never pull") {
    for (Policy p : {Policy::kApprox, Policy::kPreble, Policy::kLlmd, Policy::kRoundRobin}) {
      auto e = f.router.Route(f.fleet, f.PromptOf(p));
      REQUIRE(e.ok());
      CHECK(e->pull.source.empty());
    }
  }
  SUBCASE("a bandwidth of 0 turns pulling off") {
    RoutingOptions off = slow;
    off.transfer_bytes_per_s = 0;
    Fixture g(off);
    g.loads = f.loads;
    g.kv.InsertPredicted(2, g.Hashes(), kNsPerSec);
    auto e = g.router.Route(g.fleet, g.PromptOf(Policy::kKv));
    REQUIRE(e.ok());
    CHECK(e->pull.source.empty());
  }
}

TEST_CASE("a pair's pull fit: the prior without pulls, the pulls' own time at their size, never a negative term") {
  const PullCost prior{0.025, 1 / 0.5e9};
  PullFit none;
  CHECK(none.Solve(prior, 1e6).setup_s == doctest::Approx(0.025));
  CHECK(none.Solve(prior, 1e6).s_per_byte == doctest::Approx(2e-9));
  // Pulls all of one size cannot tell set-up from bandwidth; what they took at that size is
  // still what the fit says, within the prior's one pull of weight.
  PullFit same;
  for (int i = 0; i < 40; ++i) same.Add(1, 50e6, 0.004);
  CHECK(same.Solve(prior, 50e6).Seconds(50e6) == doctest::Approx(0.004).epsilon(0.1));
  // Faster than any set-up: the set-up goes to 0 rather than below.
  PullFit tiny;
  for (int i = 0; i < 40; ++i) tiny.Add(1, i % 2 == 0 ? 1e9 : 1e6, i % 2 == 0 ? 0.004 : 0.0001);
  const PullCost t = tiny.Solve(prior, 1e9);
  CHECK(t.setup_s >= 0);
  CHECK(t.s_per_byte >= 0);
  CHECK(t.Seconds(1e9) == doctest::Approx(0.004).epsilon(0.2));
  // Increments that are no pulls, or malformed, are not taken.
  PullFit bad;
  bad.Add(0, 1e9, 1);
  bad.Add(1, -1, 1);
  bad.Add(1, 1e9, std::nan(""));
  CHECK(bad.pulls() == 0);
  // Failures: a share of the pair's pulls, against one good pull before any, halving in weight
  // every half-life; malformed outcomes are not taken.
  PullFit failing;
  CHECK(failing.FailedShare(0) == 0);
  failing.AddOutcomes(kNsPerSec, 2, 1, 0.3);
  failing.AddOutcomes(kNsPerSec, 0, 1, 0.5);
  failing.AddOutcomes(kNsPerSec, -1, 1, 0.5);
  failing.AddOutcomes(kNsPerSec, 0, 1, std::nan(""));
  CHECK(failing.FailedShare(kNsPerSec) == doctest::Approx(2.0 / (2 + 2 + config::kPullFailurePriorPulls)));
  CHECK(failing.FailedSeconds() == doctest::Approx(0.4));
  const TimeNs later = kNsPerSec + static_cast<TimeNs>(config::kPullFailureHalfLifeSeconds * 1e9);
  CHECK(failing.FailedShare(later) == doctest::Approx(1.0 / (1 + 1 + config::kPullFailurePriorPulls)));
  CHECK(failing.FailedSeconds() == doctest::Approx(0.4));
  CHECK(failing.pulls() == 0);  // outcomes are not the fit's pulls
}

TEST_CASE("the TTFT calibration fits the estimate's terms to the first tokens, and the estimate follows") {
  TtftCalibration cal;
  // First tokens that come at 0.6 x the queue term, 0.8 x the own prefill, the step, and 9 ms.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int i = 0; i < 199; ++i) {
    TtftTerms t{0.05 * u(rng), 0.02 * u(rng), 0.01 + 0.01 * u(rng), 0.001};
    cal.Observe(t, 0.6 * t.queue_s + 0.8 * t.own_s + t.step_s + 0.009 + t.rest_s);
  }
  CHECK(cal.coefficients().queue == 1);  // not before kCalibrationMinObservations
  for (int i = 0; i < 2000; ++i) {
    TtftTerms t{0.05 * u(rng), 0.02 * u(rng), 0.01 + 0.01 * u(rng), 0.001};
    cal.Observe(t, 0.6 * t.queue_s + 0.8 * t.own_s + t.step_s + 0.009 + t.rest_s);
  }
  CHECK(cal.coefficients().queue == doctest::Approx(0.6).epsilon(0.05));
  CHECK(cal.coefficients().own == doctest::Approx(0.8).epsilon(0.05));
  CHECK(cal.coefficients().step == doctest::Approx(1.0).epsilon(0.1));
  CHECK(cal.intercept() == doctest::Approx(0.009).epsilon(0.2));
  // Garbage is not taken; a term that never varies stays near 1 (the prior); none leaves its bounds.
  cal.Observe(TtftTerms{std::nan(""), 0, 0, 0}, 1);
  cal.Observe(TtftTerms{-1, 0, 0, 0}, 1);
  TtftCalibration flat;
  for (int i = 0; i < 2000; ++i) {
    TtftTerms t{0.05 * u(rng), 0.02 * u(rng), 0.0, 0};
    flat.Observe(t, 100 * t.queue_s);  // a queue 100x slower than estimated
  }
  CHECK(flat.coefficients().queue == config::kMaxCoefficient);
  CHECK(flat.coefficients().step == doctest::Approx(1.0));

  // The router's estimate uses the coefficients; --no-ttft-calibration leaves them at 1.
  testing::Fixture f;
  OwnLoadCounts queued;
  queued.requests = 1;
  queued.prefill_tokens = 800;  // 100 ms at the default 8,000 tokens/s
  for (WorkerId w : {0u, 1u, 2u}) f.loads.own[w] = queued;
  auto before = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(before.ok());
  REQUIRE(before->ttft_terms);
  CHECK(before->ttft_terms->queue_s == doctest::Approx(0.1));
  for (int i = 0; i < 2000; ++i) {
    TtftTerms t{0.05 * u(rng), 0.02 * u(rng), 0, 0};
    f.router.ObserveFirstToken(t, 0.5 * t.queue_s + t.own_s);
  }
  CHECK(f.router.calibration().coefficients().queue == doctest::Approx(0.5).epsilon(0.05));
  auto after = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(after.ok());
  CHECK(after->estimated_ttft_s == doctest::Approx(before->estimated_ttft_s - 0.05).epsilon(0.05));
  RoutingOptions off;
  off.calibrate_ttft = false;
  testing::Fixture g(off);
  g.router.ObserveFirstToken(TtftTerms{0.1, 0, 0, 0}, 0.01);
  CHECK(g.router.calibration().observations() == 0);
}

TEST_CASE("threads routing at once get the decisions one thread gets alone (each has its own scratch)") {
  Fixture f;
  f.fleet.routable.clear();
  for (WorkerId w = 0; w < 80; ++w) {  // past 64: the match table grows
    f.fleet.routable.push_back(w);
    f.loads.transfer[w] = TransferPeer{"w" + std::to_string(w), "tcp://h:1", "", w % 3 ? "bf16" : "fp8e4m3", 1024,
                                       w % 2 ? "boot-a" : ""};
  }
  f.fleet.workers = 80;
  // Prompts of 1..12 blocks, each held whole by one worker and in half by another: pull options.
  const BlockHasher hasher(kBlockSize, HashNamespace{"m", "", ""});
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t p = 1; p <= 12; ++p) {
    std::vector<TokenId> t(p * kBlockSize);
    std::iota(t.begin(), t.end(), static_cast<TokenId>(1000 * p));
    const std::vector<BlockHash> hashes = hasher.HashAll(t);
    f.kv.InsertPredicted(7 * p % 80, hashes, 1000 * kNsPerSec);
    f.kv.InsertPredicted(11 * p % 80, std::span(hashes).first(p / 2), 1000 * kNsPerSec);
    prompts.push_back(std::move(t));
  }
  auto route = [&](size_t p) {
    Result<Decision> d = f.router.Route(f.fleet, Prompt{"m", prompts[p], "", Policy::kKv});
    if (!d.ok()) return std::tuple(~WorkerId{0}, 0u, 0u, WorkerId{0}, size_t{0});
    return std::tuple(d->worker, d->device_blocks, d->host_blocks, d->pull_from, d->candidates->size());
  };
  std::vector<decltype(route(0))> alone;
  for (size_t p = 0; p < prompts.size(); ++p) alone.push_back(route(p));
  CHECK(std::get<0>(alone[11]) == 7 * 12 % 80);  // the whole prompt's holder
  CHECK(std::get<4>(alone[11]) > 80);            // besides a pull option for each worker of its format
  std::atomic<int> differed{0};
  std::vector<std::thread> threads;
  for (size_t k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (size_t round = 0; round < 200; ++round) {
        for (size_t i = 0; i < prompts.size(); ++i) {
          const size_t p = (i * (k + 1) + round) % prompts.size();  // each thread in its own order
          if (route(p) != alone[p]) ++differed;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(differed.load() == 0);
}

}  // namespace
}  // namespace kvfleet::router
