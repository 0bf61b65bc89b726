// Property test: random operations against the KV cache manager, checked after every one
// against invariants, simulated KV memory, and a simple model of the cache rebuilt from the
// emitted events.
//
//   KVFLEET_KV_PROPERTY_OPS=1000000 KVFLEET_KV_PROPERTY_SEED=7 ./kv_property_test
#include <doctest/doctest.h>

#include <cstdlib>
#include <random>

#include "tests/worker/kv/kv_fixture.h"

namespace kvfleet::kv {
namespace {

using testing::EventIndex;
using testing::Fixture;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

// The model's answer to Match: the longest chain of indexed blocks whose hashes, parents
// and tokens agree with the prompt, then the longest run shared with a child.
MatchInfo ModelMatch(const EventIndex& index, const std::vector<TokenId>& tokens, const KvCacheManager& m,
                     bool partial_reuse, KvTestHooks hooks) {
  const uint32_t B = m.block_size();
  auto hashes = BlockHasher(B, HashNamespace{"m", "", ""}).HashAll(tokens);
  if (hooks.hash_override != nullptr) {
    for (auto& h : hashes) h = hooks.hash_override(h);
  }
  const uint32_t max_full = (static_cast<uint32_t>(tokens.size()) - 1) / B;
  uint32_t full = max_full;
  uint32_t device_full = max_full;
  for (const PoolLayout& pool : m.pools()) {
    BlockHash parent = 0;
    uint32_t i = 0;
    uint32_t dev = 0;
    bool on_device = true;
    for (; i < max_full; ++i) {
      auto it = index.entries.find({pool.window, hashes[i]});
      if (it == index.entries.end() || it->second.parent != parent ||
          !std::equal(tokens.begin() + i * B, tokens.begin() + (i + 1) * B, it->second.tokens.begin())) {
        break;
      }
      on_device = on_device && it->second.tier == Tier::kDevice;
      dev += on_device;
      parent = hashes[i];
    }
    full = std::min(full, i);
    device_full = std::min(device_full, dev);
  }
  device_full = std::min(device_full, full);
  MatchInfo info{device_full * B, (full - device_full) * B, 0};
  const uint32_t want_end = std::min<uint32_t>(static_cast<uint32_t>(tokens.size()) - 1, (full + 1) * B);
  if (!partial_reuse || want_end <= full * B) return info;
  uint32_t partial = want_end - full * B;
  for (const PoolLayout& pool : m.pools()) {
    const BlockHash parent = full == 0 ? 0 : hashes[full - 1];
    uint32_t best = 0;
    for (const auto& [key, e] : index.entries) {
      if (key.first != pool.window || e.parent != parent) continue;
      if (full == 0 && e.parent != 0) continue;
      uint32_t k = 0;
      while (full * B + k < want_end && e.tokens[k] == tokens[full * B + k]) ++k;
      best = std::max(best, k);
    }
    partial = std::min(partial, best);
  }
  info.partial_tokens = partial;
  return info;
}

void RunProperty(KvCacheConfig config, uint64_t ops, uint64_t seed, KvTestHooks hooks = {}, uint32_t prefix_seed = 50) {
  config.event_buffer_max_size = 1u << 22;
  config.partial_reuse_max_candidates = UINT32_MAX;  // the model scans every child
  Fixture f(config, hooks);
  EventIndex replayed;
  REQUIRE(replayed.ApplyAll(f.Flush()) == "");
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const uint32_t B = config.block_size;
  // A few shared prefixes and a small alphabet make full and partial matches common.
  std::vector<std::vector<TokenId>> prefixes;
  for (int p = 0; p < 4; ++p) prefixes.push_back(testing::Tokens(3 * B, prefix_seed + p));
  std::vector<SequenceId> live;
  uint64_t allocations = 0;
  uint64_t refused = 0;

  for (uint64_t op = 0; op < ops; ++op) {
    const uint64_t kind = pick(100);
    if (kind < 22 && live.size() < 10) {  // add, match, allocate
      const auto& prefix = prefixes[pick(prefixes.size())];
      std::vector<TokenId> prompt(prefix.begin(), prefix.begin() + static_cast<ptrdiff_t>(pick(3 * B + 1)));
      const uint64_t extra = 1 + pick(4 * B);
      for (uint64_t i = 0; i < extra; ++i) prompt.push_back(static_cast<TokenId>(pick(3)));
      static constexpr uint8_t kPriorities[] = {0, 10, 35, 60, 100};
      KvCacheRetentionConfig r;
      r.token_ranges.push_back({0, static_cast<uint32_t>(1 + pick(prompt.size())), kPriorities[pick(5)],
                                pick(2) ? std::optional<DurationNs>(kNsPerSec * (1 + pick(5))) : std::nullopt});
      r.decode_priority = kPriorities[pick(5)];
      live.push_back(f.Add(prompt, r));
    } else if (kind < 40 && !live.empty()) {  // match + allocate a waiting sequence
      const SequenceId id = live[pick(live.size())];
      if (f.m->IsAllocated(id)) continue;
      const MatchInfo got = f.m->Match(id);
      const MatchInfo want = ModelMatch(replayed, f.TokensOf(id), *f.m, config.enable_partial_reuse, hooks);
      INFO("op ", op, ": got ", got.device_tokens, "/", got.host_tokens, "/", got.partial_tokens, " want ",
           want.device_tokens, "/", want.host_tokens, "/", want.partial_tokens, " tokens ", f.TokensOf(id).size());
      REQUIRE(got.device_tokens == want.device_tokens);
      REQUIRE(got.host_tokens == want.host_tokens);
      REQUIRE(got.partial_tokens == want.partial_tokens);
      if (f.m->CanAllocate(id)) {
        REQUIRE(f.m->Allocate(id).ok());
        REQUIRE(f.m->NumComputedTokens(id) == got.cached_tokens());
        ++allocations;
      } else {
        REQUIRE(f.m->Allocate(id).code() == StatusCode::kResourceExhausted);
        ++refused;
      }
    } else if (kind < 62 && !live.empty()) {  // a forward pass over part of the pending tokens
      const SequenceId id = live[pick(live.size())];
      if (!f.m->IsAllocated(id) || f.m->NumComputedTokens(id) == f.m->NumTokens(id)) continue;
      const uint32_t from = f.m->NumComputedTokens(id);
      const uint32_t to = from + 1 + static_cast<uint32_t>(pick(f.m->NumTokens(id) - from));
      testing::WriteKv(*f.m, *f.mem, id, f.TokensOf(id), from, to);
      f.m->Commit(id, to);
    } else if (kind < 77 && !live.empty()) {  // sampled tokens
      const SequenceId id = live[pick(live.size())];
      if (!f.m->IsAllocated(id) || f.m->NumComputedTokens(id) != f.m->NumTokens(id)) continue;
      const uint32_t n = 1 + static_cast<uint32_t>(pick(3));
      std::vector<TokenId> add;
      for (uint32_t i = 0; i < n; ++i) add.push_back(static_cast<TokenId>(pick(3)));
      if (f.m->CanAppend(id, n)) {
        REQUIRE(f.m->Append(id, add).ok());
        auto& tokens = const_cast<std::vector<TokenId>&>(f.TokensOf(id));
        tokens.insert(tokens.end(), add.begin(), add.end());
      } else {
        REQUIRE(f.m->Append(id, add).code() == StatusCode::kResourceExhausted);
      }
    } else if (kind < 86 && !live.empty()) {  // finish or cancel
      const size_t i = pick(live.size());
      f.m->Release(live[i]);
      live.erase(live.begin() + static_cast<ptrdiff_t>(i));
    } else if (kind < 90 && !live.empty()) {  // preemption
      f.m->Preempt(live[pick(live.size())]);
    } else if (kind < 96) {  // eviction (offloads when priorities allow)
      const uint32_t n = static_cast<uint32_t>(pick(5));
      const auto evicted = f.m->Evict(static_cast<uint32_t>(pick(f.m->pools().size())), n);
      REQUIRE(evicted.size() <= n);
    } else {
      f.clock.Advance(static_cast<DurationNs>(pick(3 * kNsPerSec)));
    }

    const Status st = f.m->CheckInvariants();
    REQUIRE_MESSAGE(st.ok(), "op ", op, ": ", st.ToString());
    const std::string order = replayed.ApplyAll(f.Flush());
    REQUIRE_MESSAGE(order.empty(), "op ", op, ": ", order);
    for (const SequenceId id : live) {
      if (f.m->IsAllocated(id)) REQUIRE(testing::FirstWrongKv(*f.m, *f.mem, id, f.TokensOf(id)) == -1);
    }
    if (op % 1000 == 999 || op + 1 == ops) {
      EventIndex from_snapshot;
      REQUIRE(from_snapshot.ApplyAll(f.m->Snapshot()) == "");
      REQUIRE(replayed.entries == from_snapshot.entries);
    }
  }
  const KvStats stats = f.m->Stats();
  MESSAGE("allocations ", allocations, ", refused ", refused, ", hit rate ", stats.hit_rate(), ", offloads ",
          stats.pools[0].offloads, ", onboards ", stats.pools[0].onboards, ", partial copies ",
          stats.pools[0].partial_copies);
  CHECK(allocations > ops / 20);
  if (hooks.hash_override == nullptr) {
    CHECK(stats.pools[0].onboards > 0);
    // A one-token block matches whole or not at all: B = 1 never copies part of one.
    if (config.block_size > 1) CHECK(stats.pools[0].partial_copies > 0);
    else CHECK(stats.pools[0].partial_copies == 0);
  }
}

TEST_CASE("100,000 random operations keep every invariant, the right KV and replayable events") {
  auto c = testing::SmallConfig(4, 48, 24);
  RunProperty(c, EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000), EnvOr("KVFLEET_KV_PROPERTY_SEED", 1));
}

TEST_CASE("random operations on token-level KV (B = 1), its events per token") {
  // Routing groups of one token, so the replayed events describe the whole tree and the
  // model can match against them (token_kv_test.cc checks 16-token groups).
  auto c = testing::SmallConfig(1, 96, 48);
  c.routing_block_size = 1;
  RunProperty(c, EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000) / 4, EnvOr("KVFLEET_KV_PROPERTY_SEED", 1) + 6);
}

