// Routing by LoRA adapter: only workers serving the adapter are candidates, the prompt's blocks
// hash with the adapter (Contract 1), and a worker without it on the device is charged its
// load time (router/routing/README.md, "LoRA adapters").
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include <doctest/doctest.h>

#include "router/routing/predicted_index.h"
#include "router/routing/router.h"

namespace kvfleet::router {
namespace {

constexpr uint32_t kBlockSize = 4;

// Workers serving adapters, each with its load seconds (0: resident); no load otherwise.
class AdapterLoads final : public WorkerLoads {
 public:
  OwnLoadCounts OwnLoad(WorkerId w) const override { return Own(w); }
  OwnLoadCounts OwnLoadAt(WorkerId w, TimeNs) const override { return Own(w); }
  std::optional<WorkerLoad> ReportedLoad(WorkerId) const override { return std::nullopt; }
  std::optional<double> AdapterLoadSeconds(WorkerId w, uint64_t lora_id) const override {
    auto it = adapters.find({w, lora_id});
    if (it == adapters.end()) return std::nullopt;
    return it->second;
  }
  OwnLoadCounts Own(WorkerId w) const {
    auto it = running.find(w);
    OwnLoadCounts c;
    if (it != running.end()) c.requests = it->second;
    return c;
  }

  std::map<std::pair<WorkerId, uint64_t>, double> adapters;
  std::map<WorkerId, double> running;  // this router's requests there
};

struct Fixture {
  Fixture() : kv(&clock), approx(&clock), router(RoutingOptions{}, &loads, &kv, &approx) {
    fleet.block_size = kBlockSize;
    fleet.routable = {0, 1, 2};
    fleet.workers = 3;
    tokens.resize(10 * kBlockSize);
    std::iota(tokens.begin(), tokens.end(), 100);
  }
  void Serve(WorkerId w, std::string_view lora, double load_s) { loads.adapters[{w, LoraId(lora)}] = load_s; }
  std::vector<BlockHash> Hashes(std::string_view lora) const {
    return BlockHasher(kBlockSize, HashNamespace{"m", lora, ""}).HashAll(tokens);
  }
  Prompt PromptOf(std::string_view lora, Policy policy = Policy::kKv) const {
    Prompt p{"m", tokens, "", policy};
    p.lora = lora;
    return p;
  }

