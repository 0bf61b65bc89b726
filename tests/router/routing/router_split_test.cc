// Router: P/D disaggregation (README.md, "Prefill and decode on different workers"): which
// requests are split, which workers take each half, over the fake fleet of router_fixture.h.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "router/routing/decision_log.h"
#include "router/routing/router.h"
#include "tests/router/routing/router_fixture.h"

namespace kvfleet::router {
namespace {

using testing::Fixture;
using testing::kBlockSize;

RoutingOptions SplitAt(uint32_t tokens) {
  RoutingOptions o;
  o.split_prefill_tokens = tokens;
  o.default_prefill_tokens_per_s = 1'000;  // the 40-token prompt: 40 ms to compute
  return o;
}

// Worker 0 a prefill worker, 1 and 2 decode workers; every one serves pulls of 1 KiB blocks
// (10 blocks: ~25 ms, mostly the pull's setup).
void PrefillAndDecode(Fixture& f) {
  f.loads.roles[0] = WorkerRole::kPrefill;
  f.loads.roles[1] = f.loads.roles[2] = WorkerRole::kDecode;
  for (WorkerId w : {0u, 1u, 2u}) {
    f.loads.transfer[w] = TransferPeer{"w" + std::to_string(w), "tcp://h" + std::to_string(w) + ":5559", "", "bf16", 1024, ""};
  }
}

}  // namespace

TEST_CASE("a long uncached prompt is prefilled on a prefill worker and pulled by a decode worker") {
  Fixture f(SplitAt(16));
  PrefillAndDecode(f);
  OwnLoadCounts busy;
  busy.requests = 3;  // worker 1 decodes three requests; 2 is idle
  f.loads.own[1] = busy;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  REQUIRE(d->split.has_value());
  CHECK(d->split->worker == 0);
  CHECK(d->split->blocks == 10);
  CHECK(d->worker == 2);  // the decode load
  CHECK(d->pull.source == "tcp://h0:5559");
  CHECK(d->pull.blocks == 10);
  CHECK(d->pull_from == 0);
  CHECK(d->device_blocks == 0);
  CHECK(d->predicted_cached_tokens == 10 * kBlockSize);
  CHECK(d->estimated_ttft_s > d->split->estimated_ttft_s);  // the prefill, then the pull
  // The pull's hint for a retried prefill names that worker.
  CHECK(f.router.SplitPull(*d)(0).source == "tcp://h0:5559");
  CHECK(d->pull.deadline_ms == 51);  // twice the predicted 25.02 ms: longer than recomputing (40 ms)
  f.router.Commit(*d);
  CHECK(f.Matched(f.kv, 0) == 10);  // both will hold the prompt
  CHECK(f.Matched(f.kv, 2) == 10);
  // A retry of the prefill finds no other prefill worker; the decode's finds worker 1.
  std::vector<WorkerId> tried{0};
  CHECK_FALSE(f.router.PrefillRerouter(*d)(tried).ok());
  tried = {2};
  auto again = f.router.Rerouter(*d)(tried);
  REQUIRE(again.ok());
  CHECK(*again == 1);
}

TEST_CASE("the decision log shows a split's prefill stage: its worker, estimate, pool coefficients and candidates") {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvfleet_split_decisions_" + std::to_string(getpid()) + ".jsonl")).string();
  std::filesystem::remove(path);
  Fixture f(SplitAt(16));
  PrefillAndDecode(f);
  auto log = DecisionLog::Open(path);
  REQUIRE(log.ok());
  f.router.SetDecisionLog(log->get());
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  REQUIRE(d->split.has_value());
  std::ifstream in(path);
  std::string text;
  REQUIRE(std::getline(in, text));
  const nlohmann::json line = nlohmann::json::parse(text);
  CHECK(line["split"] == true);
  const nlohmann::json& prefill = line["prefill"];
  CHECK(prefill["worker"] == d->split->worker);
  CHECK(prefill["estimated_ttft_s"].get<double>() == doctest::Approx(d->split->estimated_ttft_s));
  CHECK(prefill["ttft_coefficients"]["queue"] == 1.0);
  REQUIRE(prefill["candidates"].size() == 1);  // the one prefill worker
  CHECK(prefill["candidates"][0]["worker"] == 0);
  CHECK(prefill["candidates"][0]["ttft_s"].get<double>() == doctest::Approx(d->split->estimated_ttft_s));
  CHECK(line["candidates"].size() == d->candidates->size());  // the decode workers, pull included
  std::filesystem::remove(path);
}

TEST_CASE("conditional split: a short prompt, or one a decode worker holds, stays on one decode worker") {
  SUBCASE("short: fewer uncached tokens than the threshold") {
    Fixture f(SplitAt(41));
    PrefillAndDecode(f);
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
    CHECK(d->worker != 0);
  }
  SUBCASE("held by a decode worker: the rest is short") {
    Fixture f(SplitAt(16));
    PrefillAndDecode(f);
    const std::vector<BlockHash> hashes = f.Hashes();
    f.kv.InsertPredicted(1, std::span(hashes).first(8), kNsPerSec);  // 32 of 40 tokens
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
    CHECK(d->worker == 1);
  }
  SUBCASE("held by the prefill worker alone: split, and the prefill costs nothing there") {
    Fixture f(SplitAt(16));
    PrefillAndDecode(f);
    f.kv.InsertPredicted(0, f.Hashes(), kNsPerSec);
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    REQUIRE(d->split.has_value());
    CHECK(d->split->predicted_cached_tokens == 10 * kBlockSize);
  }
  SUBCASE("threshold 0: never split, and the prefill worker gets nothing") {
    Fixture f(SplitAt(0));
    PrefillAndDecode(f);
    for (int i = 0; i < 6; ++i) {
      auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kRoundRobin));
      REQUIRE(d.ok());
      CHECK(d->worker != 0);
      CHECK_FALSE(d->split.has_value());
    }
  }
  SUBCASE("a fleet of workers of both roles never splits") {
    Fixture f(SplitAt(16));
    for (WorkerId w : {0u, 1u, 2u}) f.loads.transfer[w] = TransferPeer{"w", "tcp://h:1", "", "bf16", 1024, ""};
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
  }
}