TEST_CASE("random operations on a model with a sliding-window pool and a full pool") {
  auto c = testing::SmallConfig(4, 48, 24);
  c.num_layers = 2;
  c.attention_windows = {12, 0};
  c.max_seq_len = 64;
  c.device_bytes = 2 * 150 * 8;
  c.host_bytes = 2 * 24 * 8;
  RunProperty(c, EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000) / 4, EnvOr("KVFLEET_KV_PROPERTY_SEED", 1) + 1);
}

TEST_CASE("random operations with colliding hashes never hand out wrong KV") {
  // 61 distinct hashes for every block there is: collisions on almost every store.
  KvTestHooks hooks;
  hooks.hash_override = [](BlockHash h) { return h % 61 + 1; };
  RunProperty(testing::SmallConfig(4, 48, 24), EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000) / 4,
              EnvOr("KVFLEET_KV_PROPERTY_SEED", 1) + 2, hooks);
}

TEST_CASE("random operations with 26-bit packed tokens, some outside the vocabulary") {
  // Tokens are stored in 26 bits; prefixes 0 and 1 fit, prefixes 2 and 3 (ids >= 2^26) do
  // not, so their blocks are never stored and never matched.
  auto c = testing::SmallConfig(4, 48, 24);
  c.vocab_size = 1u << 26;
  RunProperty(c, EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000) / 4, EnvOr("KVFLEET_KV_PROPERTY_SEED", 1) + 3, {}, 66);
}

TEST_CASE("random operations with chunked attention") {
  auto c = testing::SmallConfig(4, 48, 24);
  c.attention_chunk_size = 8;
  RunProperty(c, EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000) / 4, EnvOr("KVFLEET_KV_PROPERTY_SEED", 1) + 5);
}

TEST_CASE("random operations across the 32-bit LRU use counter wrapping") {
  KvTestHooks hooks;
  hooks.first_lru_tick = UINT32_MAX - 5'000;
  RunProperty(testing::SmallConfig(4, 48, 24), EnvOr("KVFLEET_KV_PROPERTY_OPS", 100'000) / 4,
              EnvOr("KVFLEET_KV_PROPERTY_SEED", 1) + 4, hooks);
}

}  // namespace
}  // namespace kvfleet::kv
