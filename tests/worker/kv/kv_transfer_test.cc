// KV transfer between workers, the KV cache manager's side (Contract 4): a holder pins and
// copies out a chain it holds by hash; a receiver allocates what it lacks, and stores the
// chain once its bytes are written, with the usual stored events.
#include <doctest/doctest.h>

#include <vector>

#include "common/block_hash.h"
#include "tests/worker/kv/kv_fixture.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::kv {
namespace {

using testing::Fixture;
using testing::SmallConfig;
using testing::Tokens;

constexpr uint32_t B = 4;

std::vector<BlockHash> Hashes(const std::vector<TokenId>& tokens) {
  return BlockHasher(B, HashNamespace{"m", "", ""}).HashAll(tokens);
}

SequenceSpec Spec(std::vector<TokenId> tokens) {
  SequenceSpec spec;
  spec.prompt = std::move(tokens);
  spec.model.assign(1, 'm');
  return spec;
}

std::vector<TokenId> Head(const std::vector<TokenId>& t, uint32_t blocks) {
  return {t.begin(), t.begin() + blocks * B};
}

// Copies the holder's bytes of `run` into the receiver's blocks of `plan`.
void CopyRun(Fixture& from, const std::vector<ExportedBlock>& run, Fixture& to, const ImportPlan& plan) {
  for (uint32_t j = plan.first_block; j < plan.num_blocks; ++j) {
    const BlockId dst = to.m->View(plan.seq, 0).linear[j];
    for (uint32_t o = 0; o < B; ++o) {
      to.mem->Device(0, uint64_t{dst} * B + o) = from.mem->Device(0, uint64_t{run[j].pools[0].block} * B + o);
    }
  }
}

// `prompt`'s first four blocks, computed at `h`, imported into `r` with their bytes copied:
// the plan, for the caller to store.
ImportPlan CopiedImport(Fixture& h, Fixture& r, const std::vector<TokenId>& prompt) {
  h.Request(prompt);
  auto run = h.m->ExportChain(0, Hashes(prompt), [](auto) { return Status{}; });
  REQUIRE(run.ok());
  auto plan = r.m->BeginImport(Spec(Head(prompt, 4)));
  REQUIRE(plan.ok());
  CopyRun(h, *run, r, *plan);
  return *plan;
}

TEST_CASE("a holder exports the leading run of a chain it holds, with each block's tokens and place") {
  Fixture h(SmallConfig(B, 16));
  const auto prompt = Tokens(4 * B + 2, 1);
  h.Request(prompt);
  const auto hashes = Hashes(prompt);
  REQUIRE(hashes.size() == 4);
  uint32_t copies = 0;
  auto run = h.m->ExportChain(0, hashes, [&](std::span<const ExportedBlock> blocks) {
    ++copies;
    CHECK(blocks.size() == 4);
    CHECK(h.m->Stats().pools[0].tiers[0].evictable == 0);  // pinned while copied
    return Status{};
  });
  REQUIRE(run.ok());
  CHECK(copies == 1);
  REQUIRE(run->size() == 4);
  for (uint32_t i = 0; i < 4; ++i) {
    CHECK((*run)[i].hash == hashes[i]);
    CHECK((*run)[i].tokens == std::vector<TokenId>(prompt.begin() + i * B, prompt.begin() + (i + 1) * B));
    CHECK((*run)[i].pools[0].tier == Tier::kDevice);
  }
  h.Check();
  CHECK(h.m->Stats().pools[0].tiers[0].evictable > 0);  // unpinned after the copy

  SUBCASE("from a parent: the rest of the chain") {
    auto tail = h.m->ExportChain(hashes[1], std::span(hashes).subspan(2), [](auto) { return Status{}; });
    REQUIRE(tail.ok());
    REQUIRE(tail->size() == 2);
    CHECK((*tail)[0].hash == hashes[2]);
  }
  SUBCASE("a block it does not hold ends the run; an unknown parent or first block gives none") {
    std::vector<BlockHash> asked = hashes;
    asked[2] ^= 1;
    auto part = h.m->ExportChain(0, asked, [](auto) { return Status{}; });
    REQUIRE(part.ok());
    CHECK(part->size() == 2);
    auto none = h.m->ExportChain(12345, std::span(hashes).subspan(1), [](auto) { return Status{}; });
    REQUIRE(none.ok());
    CHECK(none->empty());
    // A held block that is not the child of the named parent: not this chain.
    auto other = h.m->ExportChain(hashes[0], std::span(hashes).subspan(2), [](auto) { return Status{}; });
    REQUIRE(other.ok());
    CHECK(other->empty());
  }
  SUBCASE("a failed copy is returned and unpins the run") {
    auto failed = h.m->ExportChain(0, hashes, [](auto) { return Unavailable("peer gone"); });
    CHECK(failed.status().code() == StatusCode::kUnavailable);
    h.Check();
    CHECK(h.m->Evict(0, 16).size() == 4);
  }
}

TEST_CASE("a chain pinned for a same-host copy stays until each of its blocks is unpinned") {
  Fixture h(SmallConfig(B, 16));
  const auto prompt = Tokens(4 * B + 2, 1);
  h.Request(prompt);
  const auto hashes = Hashes(prompt);
  std::vector<ExportedBlock> run = h.m->PinChain(0, hashes);
  REQUIRE(run.size() == 4);
  CHECK(run[3].hash == hashes[3]);
  CHECK(run[3].tokens == std::vector<TokenId>(prompt.begin() + 3 * B, prompt.begin() + 4 * B));
  h.Check();
  CHECK(h.m->Evict(0, 16).empty());  // pinned across calls: nothing of it can leave
  h.m->UnpinChain(std::span(run).subspan(2));
  h.Check();
  // The tail is free again; the head still pinned (and a child's parent stays while pinned).
  CHECK(h.m->Evict(0, 16).size() == 2);
  auto head = h.m->ExportChain(0, hashes, [](auto) { return Status{}; });
  REQUIRE(head.ok());
  CHECK(head->size() == 2);
  h.m->UnpinChain(std::span(run).first(2));
  h.Check();
  CHECK(h.m->Evict(0, 16).size() == 2);
  CHECK(h.m->PinChain(0, hashes).empty());
}

TEST_CASE("a holder tells the run it holds from the run a live sequence of its own is still computing") {
  Fixture h(SmallConfig(B, 16));
  const auto prompt = Tokens(4 * B + 2, 1);
  const auto hashes = Hashes(prompt);
  h.Request(Head(prompt, 2));  // the first two blocks are stored
  CHECK(h.m->HeldRun(0, hashes) == 2);
  CHECK(h.m->LiveRun(0, hashes) == 0);  // nothing live
  const SequenceId id = h.Add(prompt);  // admitted, not yet prefilled
  CHECK(h.m->HeldRun(0, hashes) == 2);
  CHECK(h.m->LiveRun(0, hashes) == 4);
  // From a parent, and a chain that leaves the sequence's.
  CHECK(h.m->LiveRun(hashes[1], std::span(hashes).subspan(2)) == 2);
  std::vector<BlockHash> other = hashes;
  other[3] ^= 1;
  CHECK(h.m->LiveRun(0, other) == 3);
  CHECK(h.m->LiveRun(12345, std::span(hashes).subspan(1)) == 0);
  h.m->Match(id);
  h.Prefill(id);
  CHECK(h.m->HeldRun(0, hashes) == 4);  // stored by its prefill
  h.Release(id);
  CHECK(h.m->LiveRun(0, hashes) == 0);
  CHECK(h.m->HeldRun(0, hashes) == 4);
  h.Check();
}

TEST_CASE("a receiver imports a pulled chain: its blocks are stored, published and reused with the holder's KV") {
  Fixture h(SmallConfig(B, 16));
  Fixture r(SmallConfig(B, 16));
  const auto prompt = Tokens(5 * B + 1, 7);
  h.Request(prompt);
  const auto hashes = Hashes(prompt);
  auto run = h.m->ExportChain(0, std::span(hashes).first(4), [](auto) { return Status{}; });
  REQUIRE(run.ok());
  REQUIRE(run->size() == 4);
  h.Flush();

  auto plan = r.m->BeginImport(Spec(Head(prompt, 4)));
  REQUIRE(plan.ok());
  CHECK(plan->first_block == 0);
  CHECK(plan->num_blocks == 4);
  CopyRun(h, *run, r, *plan);
  r.m->EndImport(*plan, plan->num_blocks - plan->first_block);
  r.Check();
  std::vector<BlockHash> stored;
  for (const KvEvent& e : r.Flush()) {
    if (const auto* s = std::get_if<StoredEvent>(&e.data)) {
      for (const StoredBlock& b : s->blocks) stored.push_back(b.hash);
    }
  }
  CHECK(stored == std::vector<BlockHash>(hashes.begin(), hashes.begin() + 4));
  CHECK(r.m->Stats().pools[0].tiers[0].in_use == 0);  // cached, held by no one

  // The request itself now reuses the four blocks, and their KV is the holder's (Prefill
  // checks every reused slot).
  const MatchInfo m = r.Request(prompt);
  CHECK(m.device_tokens == 4 * B);

  SUBCASE("a second import of a chain it holds needs no bytes") {
    auto again = r.m->BeginImport(Spec(Head(prompt, 4)));
    REQUIRE(again.ok());
    CHECK(again->first_block == 4);
    r.m->EndImport(*again, 0);
    r.Check();
  }
}

TEST_CASE("a stored import stays referenced, out of eviction's reach, until it is released") {
  Fixture h(SmallConfig(B, 16));
  Fixture r(SmallConfig(B, 16));
  const auto prompt = Tokens(4 * B + 1, 9);
  const ImportPlan plan = CopiedImport(h, r, prompt);
  r.m->StoreImport(plan, plan.num_blocks - plan.first_block);
  r.Check();
  size_t stored = 0;
  for (const KvEvent& e : r.Flush()) {
    if (const auto* s = std::get_if<StoredEvent>(&e.data)) stored += s->blocks.size();
  }
  CHECK(stored == 4);  // every router learns of the chain at once
  CHECK(r.m->Stats().pools[0].tiers[0].evictable == 0);
  CHECK(r.m->live_imports() == 1);
  CHECK(r.m->Evict(0, 16).empty());
  const SequenceId probe = r.m->AddSequence(Spec(prompt)).value();
  CHECK(r.m->Match(probe).device_tokens == 4 * B);
  r.m->Release(probe);

  r.m->ReleaseImport(plan);
  r.Check();
  CHECK(r.m->live_imports() == 0);
  CHECK(r.m->Stats().pools[0].tiers[0].evictable >= 4);
  CHECK(r.m->Evict(0, 16).size() >= 4);
}

TEST_CASE("a receiver that holds the start of a chain imports only the rest") {
  Fixture h(SmallConfig(B, 16));
  Fixture r(SmallConfig(B, 16));
  const auto prompt = Tokens(4 * B + 1, 3);
  h.Request(prompt);
  r.Request(Head(prompt, 2));  // 2 blocks; the second is the one whose last token it computes
  const auto hashes = Hashes(prompt);
  auto plan = r.m->BeginImport(Spec(Head(prompt, 4)));
  REQUIRE(plan.ok());
  CHECK(plan->first_block == 2);
  auto run = h.m->ExportChain(0, hashes, [](auto) { return Status{}; });
  REQUIRE(run.ok());
  CopyRun(h, *run, r, *plan);
  r.m->EndImport(*plan, plan->num_blocks - plan->first_block);
  r.Check();
  CHECK(r.Request(prompt).device_tokens == 4 * B);
}

TEST_CASE("an import that got the first blocks of its chain stores those only") {
  Fixture h(SmallConfig(B, 16));
  Fixture r(SmallConfig(B, 16));
  const auto prompt = Tokens(4 * B + 1, 11);
  r.m->EndImport(CopiedImport(h, r, prompt), 2);
  r.Check();
  CHECK(r.Request(prompt).device_tokens == 2 * B);
}

TEST_CASE("an import whose bytes never came stores nothing, and bad imports are refused") {
  Fixture r(SmallConfig(B, 8));
  const auto prompt = Tokens(4 * B, 5);
  const uint32_t free_before = r.m->Stats().pools[0].tiers[0].free;
  auto plan = r.m->BeginImport(Spec(prompt));
  REQUIRE(plan.ok());
  r.Flush();
  r.m->EndImport(*plan, 0);
  r.Check();
  CHECK(r.Flush().empty());
  CHECK(r.m->Stats().pools[0].tiers[0].free == free_before);

  CHECK(r.m->BeginImport(Spec(Tokens(B + 1, 5))).status().code() == StatusCode::kInvalidArgument);
  // Every block held by a running sequence: no room.
  const SequenceId big = r.Add(Tokens(8 * B, 9));
  REQUIRE(r.m->Allocate(big).ok());
  CHECK(r.m->BeginImport(Spec(prompt)).status().code() == StatusCode::kResourceExhausted);
  r.Check();
}

}  // namespace
}  // namespace kvfleet::kv