TEST_CASE("a split needs a pull cheaper than the prefill it saves, and KV formats that match") {
  SUBCASE("a slow link: the decode worker computes the prompt itself") {
    Fixture f(SplitAt(16));
    PrefillAndDecode(f);
    for (auto& [w, t] : f.loads.transfer) t.bytes_per_block = 16u << 20;  // 160 MiB: 0.36 s against 40 ms
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
    CHECK(d->worker != 0);
  }
  SUBCASE("the pull's deadline: twice the predicted pull, or recomputing the prompt if longer") {
    RoutingOptions o = SplitAt(16);
    o.transfer_setup_s = 5e-3;  // a ~5 ms pull: 10 ms at twice, but recomputing takes 40 ms
    Fixture f(o);
    PrefillAndDecode(f);
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    REQUIRE(d->split.has_value());
    CHECK(d->pull.deadline_ms == 40);
    CHECK(f.router.SplitPull(*d)(0).deadline_ms == 40);  // a retried prefill's hint alike
  }
  SUBCASE("the decode pool's KV format differs: no split") {
    Fixture f(SplitAt(16));
    PrefillAndDecode(f);
    f.loads.transfer[0].format = "fp8e4m3";
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
    CHECK(d->worker != 0);
  }
  SUBCASE("prompt logprobs: the streaming worker needs the whole prompt's logits, so it is never split") {
    Fixture f(SplitAt(16));
    PrefillAndDecode(f);
    Prompt p = f.PromptOf(Policy::kKv);
    p.whole = true;
    auto d = f.router.Route(f.fleet, p);
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
  }
}

