// A KV cache manager wired to a ManualClock and simulated KV memory.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "common/clock.h"
#include "tests/worker/kv/kv_test_util.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::kv::testing {

// n tokens that no other call with another `seed` shares.
inline std::vector<TokenId> Tokens(uint32_t n, uint32_t seed) {
  std::vector<TokenId> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = seed * 1'000'003u + i;
  return t;
}
inline std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Fixture {
  explicit Fixture(const KvCacheConfig& c, KvTestHooks hooks = {}) : config(c) {
    auto pools = ComputePools(c);
    REQUIRE(pools.ok());
    mem = std::make_unique<FakeKvMemory>(*pools, c.block_size);
    auto made = KvCacheManager::Make(c, mem.get(), &clock, hooks);
    REQUIRE(made.ok());
    m = std::move(made).value();
  }

  SequenceId Add(const std::vector<TokenId>& tokens, KvCacheRetentionConfig retention = {}) {
    SequenceSpec spec;
    spec.prompt = tokens;
    spec.model.assign(1, 'm');  // not = "m": GCC 12 raises a false -Wrestrict there
    spec.retention = std::move(retention);
    spec.lora = lora;
    auto id = m->AddSequence(std::move(spec));
    REQUIRE(id.ok());
    tokens_[*id] = tokens;
    return *id;
  }
  // Allocates, checks the reused KV is the sequence's own, computes the rest and commits.
  void Prefill(SequenceId id) {
    REQUIRE(m->CanAllocate(id));
    REQUIRE(m->Allocate(id).ok());
    CHECK(FirstWrongKv(*m, *mem, id, tokens_[id]) == -1);
    WriteKv(*m, *mem, id, tokens_[id], m->NumComputedTokens(id), m->NumTokens(id));
    m->Commit(id, m->NumTokens(id));
    Check();
  }
  // One decode step: the sampled token gets a slot, the pass writes its KV.
  void Decode(SequenceId id, TokenId t) {
    REQUIRE(m->CanAppend(id));
    REQUIRE(m->Append(id, std::span<const TokenId>(&t, 1)).ok());
    tokens_[id].push_back(t);
    WriteKv(*m, *mem, id, tokens_[id], m->NumTokens(id) - 1, m->NumTokens(id));
    m->Commit(id, m->NumTokens(id));
  }
  // A whole request: match, prefill, release. Returns what Match found.
  MatchInfo Request(const std::vector<TokenId>& tokens, KvCacheRetentionConfig retention = {}) {
    const SequenceId id = Add(tokens, std::move(retention));
    const MatchInfo info = m->Match(id);
    Prefill(id);
    Release(id);
    return info;
  }
  void Release(SequenceId id) {
    m->Release(id);
    tokens_.erase(id);
    Check();
  }
  void Check() {
    const Status st = m->CheckInvariants();
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  // The events since the last call, as the worker loop takes them once per step.
  std::vector<KvEvent> Flush() { return m->TakeEvents(); }
  const std::vector<TokenId>& TokensOf(SequenceId id) { return tokens_[id]; }

  KvCacheConfig config;
  std::string lora;  // the adapter of the sequences Add registers; empty: the base model
  ManualClock clock;
  std::unique_ptr<FakeKvMemory> mem;
  std::unique_ptr<KvCacheManager> m;
  std::map<SequenceId, std::vector<TokenId>> tokens_;
};

inline KvCacheRetentionConfig Retain(uint8_t priority, std::optional<DurationNs> duration = std::nullopt) {
  KvCacheRetentionConfig r;
  r.token_ranges.push_back({0, std::nullopt, priority, duration});
  r.decode_priority = priority;
  r.decode_duration = duration;
  return r;
}

}  // namespace kvfleet::kv::testing
