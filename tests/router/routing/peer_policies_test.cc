// The peers' published routing rules (peer_policies.h) on hand-built candidates: each
// rule's decision, and the edges its constants draw.
#include "router/routing/peer_policies.h"

#include <cmath>
#include <map>
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

std::map<WorkerId, int> Draws(Picker& picker, Policy policy, const RouteRequest& r, const std::vector<Candidate>& fleet,
                              int n) {
  std::map<WorkerId, int> seen;
  for (int i = 0; i < n; ++i) seen[picker.Pick(policy, r, fleet)->worker]++;
  return seen;
}

}  // namespace

TEST_CASE("the peer policies parse and print, and none is the default") {
  for (auto name : {"dynamo", "llmd", "sglang", "preble"}) {
    auto p = ParsePolicy(name);
    REQUIRE(p.ok());
    CHECK(PolicyName(*p) == name);
    CHECK(*p != RoutingOptions{}.policy);
  }
  auto bad = ParsePolicy("sglang_cache_aware");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("dynamo, llmd, sglang or preble") != std::string::npos);
}

TEST_CASE("dynamo charges queued plus uncached prefill blocks, crediting host blocks at 0.75, plus decode blocks") {
  Candidate c = Idle(0);
  c.queued_prefill_tokens = 640;  // 20 blocks of 32
  c.device_blocks = 40;
  c.host_blocks = 20;             // credit 40 + 15
  c.decode_blocks = 10;
  CHECK(peer::DynamoCost({3200, 32}, c) == doctest::Approx(20 + 100 - 55 + 10));
  c.device_blocks = 100;          // credit beyond the prefill ahead: the prefill term stops at 0
  c.host_blocks = 0;
  c.queued_prefill_tokens = 0;
  CHECK(peer::DynamoCost({3200, 32}, c) == doctest::Approx(10));
}

TEST_CASE("dynamo at temperature 0 picks the least cost; a device hit beats the same hit on the host") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].host_blocks = 40;
  fleet[1].device_blocks = 40;
  fleet[2].decode_blocks = 5;
  for (int i = 0; i < 20; ++i) CHECK(picker.Pick(Policy::kDynamo, {3200, 32}, fleet)->worker == 1);
  fleet[1].decode_blocks = 40;  // 40 decode blocks outweigh the 10-block difference of credit
  CHECK(picker.Pick(Policy::kDynamo, {3200, 32}, fleet)->worker == 0);
}

TEST_CASE("dynamo at temperature 0 breaks ties at random, not by worker order") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  auto seen = Draws(picker, Policy::kDynamo, {3200, 32}, fleet, 300);
  CHECK(seen.size() == 3);
  for (auto [worker, n] : seen) CHECK(n > 50);
}

TEST_CASE("dynamo at temperature > 0 samples softmax(-normalized cost / temperature)") {
  RoutingOptions options;
  options.temperature = 1.0;
  Picker picker(options);
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[1].decode_blocks = 1000;  // normalized costs 0 and 1, whatever the scale
  const int n = 4000;
  auto seen = Draws(picker, Policy::kDynamo, {3200, 32}, fleet, n);
  const double p0 = 1.0 / (1.0 + std::exp(-1.0));  // 0.731
  CHECK(seen[0] / double(n) == doctest::Approx(p0).epsilon(0.05));
  fleet[1].decode_blocks = 1;     // the same normalized costs at a thousandth of the scale
  seen = Draws(picker, Policy::kDynamo, {3200, 32}, fleet, n);
  CHECK(seen[0] / double(n) == doctest::Approx(p0).epsilon(0.05));
  options.temperature = 0.05;     // colder: nearly always the least cost
  Picker cold(options);
  CHECK(Draws(cold, Policy::kDynamo, {3200, 32}, fleet, 500)[0] > 490);
}

TEST_CASE("llmd scores 2 x tiered prefix share + (1 - kv usage) + min-max normalized queue") {
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].device_blocks = 30;
  fleet[0].host_blocks = 25;  // (30 + 0.8 x 25) / 100 = 0.5
  fleet[0].kv_usage = 0.5;
  fleet[0].queued_requests = 4;
  fleet[1].kv_usage = 0.1;
  fleet[2].kv_usage = 0.9;
  fleet[2].queued_requests = 2;
  std::vector<size_t> all = {0, 1, 2};
  auto scores = peer::LlmdScores({3200, 32}, fleet, all);
  CHECK(scores[0] == doctest::Approx(2 * 0.5 + 0.5 + 0));
  CHECK(scores[1] == doctest::Approx(0 + 0.9 + 1));
  CHECK(scores[2] == doctest::Approx(0 + 0.1 + 0.5));
  Picker picker(RoutingOptions{});
  CHECK(picker.Pick(Policy::kLlmd, {3200, 32}, fleet)->worker == 1);
  fleet[0].host_blocks = 70;  // prefix (30 + 56) / 100: 2 x 0.86 + 0.5 beats 1.9
  CHECK(picker.Pick(Policy::kLlmd, {3200, 32}, fleet)->worker == 0);
}

