// The KV cache manager's long-sequence features: StreamingLLM sinks and its dense context
// phase, sliding windows, chunked attention, and the pools per (window, kv heads) pair.
#include "worker/kv/kv_cache_manager.h"

#include <doctest/doctest.h>

#include "tests/worker/kv/kv_fixture.h"

namespace kvfleet::kv {
namespace {

using testing::Fixture;
using testing::SmallConfig;
using testing::Tokens;

TEST_CASE("a 1M-token StreamingLLM sequence stays within its block bound") {
  // Sinks 4, window 4096, B = 32: 1 sink block + ceil(4095 / 32) + 1 = 130 blocks once the
  // window has passed the first window's 128 stored blocks, which it holds until then.
  auto c = SmallConfig(32, 300);
  c.attention_windows = {4096};
  c.sink_tokens = 4;
  c.dense_context = true;
  Fixture f(c);
  CHECK(f.m->reuse_enabled());  // kept: only the first window is stored, the same KV in every mode
  const uint32_t bound = f.m->MaxSequenceBlocks(0);
  CHECK(bound == 1 + 128 + 1 + 128);
  const uint32_t steady = 1 + 128 + 1;
  const SequenceId id = f.Add(Tokens(10, 1));
  REQUIRE(f.m->Allocate(id).ok());
  f.m->Commit(id, 10);
  uint32_t most = 0, most_steady = 0;
  for (uint32_t n = 10; n < 1'000'000; ++n) {
    const TokenId t = n;
    const bool appended = f.m->Append(id, std::span<const TokenId>(&t, 1)).ok();
    if (!appended) REQUIRE(appended);  // not a REQUIRE per token: a million of them is slow
    f.m->Commit(id, n + 1);
    const uint32_t in_use = f.m->Stats().pools[0].tiers[0].in_use;
    most = std::max(most, in_use);
    if (n > 2 * 4096) most_steady = std::max(most_steady, in_use);
  }
  CHECK(most <= bound);
  CHECK(most_steady == steady);
  const PoolView v = f.m->View(id, 0);
  CHECK(v.num_sink_blocks == 1);
  CHECK(v.linear.size() == (1'000'000 + 31) / 32);
  CHECK(v.linear[0] == v.blocks[0]);
  CHECK(v.linear[1] == kNoBlock);
  CHECK(f.m->SlotOf(id, 0, 3).has_value());  // sink token kept
  CHECK_FALSE(f.m->SlotOf(id, 0, 500'000).has_value());
  CHECK(f.m->SlotOf(id, 0, 999'999).has_value());
  // Position-shift RoPE: the sink keeps position 3, the newest token sits right after the window.
  CHECK(*f.m->CachePosition(id, 0, 3) == 3);
  CHECK(*f.m->CachePosition(id, 0, 999'999) < steady * 32);
  // Only the first window was stored for reuse: 128 blocks.
  size_t stored = 0;
  for (const KvEvent& e : f.m->Snapshot()) stored += std::get<StoredEvent>(e.data).blocks.size();
  CHECK(stored == 128);
  f.Check();
}

TEST_CASE("StreamingLLM's dense context phase keeps the whole prompt until it is computed") {
  for (const bool dense : {true, false}) {
    INFO("dense context " << dense);
    auto c = SmallConfig(4, 64);
    c.attention_windows = {8};
    c.sink_tokens = 4;
    c.dense_context = dense;
    Fixture f(c);
    const SequenceId id = f.Add(Tokens(40, 1));
    REQUIRE(f.m->Allocate(id).ok());
    // Chunked prefill of the 40-token prompt (10 blocks). A dense prompt query at n sees
    // [0, n]; a windowed one the sinks and [n - 7, n], so blocks wholly before n - 7 go.
    const uint32_t ends[] = {12, 24, 36};
    const size_t dense_blocks[] = {10, 10, 10}, windowed_blocks[] = {10, 7, 4};
    for (int i = 0; i < 3; ++i) {
      testing::WriteKv(*f.m, *f.mem, id, f.TokensOf(id), f.m->NumComputedTokens(id), ends[i]);
      f.m->Commit(id, ends[i]);
      f.Check();
      CHECK(f.m->View(id, 0).blocks.size() == (dense ? dense_blocks[i] : windowed_blocks[i]));
      CHECK(f.m->SlotOf(id, 0, 8).has_value() == (dense || i == 0));
    }
    testing::WriteKv(*f.m, *f.mem, id, f.TokensOf(id), 36, 40);
    f.m->Commit(id, 40);
    // Computed: the next query (position 40, generated) sees the sinks and [33, 40].
    const PoolView v = f.m->View(id, 0);
    CHECK(v.num_sink_blocks == 1);
    CHECK(v.first_window_block == 8);
    CHECK(v.blocks.size() == 3);  // block 0 and blocks 8, 9 (block 10 comes with token 40)
    CHECK(testing::FirstWrongKv(*f.m, *f.mem, id, f.TokensOf(id)) == -1);
    f.Release(id);
  }
}

TEST_CASE("with StreamingLLM sinks a request reuses the blocks of its first window, no further") {
  auto c = SmallConfig(4, 64);
  c.attention_windows = {8};
  c.sink_tokens = 4;
  c.dense_context = true;
  Fixture f(c);
  const SequenceId a = f.Add(Tokens(30, 1));
  f.Prefill(a);
  for (TokenId t = 0; t < 20; ++t) f.Decode(a, 100 + t);
  f.Check();
  f.Release(a);
  // Stored: blocks wholly inside the first window [0, 8): two blocks.
  const MatchInfo m = f.Request(Tokens(30, 1));
  CHECK(m.device_tokens == 8);
  CHECK(m.partial_tokens == 0);
  size_t stored = 0;
  for (const KvEvent& e : f.m->Snapshot()) stored += std::get<StoredEvent>(e.data).blocks.size();
  CHECK(stored == 2);
}

TEST_CASE("a sliding window frees blocks wholly outside it and maps kept tokens to slots") {
  auto c = SmallConfig(4, 64);
  c.attention_windows = {8};
  c.enable_block_reuse = false;
  Fixture f(c);
  const SequenceId id = f.Add(Tokens(4, 1));
  f.Prefill(id);
  for (TokenId t = 0; t < 16; ++t) f.Decode(id, 100 + t);
  // 20 tokens; the next query (position 20) sees 13..20: blocks 3 and 4 (+ the next one).
  const PoolView v = f.m->View(id, 0);
  CHECK(v.first_window_block == 3);
  CHECK(v.blocks.size() == 2);
  CHECK_FALSE(f.m->SlotOf(id, 0, 11).has_value());
  CHECK(*f.m->SlotOf(id, 0, 13) == uint64_t{v.blocks[0]} * 4 + 1);
  CHECK(*f.m->CachePosition(id, 0, 13) == 1);
  std::vector<int64_t> slots;
  f.m->SlotsOf(id, 0, 11, 14, &slots);
  CHECK(slots == std::vector<int64_t>{-1, int64_t{v.blocks[0]} * 4, int64_t{v.blocks[0]} * 4 + 1});
  CHECK(f.m->Stats().pools[0].tiers[0].in_use == 2);
  CHECK(testing::FirstWrongKv(*f.m, *f.mem, id, f.TokensOf(id)) == -1);
  f.Release(id);
}

TEST_CASE("a windowed pool reuses blocks within its first window") {
  auto c = SmallConfig(4, 64);
  c.attention_windows = {8};
  Fixture f(c);
  const SequenceId a = f.Add(Tokens(6, 1));
  f.Prefill(a);
  for (TokenId t = 0; t < 20; ++t) f.Decode(a, 100 + t);  // drops and later releases stored blocks
  f.Check();
  f.Release(a);
  const SequenceId b = f.Add(Tokens(6, 1));
  CHECK(f.m->Match(b).device_tokens == 4);
  f.Prefill(b);
  f.Release(b);
}

TEST_CASE("chunked attention exposes the blocks each chunk may see") {
  auto c = SmallConfig(4, 64);
  c.attention_chunk_size = 8;
  Fixture f(c);
  const SequenceId id = f.Add(Tokens(18, 1));
  f.Prefill(id);
  CHECK(f.m->ChunkBlocks(id, 0) == std::pair<uint32_t, uint32_t>{0, 2});
  CHECK(f.m->ChunkBlocks(id, 1) == std::pair<uint32_t, uint32_t>{2, 4});
  CHECK(f.m->ChunkBlocks(id, 2) == std::pair<uint32_t, uint32_t>{4, 5});
  CHECK(f.m->ChunkBlocks(id, 3) == std::pair<uint32_t, uint32_t>{0, 0});
  f.Release(id);
}

TEST_CASE("chunked attention frees the blocks no chunk can see any more") {
  auto c = SmallConfig(4, 64);
  c.attention_chunk_size = 8;
  Fixture f(c);
  const SequenceId id = f.Add(Tokens(6, 1));
  f.Prefill(id);
  size_t most = 0;
  for (TokenId t = 0; t < 40; ++t) {
    f.Decode(id, 100 + t);
    f.Check();
    most = std::max<size_t>(most, f.m->Stats().pools[0].tiers[0].in_use);
  }
  // 46 tokens; the next query (position 46) sees its chunk [40, 46]: logical blocks 10, 11.
  const PoolView v = f.m->View(id, 0);
  CHECK(v.first_window_block == 10);
  CHECK(v.blocks.size() == 2);
  CHECK_FALSE(f.m->SlotOf(id, 0, 39).has_value());
  CHECK(*f.m->SlotOf(id, 0, 41) == uint64_t{v.blocks[0]} * 4 + 1);
  CHECK(testing::FirstWrongKv(*f.m, *f.mem, id, f.TokensOf(id)) == -1);
  // Held at most: one chunk (2 blocks), the block a decode step opens, and the stored blocks
  // of the first chunk until the sequence has left it.
  CHECK(most <= 4);
  // The first chunk's blocks went back to the reuse tree: a new request finds them.
  CHECK(f.m->Stats().pools[0].tiers[0].cached == 2);
  const SequenceId again = f.Add(Tokens(6, 1));
  CHECK(f.m->Match(again).device_tokens == 4);
  f.Release(id);
}

// Llama 4: chunked attention bounds its RoPE layers only; the NoPE layers see every token.
TEST_CASE("chunked_layers: the chunked layers get a pool of their own, and only it drops blocks") {
  auto c = SmallConfig(4, 64);
  c.num_layers = 2;
  c.attention_chunk_size = 8;
  c.chunked_layers = {true, false};
  REQUIRE(c.Validate().ok());
  auto pools = ComputePools(c);
  REQUIRE(pools.ok());
  REQUIRE(pools->size() == 2);
  CHECK((*pools)[0].attention_chunk == 0);  // full attention sorts first
  CHECK((*pools)[0].layers == std::vector<uint32_t>{1});
  CHECK((*pools)[1].attention_chunk == 8);
  CHECK((*pools)[1].layers == std::vector<uint32_t>{0});
  Fixture f(c);
  const SequenceId id = f.Add(Tokens(6, 1));
  f.Prefill(id);
  for (TokenId t = 0; t < 40; ++t) f.Decode(id, 100 + t);
  f.Check();
  // Both pools are window 0: only the chunked one, which stores the shorter prefix (its first
  // chunk: 2 blocks), publishes events, so a router's index holds what a hit can reuse.
  size_t created = 0, stored_blocks = 0;
  for (const KvEvent& e : f.Flush()) {
    created += std::holds_alternative<CreatedEvent>(e.data);
    if (const auto* st = std::get_if<StoredEvent>(&e.data)) stored_blocks += st->blocks.size();
  }
  CHECK(created == 1);
  CHECK(stored_blocks == 2);
  CHECK(f.m->View(id, 1).first_window_block == 10);  // the chunk [40, 46]
  CHECK(f.m->View(id, 0).first_window_block == 0);   // all 46 tokens
  CHECK(f.m->View(id, 0).blocks.size() == 12);
  CHECK(f.m->SlotOf(id, 0, 0).has_value());
  CHECK_FALSE(f.m->SlotOf(id, 1, 39).has_value());
  f.Release(id);
  c.chunked_layers = {true};
  CHECK(c.Validate().message().find("chunked_layers has 1 entries for 2 layers") != std::string::npos);
}

TEST_CASE("a sliding window releases its stored blocks to the reuse tree once it has passed them") {
  auto c = SmallConfig(4, 64);
  c.attention_windows = {8};
  Fixture f(c);
  const SequenceId id = f.Add(Tokens(6, 1));
  f.Prefill(id);
  for (TokenId t = 0; t < 2; ++t) f.Decode(id, 100 + t);  // 8 tokens: blocks 0 and 1 stored
  CHECK(f.m->Stats().pools[0].tiers[0].cached == 0);      // both still held
  for (TokenId t = 2; t < 20; ++t) f.Decode(id, 100 + t);
  // The window [14, 22] has passed both stored blocks: released (cached, evictable) while
  // the sequence runs on.
  const TierStats dev = f.m->Stats().pools[0].tiers[0];
  CHECK(dev.cached == 2);
  CHECK(dev.in_use <= 3);
  CHECK(f.m->Evict(0, 2).size() == 2);
  f.Check();
  f.Release(id);
}

TEST_CASE("pools follow the (window, kv heads) pairs and mixed pools reuse together") {
  auto c = SmallConfig(4, 64);
  c.num_layers = 4;
  c.attention_windows = {16, 0};
  c.max_seq_len = 64;
  c.device_bytes = 4096;
  Fixture f(c);
  REQUIRE(f.m->pools().size() == 2);
  CHECK(f.m->pools()[0].window == 0);
  CHECK(f.m->pools()[1].window == 16);
  const auto prompt = Tokens(13, 1);
  f.Request(prompt);
  const SequenceId b = f.Add(prompt);
  CHECK(f.m->Match(b).device_tokens == 12);
  f.Prefill(b);
  f.Release(b);
}

}  // namespace
}  // namespace kvfleet::kv
