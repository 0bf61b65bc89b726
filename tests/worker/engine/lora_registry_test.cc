// LoRA adapters in the engine: the registry's slots (LRU among idle adapters), scheduling
// with adapters (mixed steps, no deadlock, no starvation, preemption), prefix reuse and
// events per adapter, and unloading. The mock backend stands in for the model: its tokens
// depend on the adapter's loraId, and verify_kv checks every block table.
#include "worker/engine/lora_registry.h"

#include <doctest/doctest.h>

#include <map>
#include <memory>

#include "common/block_hash.h"
#include "tests/worker/engine/engine_harness.h"
#include "worker/engine/engine.h"

namespace kvfleet::engine {
namespace {

std::shared_ptr<const model::LoraAdapter> Adapter(const std::string& name, int32_t rank = 8) {
  auto a = std::make_shared<model::LoraAdapter>();
  a->name = name;
  a->lora_id = LoraId(name);
  a->rank = rank;
  a->layers.resize(2);
  a->layers[0][0].a.assign(static_cast<size_t>(rank) * 4096, 0.5f);  // 128 KiB at rank 8: a load-time prior > 0
  return a;
}

testing::HarnessOptions LoraOptions(int32_t max_loras, int64_t device_blocks, uint32_t max_batch_size) {
  testing::HarnessOptions o;
  o.max_loras = max_loras;
  o.device_blocks = device_blocks;
  o.max_batch_size = max_batch_size;
  o.max_queued = 1024;
  o.eos_token_ids = std::vector<TokenId>{};  // generation ends at max_tokens
  o.max_lora_rank = 16;
  return o;
}

// The engine harness with adapter slots; requests name their adapter.
struct Harness : testing::Harness {
  explicit Harness(int32_t max_loras, int64_t device_blocks = 256, uint32_t max_batch_size = 16)
      : testing::Harness(LoraOptions(max_loras, device_blocks, max_batch_size)) {}

