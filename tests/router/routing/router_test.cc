// Router: one request's routing decision over a fake fleet's loads and in-memory indexes.
#include "router/routing/router.h"

#include <algorithm>
#include <map>
#include <numeric>

#include <doctest/doctest.h>

#include "router/routing/predicted_index.h"

namespace kvfleet::router {
namespace {

constexpr uint32_t kBlockSize = 4;

// Loads set by hand: this router's own counts now and at any earlier time, and reports.
class FakeLoads final : public WorkerLoads {
 public:
  OwnLoadCounts OwnLoad(WorkerId w) const override { return Get(own, w); }
  OwnLoadCounts OwnLoadAt(WorkerId w, TimeNs at) const override {
    asked_at = at;
    return Get(own_then, w);
  }
  std::optional<WorkerLoad> ReportedLoad(WorkerId w) const override {
    auto it = reported.find(w);
    if (it == reported.end()) return std::nullopt;
    return it->second;
  }

  std::map<WorkerId, OwnLoadCounts> own, own_then;
  std::map<WorkerId, WorkerLoad> reported;
  mutable TimeNs asked_at = 0;

 private:
  static OwnLoadCounts Get(const std::map<WorkerId, OwnLoadCounts>& m, WorkerId w) {
    auto it = m.find(w);
    return it == m.end() ? OwnLoadCounts{} : it->second;
  }
};

struct Fixture {
  Fixture() : kv(&clock), approx(&clock), router(RoutingOptions{}, &loads, &kv, &approx) {
    fleet.block_size = kBlockSize;
    fleet.routable = {0, 1, 2};
    fleet.workers = 3;
    tokens.resize(10 * kBlockSize);
    std::iota(tokens.begin(), tokens.end(), 100);
  }
  Prompt PromptOf(Policy policy) const { return Prompt{"m", tokens, "", policy}; }
  std::vector<BlockHash> Hashes() const {
    return BlockHasher(kBlockSize, HashNamespace{"m", "", ""}).HashAll(tokens);
  }
  size_t Matched(const PrefixIndex& index, WorkerId w) const {
    std::vector<PrefixMatch> out;
    index.FindMatches(Hashes(), &out);
    for (const PrefixMatch& m : out) {
      if (m.worker == w) return m.device_blocks;
    }
    return 0;
  }

  ManualClock clock;
  FakeLoads loads;
  PredictedIndex kv;
  PredictedIndex approx;
  Router router;
  ModelFleet fleet;
  std::vector<TokenId> tokens;
};

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
  f.loads.own_then[0] = OwnLoadCounts{4, 1000, 4000};
  f.loads.own[0] = OwnLoadCounts{2, 300, 2500};
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  REQUIRE(d.ok());
  CHECK(f.loads.asked_at == 777);
  const Candidate& c = d->candidates->at(0);
  CHECK(c.running_requests == doctest::Approx(2 + (3 + 2 - 4)));
  CHECK(c.queued_prefill_tokens == doctest::Approx(300 + (5000 - 4000)));
  CHECK(c.queued_requests == doctest::Approx(2));  // max(reported queued, own - reported active)
  CHECK(c.prefill_tokens_per_s == doctest::Approx(20000));
  // The approx policy knows no reports: its own counts alone.
  auto a = f.router.Route(f.fleet, f.PromptOf(Policy::kApprox));
  REQUIRE(a.ok());
  const Candidate& ca = a->candidates->at(0);
  CHECK(ca.running_requests == doctest::Approx(2));
  CHECK(ca.queued_prefill_tokens == doctest::Approx(300));
  CHECK(ca.queued_requests == doctest::Approx(2));
  CHECK(ca.prefill_tokens_per_s == 0);
}

TEST_CASE("a fleet whose every worker is saturated is refused") {
  Fixture f;
  for (WorkerId w : f.fleet.routable) {
    WorkerLoad full;
    full.queued_requests = static_cast<uint32_t>(config::kMaxQueuedRequests);
    f.loads.reported[w] = full;
  }
  auto d = f.router.Route(f.fleet, f.PromptOf(Policy::kKv));
  CHECK(d.status().code() == StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvfleet::router
