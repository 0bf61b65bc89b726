// The engine with requests of n > 1 (tests/worker/engine/engine_harness.h): the prompt
// prefilled once and forked, prompt logprobs sent once, per-sequence seeds, cancels, and what
// n counts against.
#include "worker/engine/engine.h"

#include <map>

#include <doctest/doctest.h>

#include "tests/worker/engine/engine_harness.h"

namespace kvfleet::engine {

using testing::Harness;
using testing::HarnessOptions;
using testing::Prompt;
using testing::kBlock;

namespace {

struct Choices {
  std::map<uint32_t, std::vector<TokenId>> tokens;
  std::map<uint32_t, RequestOutput> finals;
  int lasts = 0;
};

// Steps until the engine is idle, collecting request `id`'s outputs by index; returns the
// prompt tokens the steps computed.
uint64_t RunChoices(Harness& h, RequestId id, Choices* got, int max_steps = 10'000) {
  uint64_t prefill = 0;
  for (int i = 0; i < max_steps && h.engine->HasWork(); ++i) {
    for (const RequestOutput& o : h.engine->Step()) {
      REQUIRE(o.id == id);
      CHECK_FALSE(got->finals.contains(o.index));  // nothing after a sequence's final output
      auto& t = got->tokens[o.index];
      t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finish != FinishReason::kNone) got->finals[o.index] = o;
      got->lasts += o.last;
    }
    prefill += h.engine->last_step().prefill_tokens;
    Status st = h.engine->CheckInvariants();
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  REQUIRE_FALSE(h.engine->HasWork());
  return prefill;
}

RequestId AddN(Harness& h, uint32_t prompt_len, uint32_t n, uint32_t max_tokens, uint64_t seed = 7) {
  GenerateRequest r;
  r.prompt = Prompt(prompt_len);
  r.sampling.temperature = 0;
  r.sampling.seed = seed;
  r.sampling.max_tokens = max_tokens;
  r.sampling.n = n;
  auto id = h.engine->Add(std::move(r), h.clock.Now());
  REQUIRE_MESSAGE(id.ok(), id.status().ToString());
  return *id;
}

TEST_CASE("a request of n=3 prefills its prompt once; the forks recompute only its last partial block") {
  for (uint32_t len : {40u, 48u, 17u, 5u}) {
    CAPTURE(len);
    Harness h;
    RequestId id = AddN(h, len, 3, 6);
    Choices got;
    const uint64_t prefill = RunChoices(h, id, &got);
    // Sequence 0 computes the prompt; forks 1 and 2 match its full blocks and compute the
    // rest, a prefill chunk of their own. A prompt that ends on a block boundary had its last
    // block stored: a fork copies all but its last token (partial reuse) and computes that.
    const uint32_t tail = len % kBlock == 0 ? 1 : len % kBlock;
    CHECK(prefill == len + 2 * tail);
    if (len > kBlock) CHECK(prefill < 3ull * len);  // shorter: no full block to share
    REQUIRE(got.finals.size() == 3);
    CHECK(got.lasts == 1);
    for (uint32_t i = 0; i < 3; ++i) {
      CHECK(got.tokens[i].size() == 6);
      if (i > 0) CHECK(got.tokens[i] != got.tokens[0]);  // the mock's tokens hash the seed, seed + i here
      CHECK(got.finals[i].finish == FinishReason::kLength);
      CHECK(got.finals[i].usage.prompt_tokens == len);
      CHECK(got.finals[i].usage.completion_tokens == 6);
    }
    CHECK(h.DeviceBlocksInUse() == 0);
    CHECK(h.engine->counters().requests_finished == 1);
  }
}

TEST_CASE("n=3 with prompt logprobs: sequence 0 computes the prompt and sends them once; the forks still share it") {
  const uint32_t len = 40;
  Harness h;
  GenerateRequest r;
  r.prompt = Prompt(len);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 4;
  r.sampling.n = 3;
  r.sampling.logprobs = 0;
  r.sampling.prompt_logprobs = true;
  auto id = h.engine->Add(std::move(r), h.clock.Now());
  REQUIRE(id.ok());
  uint64_t prefill = 0;
  int with_prompt_logprobs = 0;
  for (int i = 0; i < 10'000 && h.engine->HasWork(); ++i) {
    for (const RequestOutput& o : h.engine->Step()) {
      if (o.prompt_logprobs.empty()) continue;
      ++with_prompt_logprobs;
      CHECK(o.index == 0);
      CHECK(o.prompt_logprobs.size() == len - 1);
    }
    prefill += h.engine->last_step().prefill_tokens;
  }
  REQUIRE_FALSE(h.engine->HasWork());
  CHECK(with_prompt_logprobs == 1);
  CHECK(prefill == len + 2 * (len % kBlock));  // as without prompt logprobs
}

TEST_CASE("sequence i of a request of n=4 gives the tokens of the same request with n=1 and seed + i") {
  // The mock's tokens hash the seed, the sampling counter and all the KV attention reads
  // (the forks' shared and recomputed blocks included).
  Harness h;
  RequestId id = AddN(h, 37, 4, 9, 100);
  Choices got;
  RunChoices(h, id, &got);
  REQUIRE(got.tokens.size() == 4);
  for (uint32_t i = 0; i < 4; ++i) {
    Harness alone;
    RequestId one = AddN(alone, 37, 1, 9, 100 + i);
    Choices ref;
    RunChoices(alone, one, &ref);
    CHECK(got.tokens[i] == ref.tokens[0]);
  }
}

TEST_CASE("cancel ends all n sequences; before the fork, the unforked ones end with sequence 0") {
  SUBCASE("after the fork") {
    Harness h;
    RequestId id = AddN(h, 40, 3, 50);
    for (int i = 0; i < 4; ++i) h.engine->Step();
    CHECK(h.engine->num_sequences() == 3);
    h.engine->Cancel(id);
    Choices got;
    RunChoices(h, id, &got);
    REQUIRE(got.finals.size() == 3);
    for (auto& [index, out] : got.finals) CHECK(out.finish == FinishReason::kCancelled);
    CHECK(got.lasts == 1);
    CHECK(h.DeviceBlocksInUse() == 0);
  }
  SUBCASE("before its prompt is computed") {
    HarnessOptions o;
    o.max_num_tokens = 16;  // a 40-token prompt takes three steps
    Harness h(o);
    RequestId id = AddN(h, 40, 3, 50);
    h.engine->Step();
    CHECK(h.engine->num_sequences() == 1);
    // The load report counts the forks to come: each will compute the last 8 prompt tokens.
    const LoadReport load = h.engine->Load();
    CHECK(load.queued_requests == 2);
    CHECK(load.active_prefill_tokens == (40 - 16) + 2 * 8);
    h.engine->Cancel(id);
    Choices got;
    RunChoices(h, id, &got);
    REQUIRE(got.finals.size() == 3);
    for (auto& [index, out] : got.finals) {
      CHECK(out.finish == FinishReason::kCancelled);
      CHECK(got.tokens[index].empty());
    }
    CHECK(got.lasts == 1);
    CHECK(h.DeviceBlocksInUse() == 0);
  }
}

TEST_CASE("n counts against the batch, the queue and the cache: what can never run together is refused") {
  HarnessOptions o;
  o.max_batch_size = 4;
  o.max_queued = 4;
  o.device_blocks = 20;
  Harness h(o);
  auto add = [&](uint32_t len, uint32_t n) {
    GenerateRequest r;
    r.prompt = Prompt(len);
    r.sampling.n = n;
    return h.engine->Add(std::move(r), h.clock.Now()).status();
  };
  CHECK(add(8, 0).code() == StatusCode::kInvalidArgument);
  Status batch = add(8, 5);
  CHECK(batch.code() == StatusCode::kInvalidArgument);
  CHECK(batch.message().find("n=5") != std::string::npos);
  // 200 tokens: 12 shared blocks + 4 x (13 - 12) = 16 <= 20 fit; 260 tokens: 16 + 4 x 1 = 20
  // fit; 300: 18 + 4 x 1 = 22 do not.
  CHECK(add(200, 4).ok());
  Status cache = add(300, 4);
  CHECK(cache.code() == StatusCode::kInvalidArgument);
  CHECK(cache.message().find("KV blocks") != std::string::npos);
  CHECK(add(8, 4).code() == StatusCode::kResourceExhausted);  // 1 waiting + 4 > 4
  CHECK(add(8, 3).ok());
  HarnessOptions two_queued;
  two_queued.max_queued = 2;
  Harness small_queue(two_queued);
  GenerateRequest three;
  three.prompt = Prompt(8);
  three.sampling.n = 3;  // can never be queued: invalid, not overloaded
  CHECK(small_queue.engine->Add(std::move(three), 0).status().code() == StatusCode::kInvalidArgument);
  for (int i = 0; i < 1000 && h.engine->HasWork(); ++i) h.engine->Step();
  CHECK_FALSE(h.engine->HasWork());
  CHECK(h.DeviceBlocksInUse() == 0);
}

}  // namespace
}  // namespace kvfleet::engine