  // Requests by prompt length, tokens from `first` up.
  Result<RequestId> TryAdd(uint32_t prompt_len, uint32_t max_tokens, const std::string& lora, TokenId first = 1000) {
    return testing::Harness::TryAdd(testing::Prompt(prompt_len, first), max_tokens, 7, lora);
  }
  RequestId Add(uint32_t prompt_len, uint32_t max_tokens, const std::string& lora = "", TokenId first = 1000) {
    return testing::Harness::Add(testing::Prompt(prompt_len, first), max_tokens, 7, lora);
  }
  // Which adapter each running sequence uses, this step.
  std::map<std::string, int> Running() const {
    std::map<std::string, int> m;
    for (const Sequence* s : engine->scheduler().running()) ++m[s->request.lora];
    return m;
  }
};

TEST_CASE("slots go to idle adapters least recently used first; a held adapter keeps its slot") {
  Harness h(2);
  LoraRegistry r(h.backend.get(), &h.clock, 16);
  REQUIRE(r.num_slots() == 2);
  for (const char* name : {"a", "b", "c"}) REQUIRE(r.Add(Adapter(name)).ok());
  CHECK(r.load_us() > 0);  // the prior, before any load is measured
  REQUIRE(r.Acquire("a").value() == 0);
  REQUIRE(r.Acquire("b").value() == 1);
  CHECK_FALSE(r.CanAcquire("c"));  // both held
  CHECK(r.Acquire("a").value() == 0);  // resident: no load
  CHECK(r.counters().loads == 2);
  r.Release("b");
  REQUIRE(r.CanAcquire("c"));
  CHECK(r.Acquire("c").value() == 1);  // b was idle
  CHECK(r.counters().loads == 3);
  CHECK(r.Resident() == std::vector<uint64_t>{LoraId("a"), LoraId("c")});
  CHECK(r.CheckInvariants(3).ok());
  CHECK(r.Remove("a").code() == StatusCode::kFailedPrecondition);
  r.Release("a");
  r.Release("a");
  r.Release("c");
  // LRU: a was acquired before c, so b takes a's slot.
  CHECK(r.Acquire("b").value() == 0);
  r.Release("b");
  CHECK(r.Remove("c").ok());
  CHECK(r.Resident() == std::vector<uint64_t>{LoraId("b")});
  CHECK(r.CheckInvariants(0).ok());
}

TEST_CASE("the registry refuses duplicates, ranks above --max-lora-rank, and a backend without slots") {
  Harness h(1);
  LoraRegistry r(h.backend.get(), &h.clock, 16);
  REQUIRE(r.Add(Adapter("a")).ok());
  CHECK(r.Add(Adapter("a")).message().find("already loaded") != std::string::npos);
  CHECK(r.Add(Adapter("big", 32)).message().find("rank 32 is above --max-lora-rank 16") != std::string::npos);
  CHECK(r.Remove("zzz").code() == StatusCode::kNotFound);
  Harness none(0);
  LoraRegistry empty(none.backend.get(), &none.clock, 16);
  CHECK(empty.Add(Adapter("a")).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("base and adapter sequences share steps; tokens differ by adapter; unknown adapters are NotFound") {
  Harness h(2);
  REQUIRE(h.engine->AddLora(Adapter("a")).ok());
  REQUIRE(h.engine->AddLora(Adapter("b")).ok());
  CHECK(h.TryAdd(8, 4, "zzz").status().code() == StatusCode::kNotFound);
  const RequestId base = h.Add(20, 8), a = h.Add(20, 8, "a"), b = h.Add(20, 8, "b");
  h.Step();
  CHECK(h.Running() == std::map<std::string, int>{{"", 1}, {"a", 1}, {"b", 1}});
  h.RunToCompletion();
  CHECK(h.tokens[base].size() == 8);
  CHECK(h.tokens[base] != h.tokens[a]);
  CHECK(h.tokens[a] != h.tokens[b]);
  // The same adapter gives the same tokens again, and reuses its own blocks only.
  const RequestId a2 = h.Add(20, 8, "a");
  h.RunToCompletion();
  CHECK(h.tokens[a2] == h.tokens[a]);
  CHECK(h.finals[a2].usage.cached_device_tokens == 16);
  CHECK(h.finals[a].usage.cached_device_tokens == 0);  // the base model's blocks were not the adapter's
  CHECK(h.finals[b].usage.cached_device_tokens == 0);
  CHECK(h.stored_by_lora[0] > 0);
  CHECK(h.stored_by_lora[LoraId("a")] > 0);
  CHECK(h.stored_by_lora[LoraId("b")] > 0);
  CHECK(h.engine->Load().resident_loras.size() == 2);
}

TEST_CASE("with one slot, a second adapter waits for the first's sequences, and base requests pass it") {
  Harness h(1);
  REQUIRE(h.engine->AddLora(Adapter("a")).ok());
  REQUIRE(h.engine->AddLora(Adapter("b")).ok());
  const RequestId a = h.Add(8, 30, "a");
  h.Step();
  const RequestId b = h.Add(8, 4, "b");
  const RequestId a_later = h.Add(8, 4, "a", 3000);  // behind b: waits for b, or b would starve
  const RequestId base = h.Add(8, 4);
  int steps = 0;
  while (!h.finals.contains(base)) {
    h.Step();
    ++steps;
    CHECK(h.Running().count("b") == 0);  // a holds the only slot
    CHECK(h.Running().count("a") + h.Running().count("b") <= 1);
  }
  CHECK(steps <= 6);  // the base request did not wait for a's 30 tokens
  CHECK_FALSE(h.finals.contains(a));
  CHECK(h.tokens[a_later].empty());
  h.RunToCompletion();
  CHECK(h.finals[b].finish == FinishReason::kLength);
  CHECK(h.finals[a_later].finish == FinishReason::kLength);
  CHECK(h.engine->loras().counters().loads == 3);  // a, b, a again
}

TEST_CASE("an adapter is not starved by a stream of requests for the resident one") {
  Harness h(1);
  REQUIRE(h.engine->AddLora(Adapter("a")).ok());
  REQUIRE(h.engine->AddLora(Adapter("b")).ok());
  h.Add(8, 6, "a");
  h.Step();
  const RequestId b = h.Add(8, 3, "b");
  for (int i = 0; i < 60 && !h.finals.contains(b); ++i) {
    h.Add(8, 6, "a", 2000 + 10 * i);  // a new "a" request every step
    h.Step();
  }
  CHECK(h.finals.contains(b));
  h.RunToCompletion();
}

TEST_CASE("preempted adapter sequences give their slot back and finish with the same tokens") {
  // 10 blocks of 16: four 40-token requests (3 blocks each, growing) cannot all run.
  Harness h(2, 10, 4);
  REQUIRE(h.engine->AddLora(Adapter("a")).ok());
  REQUIRE(h.engine->AddLora(Adapter("b")).ok());
  std::vector<RequestId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(h.Add(20, 30, i % 2 ? "a" : "b", static_cast<TokenId>(1000 + 100 * i)));
  h.RunToCompletion();
  CHECK(h.engine->counters().preemptions > 0);
  // Alone, each gives the same tokens.
  Harness solo(2);
  REQUIRE(solo.engine->AddLora(Adapter("a")).ok());
  REQUIRE(solo.engine->AddLora(Adapter("b")).ok());
  for (int i = 0; i < 4; ++i) {
    const RequestId id = solo.Add(20, 30, i % 2 ? "a" : "b", static_cast<TokenId>(1000 + 100 * i));
    solo.RunToCompletion();
    CHECK(solo.tokens[id] == h.tokens[ids[i]]);
  }
}

TEST_CASE("an adapter in use cannot be unloaded; once its requests finish it can, and is then unknown") {
  Harness h(1);
  REQUIRE(h.engine->AddLora(Adapter("a")).ok());
  h.Add(8, 4, "a");
  h.Add(8, 4, "a", 2000);
  const Status busy = h.engine->RemoveLora("a");
  CHECK(busy.code() == StatusCode::kFailedPrecondition);
  CHECK(busy.message().find("in use by 2 waiting or running sequences") != std::string::npos);
  h.RunToCompletion();
  REQUIRE(h.engine->RemoveLora("a").ok());
  CHECK(h.engine->Load().resident_loras.empty());
  CHECK(h.TryAdd(8, 4, "a").status().code() == StatusCode::kNotFound);
  CHECK(h.engine->RemoveLora("a").code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvfleet::engine