  ManualClock clock;
  AdapterLoads loads;
  PredictedIndex kv;
  PredictedIndex approx;
  Router router;
  ModelFleet fleet;
  std::vector<TokenId> tokens;
};

}  // namespace

TEST_CASE("an adapter's blocks hash with its name: the base model's cached prefix is no hit for it") {
  Fixture f;
  f.Serve(0, "sql", 0);
  f.Serve(1, "sql", 0);
  f.kv.InsertPredicted(0, f.Hashes(""), kNsPerSec);  // the base model's prefix
  auto d = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(d.ok());
  CHECK(d->hashes == f.Hashes("sql"));
  CHECK(d->hashes != f.Hashes(""));
  CHECK(d->lora_id == LoraId("sql"));
  CHECK(d->device_blocks == 0);
  // Committed under the adapter's hashes: the next request for the adapter finds them.
  f.router.Commit(*d);
  auto next = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(next.ok());
  CHECK(next->worker == d->worker);
  CHECK(next->device_blocks == 10);
}

TEST_CASE("a worker holding both the adapter and the prefix wins") {
  Fixture f;
  f.Serve(0, "sql", 0);
  f.Serve(1, "sql", 0);
  f.kv.InsertPredicted(1, f.Hashes("sql"), kNsPerSec);
  f.kv.InsertPredicted(2, f.Hashes("sql"), kNsPerSec);  // 2 holds the prefix but not the adapter
  f.kv.InsertPredicted(0, f.Hashes(""), kNsPerSec);     // 0: the base model's prefix only
  auto d = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(d.ok());
  CHECK(d->worker == 1);
  CHECK(d->device_blocks == 10);
  REQUIRE(d->candidates);
  CHECK(d->candidates->size() == 2);  // 2 is no candidate at all
}

TEST_CASE("a worker without the adapter on its device is charged the adapter's load time") {
  Fixture f;
  f.fleet.routable = {0, 1};
  f.Serve(0, "sql", 0.5);  // in host memory: half a second to load
  f.Serve(1, "sql", 0);    // resident
  // Worker 1 is busier: on the base model's terms 0 would win.
  f.loads.running[1] = 20;  // 20 ms of decode ahead at 1 ms per running request
  auto d = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(d.ok());
  CHECK(d->worker == 1);
  const auto& cands = *d->candidates;
  auto at = [&](WorkerId w) { return *std::find_if(cands.begin(), cands.end(), [&](const Candidate& c) { return c.worker == w; }); };
  CHECK(at(0).adapter_load_s == doctest::Approx(0.5));
  CHECK(at(1).adapter_load_s == 0);
  Picker picker{RoutingOptions{}};
  const RouteRequest route{static_cast<uint32_t>(f.tokens.size()), kBlockSize};
  const double rate = picker.FleetRate(cands);
  CHECK(picker.EstimateTtft(route, at(0), rate) - picker.EstimateTtft(route, at(1), rate) ==
        doctest::Approx(0.5 - 0.020));
  // A cheap load loses to the decode queue: the load time is a cost, not a veto.
  f.Serve(0, "sql", 0.001);
  auto cheap = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(cheap.ok());
  CHECK(cheap->worker == 0);
  // The base model's requests pay nothing for adapters.
  auto base = f.router.Route(f.fleet, f.PromptOf(""));
  REQUIRE(base.ok());
  CHECK(base->worker == 0);
  for (const Candidate& c : *base->candidates) CHECK(c.adapter_load_s == 0);
}

TEST_CASE("a prefix hit outweighs a short adapter load; a long one sends the request to the resident copy") {
  Fixture f;
  f.fleet.routable = {0, 1};
  f.tokens.resize(1000 * kBlockSize);  // 4,000 tokens: half a second of prefill at 8,000 tok/s
  std::iota(f.tokens.begin(), f.tokens.end(), 100);
  f.kv.InsertPredicted(0, f.Hashes("sql"), kNsPerSec);
  f.Serve(0, "sql", 0.01);
  f.Serve(1, "sql", 0);
  auto d = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(d.ok());
  CHECK(d->worker == 0);
  f.Serve(0, "sql", 5.0);
  auto slow = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(slow.ok());
  CHECK(slow->worker == 1);
}

TEST_CASE("every policy picks only workers serving the adapter; none serving it is a 503, not a pick") {
  const Policy policies[] = {Policy::kRoundRobin, Policy::kLeastLoaded, Policy::kKv,     Policy::kApprox,
                             Policy::kKvRetention, Policy::kDynamo,     Policy::kLlmd,   Policy::kSglang,
                             Policy::kPreble};
  for (Policy policy : policies) {
    CAPTURE(PolicyName(policy));
    Fixture f;
    f.Serve(0, "sql", 0);
    f.Serve(1, "sql", 0.2);
    f.Serve(2, "chat", 0);
    // Worker 2 is idle and holds the prompt's blocks (as hashed for the adapter), the others busy.
    f.loads.running[0] = 30;
    f.loads.running[1] = 30;
    f.kv.InsertPredicted(2, f.Hashes("sql"), kNsPerSec);
    f.approx.InsertPredicted(2, f.Hashes("sql"), kNsPerSec);
    std::set<WorkerId> picked;
    for (int i = 0; i < 12; ++i) {
      auto d = f.router.Route(f.fleet, f.PromptOf("sql", policy));
      REQUIRE(d.ok());
      picked.insert(d->worker);
    }
    CHECK(picked.count(2) == 0);
    CHECK(!picked.empty());
    Refusal refusal;
    auto none = f.router.Route(f.fleet, f.PromptOf("poetry", policy), &refusal);
    CHECK(none.status().code() == StatusCode::kUnavailable);
    CHECK(none.status().message().find("poetry") != std::string::npos);
    CHECK(refusal.reason == "no_worker");
  }
}

TEST_CASE("a retry keeps the adapter: only other workers serving it, and not one that dropped it since") {
  Fixture f;
  f.fleet.routable = {0, 1, 2, 3};
  f.fleet.workers = 4;
  f.Serve(0, "sql", 0);
  f.Serve(1, "sql", 0);
  f.Serve(2, "sql", 0);
  f.kv.InsertPredicted(0, f.Hashes("sql"), kNsPerSec);
  auto d = f.router.Route(f.fleet, f.PromptOf("sql"));
  REQUIRE(d.ok());
  REQUIRE(d->worker == 0);
  auto reroute = f.router.Rerouter(*d);
  f.loads.adapters.erase({1, LoraId("sql")});  // worker 1's next Hello no longer lists it
  std::vector<WorkerId> tried = {0};
  auto second = reroute(tried);
  REQUIRE(second.ok());
  CHECK(*second == 2);
  tried.push_back(2);
  CHECK(reroute(tried).status().code() == StatusCode::kUnavailable);  // 3 never served it
}

}  // namespace kvfleet::router
