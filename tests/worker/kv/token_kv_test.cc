// Token-level KV (B = 1, LightLLM's TokenAttention): one slot per token, contiguous where
// it can be, reuse token by token, and events in routing groups of G = 16 tokens that a
// router hashes exactly as it hashes a 16-token worker's.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "common/block_hash.h"
#include "tests/worker/kv/kv_fixture.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::kv {
namespace {

using testing::Concat;
using testing::EventIndex;
using testing::Fixture;
using testing::Retain;
using testing::SmallConfig;
using testing::Tokens;

std::vector<BlockHash> GroupHashes(const std::vector<TokenId>& tokens, uint32_t g) {
  return BlockHasher(g, HashNamespace{"m", "", ""}).HashAll(tokens);
}

// The snapshot as a router's index would hold it.
EventIndex SnapshotIndex(const KvCacheManager& m) {
  EventIndex idx;
  REQUIRE(idx.ApplyAll(m.Snapshot()) == "");
  return idx;
}

TEST_CASE("token-level KV: a prompt takes one contiguous run of slots and decode extends it") {
  Fixture f(SmallConfig(1, 256));
  const SequenceId id = f.Add(Tokens(20, 1));
  f.Prefill(id);
  for (TokenId t = 0; t < 12; ++t) f.Decode(id, 500 + t);
  const PoolView v = f.m->View(id, 0);
  REQUIRE(v.blocks.size() == 32);
  for (size_t i = 1; i < v.blocks.size(); ++i) CHECK(v.blocks[i] == v.blocks[0] + i);
  f.Release(id);
}

TEST_CASE("token-level KV: a decode slot is the one after the sequence's last when it is free") {
  Fixture f(SmallConfig(1, 64));
  const SequenceId a = f.Add(Tokens(8, 1));
  f.Prefill(a);
  const SequenceId b = f.Add(Tokens(8, 2));  // takes the slots right after a's
  f.Prefill(b);
  f.Decode(a, 7);  // a's next slot is b's: a gets another
  f.Decode(b, 7);  // b's next slot is free: b stays contiguous
  CHECK(f.m->View(b, 0).blocks[8] == f.m->View(b, 0).blocks[7] + 1);
  CHECK(f.m->View(a, 0).blocks[8] != f.m->View(a, 0).blocks[7] + 1);
  f.Release(a);
  f.Release(b);
}

TEST_CASE("token-level KV reuses a shared prefix to the token, and frees per token") {
  Fixture f(SmallConfig(1, 256));
  const auto shared = Tokens(23, 1);
  const SequenceId a = f.Add(Concat(shared, Tokens(14, 2)));
  f.Prefill(a);
  const SequenceId b = f.Add(Concat(shared, Tokens(5, 3)));
  const MatchInfo info = f.m->Match(b);
  CHECK(info.device_tokens == 23);
  CHECK(info.partial_tokens == 0);
  f.Prefill(b);
  for (size_t i = 0; i < 23; ++i) CHECK(f.m->View(a, 0).blocks[i] == f.m->View(b, 0).blocks[i]);
  CHECK(f.m->View(a, 0).blocks[23] != f.m->View(b, 0).blocks[23]);
  CHECK(f.m->Stats().pools[0].tiers[0].in_use == 37 + 5);
  f.Release(b);
  CHECK(f.m->Stats().pools[0].tiers[0].in_use == 37);
  f.Release(a);
  CHECK(f.m->Stats().pools[0].tiers[0].in_use == 0);
}

TEST_CASE("token-level KV publishes 16-token groups with the hashes of a 16-token worker") {
  auto c = SmallConfig(1, 64);
  REQUIRE(c.EventBlockSize() == config::kTokenKvRoutingBlockSize);
  Fixture f(c);
  f.Flush();  // created
  const auto prompt = Tokens(40, 1);
  f.Request(prompt);
  const auto events = f.Flush();
  EventIndex idx;
  REQUIRE(idx.ApplyAll(events) == "");
  const auto want = GroupHashes(prompt, 16);  // two full groups; tokens 32..39 are not one
  REQUIRE(want.size() == 2);
  REQUIRE(idx.entries.size() == 2);
  const auto& g0 = idx.entries.at({0, want[0]});
  const auto& g1 = idx.entries.at({0, want[1]});
  CHECK(g0.parent == 0);
  CHECK(g1.parent == want[0]);
  CHECK(g1.tokens == std::vector<TokenId>(prompt.begin() + 16, prompt.begin() + 32));
  CHECK(idx.entries == SnapshotIndex(*f.m).entries);
  // A group shorter than 16 tokens is still reused on the worker, to the token.
  const SequenceId again = f.Add(Concat(std::vector<TokenId>(prompt.begin(), prompt.begin() + 37), Tokens(3, 9)));
  CHECK(f.m->Match(again).device_tokens == 37);
  f.Release(again);
  // Unrelated traffic evicts the prompt: each group goes, the later one first.
  for (uint32_t s = 2; s < 6; ++s) f.Request(Tokens(60, s));
  REQUIRE(idx.ApplyAll(f.Flush()) == "");
  CHECK(idx.entries.count({0, want[0]}) == 0);
  CHECK(idx.entries.count({0, want[1]}) == 0);
  CHECK(idx.entries == SnapshotIndex(*f.m).entries);
}

TEST_CASE("the created event counts routing groups of G tokens") {
  auto c = SmallConfig(1, 64);
  c.routing_block_size = 32;
  Fixture f(c);
  const auto events = f.Flush();
  REQUIRE(events.size() == 1);
  const auto& created = std::get<CreatedEvent>(events[0].data);
  CHECK(created.block_size == 32);
  CHECK(created.blocks_per_tier[0] == 2);
}

TEST_CASE("a B = 4 worker with 16-token routing publishes what a B = 16 worker does") {
  auto c4 = SmallConfig(4, 64);
  c4.routing_block_size = 16;
  Fixture f4(c4);
  Fixture f16(SmallConfig(16, 16));
  f4.Flush();
  f16.Flush();
  const auto prompt = Tokens(50, 4);
  f4.Request(prompt);
  f16.Request(prompt);
  EventIndex i4, i16;
  REQUIRE(i4.ApplyAll(f4.Flush()) == "");
  REQUIRE(i16.ApplyAll(f16.Flush()) == "");
  CHECK(i4.entries.size() == 3);
  CHECK(i4.entries == i16.entries);
}

// Random traffic with shared prefixes, retention priorities and a host tier: the events,
// applied as a router applies them, always agree with the ordering contract, and in the
// end with the snapshot; the manager's invariants hold throughout.
TEST_CASE("token-level KV under eviction, offload and priorities keeps events and snapshot in step") {
  auto c = SmallConfig(1, 700, 400);
  c.routing_block_size = 8;
  Fixture f(c);
  std::mt19937 rng(7);
  EventIndex idx;
  REQUIRE(idx.ApplyAll(f.Flush()) == "");
  std::vector<std::vector<TokenId>> prefixes;
  for (uint32_t p = 0; p < 6; ++p) prefixes.push_back(Tokens(8 + 13 * p, 100 + p));
  uint64_t reused_before = 0;
  for (uint32_t r = 0; r < 300; ++r) {
    const auto& prefix = prefixes[rng() % prefixes.size()];
    const auto prompt = Concat(prefix, Tokens(1 + rng() % 60, 1000 + r));
    const uint8_t priority = (rng() % 4 == 0) ? 80 : static_cast<uint8_t>(rng() % 50);
    const SequenceId id = f.Add(prompt, Retain(priority));
    f.m->Match(id);
    f.Prefill(id);
    for (uint32_t d = 0; d < rng() % 20; ++d) f.Decode(id, 7 + d);
    f.Release(id);
    f.clock.Advance(1'000'000);
    const std::string err = idx.ApplyAll(f.Flush());
    REQUIRE_MESSAGE(err.empty(), err);
    if (r == 150) reused_before = f.m->Stats().reused_tokens;
  }
  CHECK(f.m->Stats().reused_tokens > reused_before);  // still reusing under pressure
  CHECK(f.m->Stats().pools[0].offloads > 0);
  CHECK(idx.Count(Tier::kHost) > 0);
  CHECK(idx.entries == SnapshotIndex(*f.m).entries);
}

TEST_CASE("token-level KV with StreamingLLM sinks and a window holds sinks + window slots, whatever the length") {
  auto c = SmallConfig(1, 400);
  c.attention_windows = {64};
  c.sink_tokens = 4;
  c.dense_context = true;
  Fixture f(c);
  const uint32_t bound = f.m->MaxSequenceBlocks(0);
  const SequenceId id = f.Add(Tokens(10, 1));
  REQUIRE(f.m->Allocate(id).ok());
  f.m->Commit(id, 10);
  uint32_t most = 0, most_steady = 0;
  for (uint32_t n = 10; n < 5'000; ++n) {
    const TokenId t = n;
    REQUIRE(f.m->Append(id, std::span<const TokenId>(&t, 1)).ok());
    f.m->Commit(id, n + 1);
    const uint32_t in_use = f.m->Stats().pools[0].tiers[0].in_use;
    most = std::max(most, in_use);
    if (n > 2 * 64) most_steady = std::max(most_steady, in_use);
  }
  CHECK(most <= bound);
  CHECK(most_steady <= 4 + 64 + 1);  // sinks, the window, the token being appended
  CHECK(most_steady >= 4 + 64);
  CHECK(f.m->SlotOf(id, 0, 3).has_value());  // a sink
  CHECK_FALSE(f.m->SlotOf(id, 0, 2'000).has_value());
  CHECK(f.m->SlotOf(id, 0, 4'999).has_value());
  f.Check();
  f.Release(id);
}

TEST_CASE("token-level KV with chunked attention keeps only the current chunk's slots") {
  auto c = SmallConfig(1, 400);
  c.attention_chunk_size = 32;
  Fixture f(c);
  const SequenceId id = f.Add(Tokens(40, 2));
  f.Prefill(id);
  for (TokenId t = 0; t < 100; ++t) f.Decode(id, t);
  CHECK(f.m->Stats().pools[0].tiers[0].in_use <= 32 + 1);
  f.Check();
  f.Release(id);
}

}  // namespace
}  // namespace kvfleet::kv