TEST_CASE("the prefill pool's estimates are calibrated on its own stages, apart from the decode pool's") {
  Fixture fresh(SplitAt(16)), taught(SplitAt(16));
  PrefillAndDecode(fresh);
  PrefillAndDecode(taught);
  // Prefill stages that take twice their terms, over varied queues, prompts and steps.
  for (int i = 0; i < 400; ++i) {
    const TtftTerms terms{0.01 * (i % 7), 0.02 + 0.01 * (i % 5), 0.005 * (i % 3), 0};
    taught.router.ObservePrefillStage(terms, 2 * (terms.queue_s + terms.own_s + terms.step_s));
  }
  CHECK(taught.router.prefill_calibration().coefficients().own > 1.5);
  CHECK(taught.router.calibration().coefficients().own == 1);  // the decode pool's: untouched
  // Uncalibrated, the 40-token prompt splits (its prefill's terms go with the decision); at the
  // prefill pool's own pace (~1.75x: 70 ms of prefill before the pull) it no longer beats an
  // idle decode worker's 40 ms, and stays whole.
  auto before = fresh.router.Route(fresh.fleet, fresh.PromptOf(Policy::kKv));
  REQUIRE(before.ok());
  REQUIRE(before->split.has_value());
  CHECK(before->split->ttft_terms.has_value());
  auto after = taught.router.Route(taught.fleet, taught.PromptOf(Policy::kKv));
  REQUIRE(after.ok());
  CHECK_FALSE(after->split.has_value());
  CHECK(after->worker != 0);
}

TEST_CASE("admission with a prefill pool: a request a busy prefill pool could serve later is 429, not 503") {
  RoutingOptions o = SplitAt(16);
  o.admission_ttft_s = 0.035;
  Fixture f(o);
  PrefillAndDecode(f);
  WorkerLoad fast;
  fast.prefill_tokens_per_second = 10'000;  // the 40-token prompt: 4 ms on the prefill worker
  fast.active_prefill_tokens = 400;         // 40 ms queued there
  f.loads.reported[0] = fast;
  // Whole, an idle decode worker takes 40 ms (the 1,000 tokens/s prior); split on an idle fleet,
  // 4 ms of prefill and a ~25 ms pull. The fleet is busy, not the request impossible.
  Refusal why;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv), &why);
  CHECK(d.status().code() == StatusCode::kResourceExhausted);
  CHECK(why.reason == "predicted_ttft");
  // With no split possible (prompt logprobs), the decode pool's 40 ms is all there is: 503.
  Prompt whole = f.PromptOf(Policy::kKv);
  whole.whole = true;
  auto unsplit = f.router.Route(f.fleet, whole, &why);
  CHECK(unsplit.status().code() == StatusCode::kUnavailable);
  CHECK(why.reason == "unattainable");
}

TEST_CASE("a prefill pool that cannot keep up: long prompts go whole to the decode pool until it catches up") {
  Fixture f(SplitAt(16));
  PrefillAndDecode(f);
  OwnLoadCounts queued;
  queued.requests = 4;
  queued.prefill_tokens = 400;  // 0.4 s of prefill ahead on the only prefill worker
  f.loads.own[0] = queued;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK_FALSE(d->split.has_value());  // 40 ms on an idle decode worker, not 0.44 s and a pull
  CHECK(d->worker != 0);
  // 10 ms ahead there, 30 ms on each decode worker: the prefill (51 ms) and the decode's wait
  // (32 ms) within the best whole route (72 ms) and the pull (25 ms).
  queued.requests = 1;
  queued.prefill_tokens = 10;
  f.loads.own[0] = queued;
  OwnLoadCounts decoding;
  decoding.requests = 2;
  decoding.prefill_tokens = 30;
  f.loads.own[1] = f.loads.own[2] = decoding;
  auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(e.ok());
  CHECK(e->split.has_value());
}

TEST_CASE("a split's decode part waits for no queued prompt on a decode-role worker, behind them on a role-both one") {
  // A decode-role worker runs a pulled prompt with its decodes (worker/engine/README.md).
  Fixture f(SplitAt(16));
  PrefillAndDecode(f);
  OwnLoadCounts queued;
  queued.requests = 2;
  queued.prefill_tokens = 200;  // 0.2 s ahead on the prefill worker
  f.loads.own[0] = queued;
  OwnLoadCounts behind;
  behind.requests = 4;
  behind.prefill_tokens = 400;  // 0.4 s ahead on each decode-capable worker
  f.loads.own[1] = f.loads.own[2] = behind;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->split.has_value());  // 0.24 s and the pull, against 0.44 s whole
  f.loads.roles[1] = f.loads.roles[2] = WorkerRole::kBoth;
  auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(e.ok());
  CHECK_FALSE(e->split.has_value());  // there it would wait 0.4 s more after the prefill
}

