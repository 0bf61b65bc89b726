// Contract 5, router gossip (schema/gossip_codec.h): what one router encodes another decodes
// to the same value, and a garbage, truncated or out-of-bounds frame is refused, never a crash.
#include "schema/gossip_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "schema/gossip.capnp.h"
#include "schema/limits.h"
#include "schema/wire.h"
#include "tests/schema/frame_vectors.h"

namespace kvfleet {
namespace {

RouterGossip Example() {
  RouterGossip g;
  g.router_id = "tcp://10.0.0.2:5560";
  g.incarnation = 0x1234567890abcdefULL;
  g.seq = 42;
  g.workers = {{"worker-0", 3, 1, 900, 1024}, {"worker-1", 1, 0, 0, 0}};
  g.models = {{"llama", 12500.5}};
  return g;
}

StatusCode CodeOf(const std::string& frame) { return DecodeGossip(frame.data(), frame.size()).status().code(); }

}  // namespace

TEST_CASE("the Contract 5 test vector decodes field by field, and the encoder writes its bytes exactly") {
  const std::string frame = testing::LoadFrameVectors("schema/gossip_vectors.txt").at("router gossip");
  std::vector<capnp::word> words((frame.size() + 7) / 8);  // word-aligned, as ZMQ's buffers are
  std::memcpy(words.data(), frame.data(), frame.size());
  auto g = DecodeGossip(words.data(), frame.size());
  REQUIRE(g.ok());
  RouterGossip want;
  want.router_id = "router-1";
  want.incarnation = 4255137562389618945ULL;
  want.seq = 812;
  want.workers = {{"worker-0", 3, 1, 900, 1024}};
  want.models = {{"mock", 12500}};
  CHECK(*g == want);
  CHECK(EncodeGossip(want) == frame);
}

TEST_CASE("a RouterGossip decodes to what was encoded") {
  const RouterGossip g = Example();
  const std::string frame = EncodeGossip(g);
  auto back = DecodeGossip(frame.data(), frame.size());
  REQUIRE(back.ok());
  CHECK(*back == g);
  RouterGossip empty;
  empty.router_id = "r";
  const std::string small = EncodeGossip(empty);
  REQUIRE(DecodeGossip(small.data(), small.size()).ok());
  CHECK(DecodeGossip(small.data(), small.size())->workers.empty());
}

TEST_CASE("garbage and truncated gossip frames are refused as malformed") {
  const std::string frame = EncodeGossip(Example());
  for (size_t n : {size_t{0}, size_t{3}, size_t{8}, frame.size() / 2, frame.size() - 1}) {
    CHECK(CodeOf(frame.substr(0, n)) == StatusCode::kDataLoss);
  }
  CHECK(CodeOf("not a capnp message at all, just text") == StatusCode::kDataLoss);
  // Random bytes, and the real frame with random bytes flipped: refused or decoded, and a
  // decoded one always within the bounds, never a crash.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = frame;
    if (i % 2 == 0) {
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {
      for (int k = 0; k < 4; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    auto r = DecodeGossip(bytes.data(), bytes.size());
    if (!r.ok()) continue;
    CHECK(!r->router_id.empty());
    for (const GossipWorker& w : r->workers) CHECK(w.waiting <= w.requests);
    for (const GossipModel& m : r->models) CHECK(std::isfinite(m.prefill_tokens_per_second));
  }
}

TEST_CASE("a gossip frame that breaks a bound is refused as invalid") {
  auto refused = [](RouterGossip g) { return CodeOf(EncodeGossip(g)) == StatusCode::kInvalidArgument; };
  RouterGossip g = Example();
  g.router_id = "";
  CHECK(refused(g));
  g.router_id = std::string(300, 'r');
  CHECK(refused(g));
  g.router_id = "bad\nname";
  CHECK(refused(g));
  g = Example();
  g.workers[0].waiting = g.workers[0].requests + 1;  // more waiting than in flight
  CHECK(refused(g));
  g = Example();
  g.workers[0].prefill_tokens = g.workers[0].prompt_tokens + 1;  // more uncached than the prompts
  CHECK(refused(g));
  g = Example();
  g.workers[0].prompt_tokens = uint64_t{2} << 40;  // past the longest context per waiting request
  CHECK(refused(g));
  g = Example();
  g.workers[1].worker = g.workers[0].worker;  // one worker twice
  CHECK(refused(g));
  g = Example();
  g.models.push_back(g.models[0]);
  CHECK(refused(g));
  for (double rate : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    g = Example();
    g.models[0].prefill_tokens_per_second = rate;
    CHECK(refused(g));
  }
  g = Example();
  g.workers.clear();
  for (int i = 0; i <= wire::limits::kMaxGossipWorkers; ++i) g.workers.push_back({"w" + std::to_string(i), 1, 0, 0, 0});
  CHECK(refused(g));  // one more worker than a router holds
  g.workers.pop_back();
  CHECK(CodeOf(EncodeGossip(g)) == StatusCode::kOk);
}

TEST_CASE("the largest valid RouterGossip fits the gossip socket's frame limit") {
  RouterGossip g;
  g.router_id = std::string(wire::limits::kMaxNameBytes, 'r');
  g.incarnation = g.seq = ~uint64_t{0};
  for (int i = 0; i < wire::limits::kMaxGossipWorkers; ++i) {
    std::string name = std::to_string(i);
    name.resize(wire::limits::kMaxNameBytes, 'w');
    g.workers.push_back({name, ~uint32_t{0}, ~uint32_t{0}, uint64_t{1} << 50, uint64_t{1} << 50});
  }
  for (int i = 0; i < wire::limits::kMaxGossipModels; ++i) {
    std::string name = std::to_string(i);
    name.resize(wire::limits::kMaxNameBytes, 'm');
    g.models.push_back({name, 1e9});
  }
  CHECK(static_cast<int64_t>(EncodeGossip(g).size()) <= wire::limits::kMaxGossipBytes);
}

TEST_CASE("a gossip frame of an older sender, without the later fields, reads with their defaults") {
  capnp::MallocMessageBuilder message;
  message.initRoot<schema::RouterGossip>().setRouterId("old");
  const std::string frame = wire::Encode(message);
  auto g = DecodeGossip(frame.data(), frame.size());
  REQUIRE(g.ok());
  CHECK(g->router_id == "old");
  CHECK(g->seq == 0);
  CHECK(g->workers.empty());
  CHECK(g->models.empty());
}

}  // namespace kvfleet
