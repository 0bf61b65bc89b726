// The KV cache manager: reuse through the radix tree, partial reuse, priority and duration
// eviction, the host tier, events and bad input. The long-sequence features (StreamingLLM,
// sliding windows, chunked attention, per-window pools) are in kv_long_sequence_test.cc.
#include "worker/kv/kv_cache_manager.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "common/block_hash.h"
#include "tests/worker/kv/kv_fixture.h"

namespace kvfleet::kv {
namespace {

using testing::Concat;
using testing::EventIndex;
using testing::Fixture;
using testing::Retain;
using testing::SmallConfig;
using testing::Tokens;

std::vector<BlockHash> Hashes(const std::vector<TokenId>& tokens, uint32_t block_size) {
  return BlockHasher(block_size, HashNamespace{"m", "", ""}).HashAll(tokens);
}

uint8_t PriorityInSnapshot(const KvCacheManager& m, BlockHash h) {
  for (const KvEvent& e : m.Snapshot()) {
    for (const StoredBlock& b : std::get<StoredEvent>(e.data).blocks) {
      if (b.hash == h) return b.priority;
    }
  }
  FAIL("block not in the snapshot");
  return 0;
}

TEST_CASE("a new sequence gets its blocks as one contiguous run") {
  Fixture f(SmallConfig(4, 64));
  const SequenceId id = f.Add(Tokens(20, 1));
  REQUIRE(f.m->Allocate(id).ok());
  const PoolView v = f.m->View(id, 0);
  REQUIRE(v.blocks.size() == 5);
  for (size_t i = 1; i < v.blocks.size(); ++i) CHECK(v.blocks[i] == v.blocks[0] + i);
  f.Check();
}

TEST_CASE("a request sharing a prefix shares the device blocks of that prefix") {
  Fixture f(SmallConfig(4, 64));
  const SequenceId a = f.Add(Concat(Tokens(16, 1), Tokens(4, 2)));
  f.Prefill(a);
  const SequenceId b = f.Add(Concat(Tokens(16, 1), Tokens(8, 3)));
  const MatchInfo info = f.m->Match(b);
  CHECK(info.device_tokens == 16);
  CHECK(info.host_tokens == 0);
  CHECK(info.partial_tokens == 0);
  f.Prefill(b);
  for (size_t i = 0; i < 4; ++i) CHECK(f.m->View(a, 0).blocks[i] == f.m->View(b, 0).blocks[i]);
  CHECK(f.m->View(a, 0).blocks[4] != f.m->View(b, 0).blocks[4]);
  CHECK(f.m->Stats().reused_tokens == 16);
  f.Release(a);
  f.Release(b);
}

TEST_CASE("the last prompt token is always computed, even when the whole prompt is cached") {
  Fixture f(SmallConfig(4, 64));
  const auto prompt = Tokens(16, 1);
  f.Request(prompt);
  const SequenceId b = f.Add(prompt);
  const MatchInfo info = f.m->Match(b);
  CHECK(info.device_tokens == 12);
  CHECK(info.partial_tokens == 3);
  f.Prefill(b);  // checks the 15 reused tokens hold this prompt's KV
  CHECK(f.m->NumComputedTokens(b) == 16);
  CHECK(f.m->Stats().pools[0].partial_copies == 1);
  f.Release(b);
}

TEST_CASE("a sequence registered with match_cached = false matches nothing of a cached prompt, which still serves others") {
  Fixture f(SmallConfig(4, 64));
  const auto prompt = Tokens(16, 1);
  f.Request(prompt);
  SequenceSpec spec;
  spec.prompt = prompt;
  spec.model.assign(1, 'm');
  spec.match_cached = false;  // prompt logprobs: every position is computed
  auto b = f.m->AddSequence(std::move(spec));
  REQUIRE(b.ok());
  CHECK(f.m->Match(*b).cached_tokens() == 0);
  REQUIRE(f.m->CanAllocate(*b));
  REQUIRE(f.m->Allocate(*b).ok());
  CHECK(f.m->NumComputedTokens(*b) == 0);
  f.m->Release(*b);
  const SequenceId c = f.Add(prompt);
  CHECK(f.m->Match(c).device_tokens == 12);
  f.Release(c);
}

TEST_CASE("partial reuse copies the matching tokens of a partly matching block into a fresh block") {
  Fixture f(SmallConfig(4, 64));
  const std::vector<TokenId> tail_a = {7, 8, 9, 10, 11};
  const std::vector<TokenId> tail_b = {7, 8, 90, 100, 110};
  const SequenceId a = f.Add(Concat(Tokens(8, 1), tail_a));
  f.Prefill(a);
  const SequenceId b = f.Add(Concat(Tokens(8, 1), tail_b));
  CHECK(f.m->Match(b).partial_tokens == 2);
  f.mem->log.clear();
  f.Prefill(b);
  const BlockId src = f.m->View(a, 0).blocks[2];
  const BlockId dst = f.m->View(b, 0).blocks[2];
  CHECK(src != dst);
  const bool copied = std::any_of(f.mem->log.begin(), f.mem->log.end(), [&](const BlockCopy& c) {
    return c.src == src && c.dst == dst && c.src_tier == Tier::kDevice && c.dst_tier == Tier::kDevice;
  });
  CHECK(copied);
  f.Release(a);
  f.Release(b);
}

TEST_CASE("partial reuse can be turned off") {
  auto c = SmallConfig(4, 64);
  c.enable_partial_reuse = false;
  Fixture f(c);
  const auto prompt = Tokens(16, 1);
  f.Request(prompt);
  const SequenceId b = f.Add(prompt);
  CHECK(f.m->Match(b).partial_tokens == 0);
  CHECK(f.m->Match(b).device_tokens == 12);
}

TEST_CASE("a hash collision never shares KV") {
  // Every block hashes alike: only the token and parent checks keep requests apart.
  KvTestHooks hooks;
  hooks.hash_override = [](BlockHash) { return BlockHash{42}; };
  Fixture f(SmallConfig(4, 64), hooks);
  f.Request(Tokens(9, 1));
  const SequenceId b = f.Add(Tokens(9, 2));
  CHECK(f.m->Match(b).cached_tokens() == 0);
  f.Prefill(b);
  f.Release(b);
  // Same first block, different second: the first is shared, the colliding second is not.
  const SequenceId c = f.Add(Concat(Tokens(4, 1), Tokens(5, 3)));
  CHECK(f.m->Match(c).device_tokens == 4);
  CHECK(f.m->Match(c).partial_tokens == 0);
  f.Prefill(c);  // checks every reused token holds c's own KV
  f.Release(c);
}

TEST_CASE("a block with equal tokens and an equal hash under another parent is another block") {
  KvTestHooks hooks;
  hooks.hash_override = [](BlockHash) { return BlockHash{42}; };
  Fixture f(SmallConfig(4, 64), hooks);
  const auto x = Tokens(4, 5);
  f.Request(Concat(Concat(x, x), {1}));
  const SequenceId d = f.Add(Concat(Concat(Concat(x, x), x), {2}));
  CHECK(f.m->Match(d).device_tokens == 4);
  f.Prefill(d);
  f.Release(d);
}

TEST_CASE("a block holding a token outside the vocabulary is kept private and never matched") {
  auto c = SmallConfig(4, 64);
  c.vocab_size = 16;  // tokens are stored in 4 bits
  Fixture f(c);
  const std::vector<TokenId> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 10, 11, 12, 13, 14, 15, 1};
  f.Request(prompt);  // blocks 0 and 1 are stored; block 2 holds token 16 and stops the chain
  size_t stored = 0;
  for (const KvEvent& e : f.m->Snapshot()) stored += std::get<StoredEvent>(e.data).blocks.size();
  CHECK(stored == 2);
  const MatchInfo again = f.Request(prompt);  // Prefill checks the reused KV is right
  CHECK(again.device_tokens == 8);
  CHECK(again.partial_tokens == 0);
}

TEST_CASE("LRU order holds when the 32-bit use counter wraps") {
  KvTestHooks hooks;
  hooks.first_lru_tick = UINT32_MAX - 8;  // request a uses 6 ticks; the counter wraps during b
  Fixture f(SmallConfig(4, 64), hooks);
  const auto a = Tokens(13, 1);  // 3 stored blocks
  const auto b = Tokens(9, 2);   // 2 stored blocks
  f.Request(a);
  f.Request(b);
  const auto ha = Hashes(a, 4);
  const auto e = f.m->Evict(0, 2);  // a is the least recently used
  REQUIRE(e.size() == 2);
  CHECK(e[0].hash == ha[2]);
  CHECK(e[1].hash == ha[1]);
  f.Check();
}

TEST_CASE("a priority-100 system prompt outlives 10,000 one-off requests at priority 0") {
  Fixture f(SmallConfig(4, 64));
  const auto system = Tokens(16, 7);
  f.Request(system, Retain(100));
  for (uint32_t i = 0; i < 10'000; ++i) f.Request(Tokens(12, 1000 + i), Retain(0));
  const SequenceId s = f.Add(system);
  CHECK(f.m->Match(s).device_tokens == 12);
  CHECK(f.m->Match(s).partial_tokens == 3);
  CHECK(f.m->Stats().pools[0].tiers[0].evictions_by_priority[0] > 0);
  CHECK(f.m->Stats().pools[0].tiers[0].evictions_by_priority[100] == 0);
}

TEST_CASE("TensorRT-LLM example 1: a one-off request at priority 0 is evicted before default blocks") {
  Fixture f(SmallConfig(4, 16));
  const auto normal = Tokens(9, 1);
  const auto one_off = Tokens(9, 2);
  f.Request(normal);
  f.Request(one_off, Retain(0));  // more recent, but priority 0
  const auto evicted = f.m->Evict(0, 2);
  REQUIRE(evicted.size() == 2);
  const auto one_off_hashes = Hashes(one_off, 4);
  for (const EvictedBlock& e : evicted) {
    CHECK(e.priority == 0);
    CHECK(std::find(one_off_hashes.begin(), one_off_hashes.end(), e.hash) != one_off_hashes.end());
  }
  CHECK(f.m->Match(f.Add(normal)).device_tokens == 8);
}

TEST_CASE("TensorRT-LLM example 2: a high-priority system prompt [0, 1000) survives user traffic") {
  Fixture f(SmallConfig(8, 200));
  const auto system = Tokens(1000, 5);
  KvCacheRetentionConfig r;
  r.token_ranges.push_back({0, 1000, 100, std::nullopt});
  for (uint32_t i = 0; i < 50; ++i) f.Request(Concat(system, Tokens(200, 100 + i)), r);
  const SequenceId s = f.Add(Concat(system, Tokens(200, 999)));
  CHECK(f.m->Match(s).device_tokens == 1000);
  // The user parts (priority 35) were evicted, the system prompt (priority 100) never was.
  CHECK(f.m->Stats().pools[0].tiers[0].evictions_by_priority[35] > 0);
  CHECK(f.m->Stats().pools[0].tiers[0].evictions_by_priority[100] == 0);
  CHECK(PriorityInSnapshot(*f.m, Hashes(system, 8).back()) == 100);
}

TEST_CASE("TensorRT-LLM example 3: context blocks kept 30 s and decode blocks 10 s") {
  Fixture f(SmallConfig(4, 64));
  KvCacheRetentionConfig r;
  r.token_ranges.push_back({0, std::nullopt, 100, 30 * kNsPerSec});
  r.decode_priority = 100;
  r.decode_duration = 10 * kNsPerSec;
  const SequenceId id = f.Add(Tokens(16, 1), r);
  f.Prefill(id);
  for (TokenId t = 0; t < 8; ++t) f.Decode(id, 500 + t);
  const auto hashes = Hashes(f.TokensOf(id), 4);  // blocks 0-3: prompt, 4-5: generated
  REQUIRE(hashes.size() == 6);
  f.Release(id);
  f.clock.Advance(5 * kNsPerSec);
  f.m->Evict(0, 0);  // any call applies expired durations
  CHECK(PriorityInSnapshot(*f.m, hashes[3]) == 100);
  CHECK(PriorityInSnapshot(*f.m, hashes[4]) == 100);
  f.clock.Advance(10 * kNsPerSec);
  f.m->Evict(0, 0);
  CHECK(PriorityInSnapshot(*f.m, hashes[3]) == 100);
  CHECK(PriorityInSnapshot(*f.m, hashes[4]) == kDefaultPriority);
  CHECK(PriorityInSnapshot(*f.m, hashes[5]) == kDefaultPriority);
  f.clock.Advance(20 * kNsPerSec);
  f.m->Evict(0, 0);
  CHECK(PriorityInSnapshot(*f.m, hashes[0]) == kDefaultPriority);
  f.Check();
}

TEST_CASE("a block whose duration expired becomes evictable at the default priority") {
  Fixture f(SmallConfig(4, 64));
  const auto kept = Tokens(5, 1);
  f.Request(kept, Retain(90, 10 * kNsPerSec));
  f.Request(Tokens(5, 2));  // default priority, used later
  f.clock.Advance(5 * kNsPerSec);
  auto first = f.m->Evict(0, 1);
  REQUIRE(first.size() == 1);
  CHECK(first[0].hash != Hashes(kept, 4)[0]);  // still priority 90
  f.Request(Tokens(5, 3));
  f.clock.Advance(6 * kNsPerSec);
  auto second = f.m->Evict(0, 1);
  REQUIRE(second.size() == 1);
  CHECK(second[0].hash == Hashes(kept, 4)[0]);  // now 35 and the least recently used
  CHECK(second[0].priority == kDefaultPriority);
}

TEST_CASE("reusing a block before its duration passes keeps its priority") {
  Fixture f(SmallConfig(4, 64));
  const auto kept = Tokens(5, 1);
  f.Request(kept, Retain(90, 10 * kNsPerSec));
  f.clock.Advance(8 * kNsPerSec);
  f.Request(kept);  // reuse restarts the duration
  f.clock.Advance(8 * kNsPerSec);
  f.m->Evict(0, 0);
  CHECK(PriorityInSnapshot(*f.m, Hashes(kept, 4)[0]) == 90);
}

TEST_CASE("offloaded blocks are found on the host and onboarded") {
  Fixture f(SmallConfig(4, 8, 16));
  const auto prompt = Tokens(9, 1);
  f.Request(prompt);
  const auto evicted = f.m->Evict(0, 2);
  REQUIRE(evicted.size() == 2);
  CHECK(evicted[0].offloaded);
  CHECK(evicted[1].offloaded);
  CHECK(f.m->FreeBlocks(Tier::kHost) == 16);  // offloaded, held by nobody: evictable
  f.mem->ScribbleDevice();  // the freed device blocks get reused by others
  f.Flush();
  const SequenceId id = f.Add(prompt);
  const MatchInfo info = f.m->Match(id);
  CHECK(info.device_tokens == 0);
  CHECK(info.host_tokens == 8);
  f.Prefill(id);  // checks the onboarded KV is this prompt's
  CHECK(f.m->NumComputedTokens(id) == 9);
  const auto stats = f.m->Stats().pools[0];
  CHECK(stats.offloads == 2);
  CHECK(stats.onboards == 2);
  int to_device = 0;
  for (const KvEvent& e : f.Flush()) {
    if (auto* u = std::get_if<UpdatedEvent>(&e.data); u && u->tier == Tier::kDevice) ++to_device;
  }
  CHECK(to_device == 2);
  f.Release(id);
}

TEST_CASE("blocks below offload_min_priority are dropped, not offloaded") {
  Fixture f(SmallConfig(4, 8, 16));
  f.Request(Tokens(9, 1), Retain(10));
  const auto evicted = f.m->Evict(0, 2);
  REQUIRE(evicted.size() == 2);
  CHECK_FALSE(evicted[0].offloaded);
  CHECK_FALSE(evicted[1].offloaded);
  CHECK(f.m->Match(f.Add(Tokens(9, 1))).cached_tokens() == 0);
}

TEST_CASE("a full host tier evicts its own least recently used blocks to take new ones") {
  Fixture f(SmallConfig(4, 8, 2));
  const auto a = Tokens(9, 1);
  const auto b = Tokens(9, 2);
  f.Request(a);
  f.m->Evict(0, 2);  // a -> host
  f.Request(b);
  f.m->Evict(0, 2);  // b -> host, pushing a out
  CHECK(f.m->Match(f.Add(a)).cached_tokens() == 0);
  CHECK(f.m->Match(f.Add(b)).host_tokens == 8);
  CHECK(f.m->Stats().pools[0].tiers[1].evictions_by_priority[35] == 2);
  f.Check();
}

TEST_CASE("a dropped device block takes its host descendants with it, children first") {
  Fixture f(SmallConfig(4, 8, 16));
  const auto a = Tokens(13, 1);
  KvCacheRetentionConfig r;
  r.token_ranges.push_back({0, 8, 10, std::nullopt});  // blocks 0-1: too low to offload
  f.Request(a, r);                                     // block 2: default priority
  const auto h = Hashes(a, 4);
  auto first = f.m->Evict(0, 1);
  REQUIRE(first.size() == 1);
  CHECK(first[0].hash == h[2]);
  CHECK(first[0].offloaded);
  f.Flush();
  auto second = f.m->Evict(0, 1);
  REQUIRE(second.size() == 1);
  CHECK(second[0].hash == h[1]);
  CHECK_FALSE(second[0].offloaded);
  const auto events = f.Flush();
  REQUIRE(events.size() == 2);
  CHECK(std::get<RemovedEvent>(events[0].data).tier == Tier::kHost);
  CHECK(std::get<RemovedEvent>(events[0].data).hashes == std::vector<BlockHash>{h[2]});
  CHECK(std::get<RemovedEvent>(events[1].data).tier == Tier::kDevice);
  CHECK(f.m->Match(f.Add(a)).device_tokens == 4);
  f.Check();
}

TEST_CASE("eviction takes the least recently used leaf first and a block before its ancestors") {
  Fixture f(SmallConfig(4, 64));
  const auto a = Tokens(13, 1);  // 3 stored blocks
  f.Request(a);
  f.clock.Advance(kNsPerSec);
  f.Request(Tokens(9, 2));
  const auto ha = Hashes(a, 4);
  auto e1 = f.m->Evict(0, 1);
  auto e2 = f.m->Evict(0, 1);
  REQUIRE(e1.size() == 1);
  REQUIRE(e2.size() == 1);
  CHECK(e1[0].hash == ha[2]);
  CHECK(e2[0].hash == ha[1]);
  f.Check();
}

TEST_CASE("Allocate fails cleanly when every block is held") {
  Fixture f(SmallConfig(4, 4));
  const SequenceId a = f.Add(Tokens(16, 1));
  f.Prefill(a);
  const SequenceId b = f.Add(Tokens(4, 2));
  CHECK_FALSE(f.m->CanAllocate(b));
  CHECK(f.m->Allocate(b).code() == StatusCode::kResourceExhausted);
  CHECK_FALSE(f.m->CanAppend(a));
  f.Check();
  f.Release(a);
  CHECK(f.m->CanAllocate(b));
}

TEST_CASE("a preempted sequence matches its own blocks again") {
  Fixture f(SmallConfig(4, 64));
  const SequenceId a = f.Add(Tokens(8, 1));
  f.Prefill(a);
  for (TokenId t = 0; t < 5; ++t) f.Decode(a, 900 + t);
  f.m->Preempt(a);
  f.Check();
  CHECK_FALSE(f.m->IsAllocated(a));
  CHECK(f.m->Match(a).device_tokens == 12);
  f.Prefill(a);
  CHECK(f.m->NumTokens(a) == 13);
  f.Release(a);
}

TEST_CASE("identical prompts in flight at once end up sharing one stored copy") {
  Fixture f(SmallConfig(4, 64));
  const auto prompt = Tokens(9, 1);
  const SequenceId a = f.Add(prompt);
  const SequenceId b = f.Add(prompt);
  REQUIRE(f.m->Allocate(a).ok());
  REQUIRE(f.m->Allocate(b).ok());  // nothing stored yet: b computes too
  testing::WriteKv(*f.m, *f.mem, a, prompt, 0, 9);
  testing::WriteKv(*f.m, *f.mem, b, prompt, 0, 9);
  f.m->Commit(a, 9);
  f.m->Commit(b, 9);
  f.Check();
  CHECK(f.m->View(a, 0).blocks[0] == f.m->View(b, 0).blocks[0]);
  CHECK(f.m->View(a, 0).blocks[1] == f.m->View(b, 0).blocks[1]);
  CHECK(f.m->Stats().pools[0].tiers[0].in_use == 4);  // 2 shared + 2 private tails
  f.Release(a);
  f.Release(b);
}

TEST_CASE("events replayed in order rebuild exactly the snapshot") {
  Fixture f(SmallConfig(4, 12, 6));
  EventIndex replayed;
  for (uint32_t i = 0; i < 40; ++i) {
    f.Request(Concat(Tokens(8, i % 3), Tokens(6, 100 + i)), Retain(static_cast<uint8_t>(i % 3 == 0 ? 10 : 60)));
    if (i % 7 == 0) f.m->Evict(0, 3);
    f.clock.Advance(kNsPerSec);
    CHECK(replayed.ApplyAll(f.Flush()) == "");
  }
  EventIndex from_snapshot;
  CHECK(from_snapshot.ApplyAll(f.m->Snapshot()) == "");
  CHECK(replayed.entries == from_snapshot.entries);
  CHECK(replayed.Count(Tier::kHost) > 0);
}

// Regression: partial reuse compared the tokens of every root block, so a request of one
// namespace copied another's KV for the same tokens (another adapter's, another cache_salt's).
TEST_CASE("partial reuse never copies a block of another adapter or cache_salt") {
  Fixture f(SmallConfig(4, 16));
  const auto prompt = Tokens(4, 1);  // one full block: its whole KV would be a partial hit
  f.Request(Concat(prompt, Tokens(3, 2)));
  f.lora = "sql";
  const MatchInfo other = f.Request(prompt);
  CHECK(other.device_tokens == 0);
  CHECK(other.partial_tokens == 0);
  f.lora = "";
  CHECK(f.Request(prompt).partial_tokens == 3);  // its own namespace's block: the last token is recomputed
}

TEST_CASE("an adapter's blocks hash apart from the base model's, and their events carry its loraId") {
  Fixture f(SmallConfig(4, 12, 8));
  const auto prompt = Tokens(9, 1);
  f.Request(prompt);
  f.lora = "sql";
  CHECK(f.Request(prompt).device_tokens == 0);  // the base model's KV is not the adapter's
  CHECK(f.Request(prompt).device_tokens == 8);  // the adapter's own is reused
  std::map<uint64_t, int> stored;  // lora_id → blocks
  for (const KvEvent& e : f.Flush()) {
    if (auto* s = std::get_if<StoredEvent>(&e.data)) {
      for (const StoredBlock& b : s->blocks) ++stored[b.lora_id];
    }
  }
  CHECK(stored[0] == 2);
  CHECK(stored[LoraId("sql")] == 2);
  CHECK(stored.size() == 2);
  // Offloaded blocks keep their adapter in the snapshot.
  f.m->Evict(0, 4);
  std::map<std::pair<uint64_t, Tier>, int> snap;
  for (const KvEvent& e : f.m->Snapshot()) {
    for (const StoredBlock& b : std::get<StoredEvent>(e.data).blocks) ++snap[{b.lora_id, b.tier}];
  }
  CHECK(snap[{LoraId("sql"), Tier::kHost}] + snap[{0, Tier::kHost}] == 4);
  CHECK(snap[{LoraId("sql"), Tier::kHost}] + snap[{LoraId("sql"), Tier::kDevice}] == 2);
  f.Check();
}

TEST_CASE("FreeBlocks counts cached blocks nobody holds: what a new sequence can take") {
  Fixture f(SmallConfig(4, 8));
  f.Request(Tokens(16, 1));  // its 4 blocks stay cached for reuse, held by nobody
  CHECK(f.m->FreeBlocks(Tier::kDevice) == 8);
  const SequenceId held = f.Add(Tokens(8, 2));
  f.Prefill(held);  // 2 blocks in use
  const uint64_t free = f.m->FreeBlocks(Tier::kDevice);
  CHECK(free == 6);
  // Exactly `free` blocks fit, by evicting the cached ones; one token more does not.
  const SequenceId over = f.Add(Tokens(static_cast<uint32_t>(free) * 4 + 1, 3));
  CHECK_FALSE(f.m->CanAllocate(over));
  f.Release(over);
  const SequenceId fits = f.Add(Tokens(static_cast<uint32_t>(free) * 4, 3));
  f.Prefill(fits);
  CHECK(f.m->FreeBlocks(Tier::kDevice) == 0);
  f.Release(fits);
  f.Release(held);
}

TEST_CASE("Clear drops every cached block and emits cleared") {
  Fixture f(SmallConfig(4, 16));
  f.Request(Tokens(9, 1));
  f.m->Clear();
  CHECK(f.m->Snapshot().empty());
  CHECK(f.m->FreeBlocks(Tier::kDevice) == 16);
  const auto events = f.Flush();
  REQUIRE_FALSE(events.empty());
  CHECK(std::holds_alternative<ClearedEvent>(events.back().data));
  f.Check();
}

TEST_CASE("the event list drops the oldest events when full and counts them") {
  auto c = SmallConfig(4, 64);
  c.event_buffer_max_size = 3;
  Fixture f(c);
  for (uint32_t i = 0; i < 10; ++i) f.Request(Tokens(9, i));
  CHECK(f.m->Stats().events_dropped == 8);  // 1 created + 10 stored, 3 kept
  CHECK(f.m->events_dropped() == 8);
  const auto events = f.Flush();
  REQUIRE(events.size() == 3);
  CHECK(std::get<StoredEvent>(events.back().data).blocks[0].hash == Hashes(Tokens(9, 9), 4)[0]);
}

TEST_CASE("the created event states each pool's size") {
  Fixture f(SmallConfig(4, 10, 5));
  const auto events = f.Flush();
  REQUIRE_FALSE(events.empty());
  const auto& created = std::get<CreatedEvent>(events[0].data);
  CHECK(created.blocks_per_tier[0] == 10);
  CHECK(created.blocks_per_tier[1] == 5);
  CHECK(created.block_size == 4);
}

TEST_CASE("bad input is refused with a status") {
  Fixture f(SmallConfig(4, 16));
  CHECK(f.m->AddSequence(SequenceSpec{}).status().code() == StatusCode::kInvalidArgument);
  SequenceSpec spec;
  spec.prompt = {1, 2};
  spec.retention.token_ranges.push_back({0, 1, 101, std::nullopt});
  CHECK(f.m->AddSequence(spec).status().code() == StatusCode::kInvalidArgument);
  auto bad = SmallConfig(3, 16);
  ManualClock clock;
  testing::FakeKvMemory mem({}, 4);
  CHECK(KvCacheManager::Make(bad, &mem, &clock).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvfleet::kv