TEST_CASE("llmd scores every queue 1 when all queues are equal, whatever their length") {
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].queued_requests = fleet[1].queued_requests = 7;
  fleet[1].kv_usage = 0.25;
  std::vector<size_t> all = {0, 1};
  auto scores = peer::LlmdScores({3200, 32}, fleet, all);
  CHECK(scores[0] == doctest::Approx(1 + 1));
  CHECK(scores[1] == doctest::Approx(0.75 + 1));
  Picker picker(RoutingOptions{});
  CHECK(picker.Pick(Policy::kLlmd, {3200, 32}, fleet)->worker == 0);
}

TEST_CASE("sglang switches to the shortest queue only when the load gap exceeds 64 and 1.5x") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].device_blocks = 100;  // the whole prompt cached on the busier worker
  fleet[0].running_requests = 100;
  fleet[1].running_requests = 20;  // gap 80 > 64 and 100 > 30: imbalanced
  CHECK(picker.Pick(Policy::kSglang, {3200, 32}, fleet)->worker == 1);
  fleet[1].running_requests = 40;  // gap 60: balanced, the match wins
  CHECK(picker.Pick(Policy::kSglang, {3200, 32}, fleet)->worker == 0);
  fleet[0].running_requests = 300;
  fleet[1].running_requests = 210;  // gap 90, but 300 < 1.5 x 210: balanced
  CHECK(picker.Pick(Policy::kSglang, {3200, 32}, fleet)->worker == 0);
  fleet[1].running_requests = 199;  // gap 101 and 300 > 298.5: imbalanced
  CHECK(picker.Pick(Policy::kSglang, {3200, 32}, fleet)->worker == 1);
}

TEST_CASE("sglang takes the best match only above a 0.3 match ratio, else the smallest cache") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1), Idle(2)};
  fleet[0].device_cached_blocks = 500;
  fleet[1].device_cached_blocks = 900;
  fleet[2].device_cached_blocks = 100;
  fleet[1].device_blocks = 30;  // 300 of 1,000 tokens: a ratio of exactly 0.3 is not enough
  CHECK(picker.Pick(Policy::kSglang, {1000, 10}, fleet)->worker == 2);
  fleet[1].device_blocks = 31;  // 0.31
  CHECK(picker.Pick(Policy::kSglang, {1000, 10}, fleet)->worker == 1);
  fleet[1].device_blocks = 20;
  fleet[1].host_blocks = 11;    // host blocks are part of the match
  CHECK(picker.Pick(Policy::kSglang, {1000, 10}, fleet)->worker == 1);
}

TEST_CASE("preble exploits the cache holder when it caches more of the prompt than it leaves") {
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {Idle(0), Idle(1)};
  fleet[0].device_blocks = 51;  // 510 of 1,000 tokens cached
  fleet[0].queued_prefill_tokens = 50'000;  // 5 s of prefill ahead: exploited all the same
  CHECK(picker.Pick(Policy::kPreble, {1000, 10}, fleet)->worker == 0);
  fleet[0].device_blocks = 50;  // cached == uncached: explore, the least load + eviction + prefill
  CHECK(picker.Pick(Policy::kPreble, {1000, 10}, fleet)->worker == 1);
  fleet[0].queued_prefill_tokens = 0;
  CHECK(picker.Pick(Policy::kPreble, {1000, 10}, fleet)->worker == 0);
}

TEST_CASE("preble's explore cost charges the recompute of what must be evicted to fit the request") {
  Candidate roomy = Idle(0);
  roomy.total_device_blocks = 1000;
  roomy.free_device_blocks = 800;
  roomy.device_cached_blocks = 100;  // 700 empty blocks: nothing evicted
  Candidate full = roomy;
  full.free_device_blocks = 300;
  full.device_cached_blocks = 290;   // 10 empty blocks; the request's 100 evict 90
  const double fleet_rate = 10'000;
  CHECK(peer::PrebleCost({1000, 10}, roomy, fleet_rate, 1e-3) == doctest::Approx(1000 / 10'000.0));
  CHECK(peer::PrebleCost({1000, 10}, full, fleet_rate, 1e-3) == doctest::Approx((1000 + 900) / 10'000.0));
  Picker picker(RoutingOptions{});
  std::vector<Candidate> fleet = {full, roomy};
  fleet[0].worker = 0;
  fleet[1].worker = 1;
  CHECK(picker.Pick(Policy::kPreble, {1000, 10}, fleet)->worker == 1);
}

}  // namespace kvfleet::router