TEST_CASE("a split's decode part waits for a batch slot on a decode-role worker, not behind the prompts waiting there") {
  // A decode-role worker admits a pulled prompt ahead of its queue (worker/engine/README.md):
  // its report's pulledWaitUs, not the admission wait of its predictedWaitUs, is the part's.
  Fixture f(SplitAt(16));
  PrefillAndDecode(f);
  WorkerLoad full;  // batch full, prompts waiting: 2 s before one more is admitted in order
  full.prefill_tokens_per_second = 1'000;
  full.predicted_wait_us = 2'000'000;
  full.pulled_wait_us = 0;  // a slot free for one admitted ahead
  f.loads.reported[1] = f.loads.reported[2] = full;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  REQUIRE(d->split.has_value());
  CHECK(d->estimated_ttft_s < 0.5);  // the prefill (40 ms) and the pull, no admission wait
  full.pulled_wait_us = 1'500'000;  // no slot free until a running request finishes
  f.loads.reported[1] = f.loads.reported[2] = full;
  auto e = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(e.ok());
  CHECK(e->estimated_ttft_s >= 1.5);
  // A worker older than the field does not say: its admission wait stands, as for any prompt.
  full.pulled_wait_us = kPulledWaitUnknown;
  f.loads.reported[1] = f.loads.reported[2] = full;
  auto g = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(g.ok());
  CHECK(g->estimated_ttft_s >= 2.0);
  CHECK(g->estimated_ttft_s < 3.0);  // not the field's all-ones read as microseconds
}

TEST_CASE("a short prompt splits when the decode pool would give its first token later than the split") {
  // Decode workers compute prompts slowly beside their decodes (their steps stay near
  // pure-decode time), so a backlog there outweighs a second hop to an idle prefill worker.
  Fixture f(SplitAt(41));  // 40 tokens: short
  PrefillAndDecode(f);
  f.loads.announced[0] = 4'000;                        // 10 ms for the prompt
  f.loads.announced[1] = f.loads.announced[2] = 250;   // 160 ms beside their decodes
  SUBCASE("the decode pool is idle but slow: the prefill worker and a 25 ms pull are sooner") {
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    REQUIRE(d->split.has_value());
    CHECK(d->split->worker == 0);
    CHECK(d->estimated_ttft_s < 0.16);
  }
  SUBCASE("as fast on the decode pool: whole, the split's fixed costs are not repaid") {
    f.loads.announced[1] = f.loads.announced[2] = 4'000;
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
    CHECK(d->worker != 0);
  }
  SUBCASE("the prefill worker is behind: whole, a short prompt takes no allowance for the split") {
    OwnLoadCounts queued;
    queued.requests = 3;
    queued.prefill_tokens = 600;  // 150 ms ahead: with the pull, later than 160 ms whole
    f.loads.own[0] = queued;
    auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
    REQUIRE(d.ok());
    CHECK_FALSE(d->split.has_value());
  }
}

TEST_CASE("a fleet with prefill workers and no decode-capable one refuses with 503 no_decode_worker, at once") {
  Fixture f(SplitAt(16));
  PrefillAndDecode(f);
  f.loads.roles[1] = f.loads.roles[2] = WorkerRole::kPrefill;
  Refusal why;
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv), &why);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().code() == StatusCode::kUnavailable);
  CHECK(why.reason == "no_decode_worker");
  CHECK(d.status().message().find("--role decode") != std::string::npos);
}

TEST_CASE("a decode worker may pull a prefix a prefill worker holds without a new prefill") {
  Fixture f(SplitAt(0));  // never split: the whole request goes to a decode worker
  PrefillAndDecode(f);
  f.kv.InsertPredicted(0, f.Hashes(), kNsPerSec);
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(d->worker != 0);
  CHECK(d->pull.source == "tcp://h0:5559");
  CHECK_FALSE(d->split.has_value());
}

}  // namespace kvfleet::router
