// The engine (tests/worker/engine/engine_harness.h): chunked prefill, preemption, cancels,
// limits, the prefix cache, the reported rates and predicted waits, stop conditions and bad
// requests. Requests of n > 1 are in engine_n_choices_test.cc.
#include "worker/engine/engine.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>

#include "tests/worker/engine/engine_harness.h"
#include "grammar/grammar.h"
#include "worker/model/model_config.h"

namespace kvfleet::engine {

using testing::Harness;
using testing::HarnessOptions;
using testing::Prompt;

namespace {

TEST_CASE("a long prompt is prefilled in chunks while a running request keeps decoding") {
  Harness h;  // 64 tokens per step
  RequestId a = h.Add(Prompt(20), 12);
  h.Step();  // a: whole prompt, first token
  REQUIRE(h.tokens[a].size() == 1);
  RequestId b = h.Add(Prompt(200, 5000), 4);  // joins without waiting for a to finish
  int steps_with_both = 0;
  while (h.tokens[b].empty()) {
    size_t before = h.tokens[a].size();
    h.Step();
    const StepReport& r = h.engine->last_step();
    CHECK(r.batch_tokens <= 64);
    if (!h.finals.contains(a)) {
      CHECK(h.tokens[a].size() == before + 1);  // a decodes in every step of b's prefill
      CHECK(r.decode_sequences == 1);
      CHECK(r.prefill_tokens == r.batch_tokens - 1);
      ++steps_with_both;
    }
  }
  // 200 tokens at 63 per step (one token of the budget goes to a's decode): 4 chunks.
  CHECK(steps_with_both == 4);
  h.RunToCompletion();
  CHECK(h.tokens[a].size() == 12);
  CHECK(h.finals[a].finish == FinishReason::kLength);
  CHECK(h.tokens[b].size() == 4);
}

TEST_CASE("preemption and recompute produce the same tokens as an uninterrupted run") {
  auto run = [](int64_t blocks, uint64_t* preemptions) {
    HarnessOptions o;
    o.device_blocks = blocks;
    o.max_num_tokens = 128;
    Harness h(o);
    std::vector<RequestId> ids;
    for (uint32_t i = 0; i < 6; ++i) ids.push_back(h.Add(Prompt(40 + 7 * i, 100 * i + 1), 60, 11 + i));
    h.RunToCompletion();
    *preemptions = h.engine->counters().preemptions;
    std::vector<std::vector<TokenId>> out;
    for (RequestId id : ids) {
      CHECK(h.finals[id].finish == FinishReason::kLength);
      CHECK(h.finals[id].usage.completion_tokens == 60);
      out.push_back(h.tokens[id]);
    }
    CHECK(h.DeviceBlocksInUse() == 0);
    return out;
  };
  uint64_t roomy_preemptions = 0, tight_preemptions = 0;
  auto roomy = run(256, &roomy_preemptions);
  auto tight = run(20, &tight_preemptions);  // 6 requests of up to 135 tokens: 9 blocks each
  CHECK(roomy_preemptions == 0);
  CHECK(tight_preemptions > 0);
  CHECK(tight == roomy);
}

TEST_CASE("the request with the lowest retention priority is preempted first, the newest on ties") {
  HarnessOptions o;
  o.device_blocks = 12;
  o.max_num_tokens = 256;
  Harness h(o);
  auto add = [&](uint8_t priority, TokenId first) {
    GenerateRequest r;
    r.prompt = Prompt(60, first);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 100;
    r.retention.decode_priority = priority;
    return *h.engine->Add(std::move(r), h.clock.Now());
  };
  RequestId high = add(80, 1);
  RequestId low_old = add(20, 1000);
  RequestId low_new = add(20, 2000);
  // 3 × 4 blocks fill the cache; the first decode block needed preempts someone.
  while (h.engine->counters().preemptions == 0) h.Step();
  const auto& waiting = h.engine->scheduler().waiting();
  REQUIRE(waiting.size() == 1);
  CHECK(waiting.front()->id == low_new);
  CHECK(waiting.front()->num_preemptions == 1);
  (void)high;
  (void)low_old;
  h.RunToCompletion();
  CHECK(h.tokens[low_new].size() == 100);
}

TEST_CASE("cancel frees the request's blocks in the next step") {
  Harness h;
  RequestId a = h.Add(Prompt(100), 50);
  for (int i = 0; i < 3; ++i) h.Step();
  CHECK(h.DeviceBlocksInUse() > 0);
  h.engine->Cancel(a);
  auto outs = h.Step();
  REQUIRE(h.finals.contains(a));
  CHECK(h.finals[a].finish == FinishReason::kCancelled);
  CHECK(h.DeviceBlocksInUse() == 0);
  CHECK_FALSE(h.engine->HasWork());
  h.engine->Cancel(a);  // unknown now: ignored
  CHECK_FALSE(h.engine->HasWork());
}

TEST_CASE("a held request waits while the ones behind it run, and starts once unheld") {
  Harness h;
  RequestId a = h.Add(Prompt(40), 3);
  RequestId b = h.Add(Prompt(40, 7000), 3);
  h.engine->Hold(a);
  CHECK(h.engine->num_held() == 1);
  h.Step();
  CHECK(h.tokens[a].empty());
  CHECK(h.tokens[b].size() == 1);  // admitted past the held one
  while (!h.finals.contains(b)) h.Step();
  CHECK_FALSE(h.engine->HasWork());  // only the held request is left: nothing to step
  h.engine->Unhold(a);
  CHECK(h.engine->HasWork());
  h.RunToCompletion();
  CHECK(h.tokens[a].size() == 3);
  h.engine->Hold(a);  // finished: ignored
  CHECK(h.engine->num_held() == 0);

  SUBCASE("a held request that is cancelled ends at the next step") {
    RequestId c = h.Add(Prompt(40, 9000), 3);
    h.engine->Hold(c);
    CHECK_FALSE(h.engine->HasWork());
    h.engine->Cancel(c);
    CHECK(h.engine->HasWork());
    h.Step();
    REQUIRE(h.finals.contains(c));
    CHECK(h.finals[c].finish == FinishReason::kCancelled);
    CHECK(h.engine->num_held() == 0);
    CHECK_FALSE(h.engine->HasWork());
  }
}

TEST_CASE("a prompt held for its pull keeps its arrival place among the prefills") {
  Harness h;  // a step computes at most 64 tokens
  h.Add(Prompt(40), 1);
  h.RunToCompletion();  // its first two blocks are now cached: "pulled" for the prompts below
  RequestId pulled = h.Add(Prompt(40), 3);
  h.engine->Hold(pulled);
  h.clock.Set(h.clock.Now() + kNsPerMs);
  RequestId later = h.Add(Prompt(400, 7000), 3);  // arrives during the pull
  h.Step();
  CHECK(h.tokens[later].empty());  // 64 of its 400 tokens prefilled
  h.engine->Unhold(pulled);
  h.Step();
  // Ahead of the prompt that came during its pull: its 8 uncached tokens, and its first token.
  // Behind it, the pulled prompt waited for all 400 tokens of the later one.
  CHECK(h.tokens[pulled].size() == 1);
  CHECK(h.tokens[later].empty());
  h.RunToCompletion();
  CHECK(h.tokens[later].size() == 3);

  SUBCASE("not ahead of a prompt that came before it") {
    RequestId earlier = h.Add(Prompt(400, 9000), 3);
    h.clock.Set(h.clock.Now() + kNsPerMs);
    RequestId held = h.Add(Prompt(40), 3);
    h.engine->Hold(held);
    h.Step();
    h.engine->Unhold(held);
    h.Step();
    CHECK(h.tokens[held].empty());  // the earlier prompt's chunk took the step's budget
    h.RunToCompletion();
    CHECK(h.tokens[held].size() == 3);
    CHECK(h.tokens[earlier].size() == 3);
  }
}

TEST_CASE("a prompt over the context limit is refused; generation stops at the limit") {
  HarnessOptions o;
  o.max_context = 64;
  Harness h(o);
  GenerateRequest r;
  r.prompt = Prompt(64);
  auto refused = h.engine->Add(r, h.clock.Now());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kOutOfRange);
  RequestId a = h.Add(Prompt(60), 100);
  h.RunToCompletion();
  CHECK(h.finals[a].finish == FinishReason::kLength);
  CHECK(h.tokens[a].size() == 4);  // 60 + 4 = the limit; never truncated, never past it
}

TEST_CASE("a repeated prompt is served from the cache: cached tokens reported, shorter time to first token") {
  HarnessOptions o;
  o.max_num_tokens = 512;
  Harness h(o);
  RequestId first = h.Add(Prompt(320), 3);
  h.RunToCompletion();
  RequestId second = h.Add(Prompt(320), 3);
  h.RunToCompletion();
  CHECK(h.finals[first].usage.cached_device_tokens == 0);
  CHECK(h.finals[second].usage.cached_device_tokens == 319);  // all but the last token
  CHECK(h.finals[second].usage.prompt_tokens == 320);
  CHECK(h.tokens[first] == h.tokens[second]);  // same seed, same context
  CHECK(h.finals[second].usage.time_to_first_token < h.finals[first].usage.time_to_first_token);
  CHECK(h.engine->counters().requests_finished == 2);
}

TEST_CASE("the reported prefill rate is the prefill capacity: steps with little prefill leave it alone") {
  HarnessOptions o;
  o.max_num_tokens = 64;
  Harness h(o);
  // Short prompts alone never fill half a step with prefill: the rate stays unknown (0), so
  // the router uses the fleet's rate rather than a figure that only says the worker is idle.
  h.Add(Prompt(8), 4);
  h.RunToCompletion();
  CHECK(h.engine->Load().prefill_tokens_per_second == 0);
  // A long prompt is prefilled in full 64-token chunks: those steps measure the rate.
  h.Add(Prompt(320, 5000), 2);
  h.RunToCompletion();
  const float capacity = h.engine->Load().prefill_tokens_per_second;
  CHECK(capacity > 0);
  // A short prompt beside decodes again: the capacity measured under load stands.
  h.Add(Prompt(320, 9000), 40);
  for (int i = 0; i < 8; ++i) h.Step();  // the long prompt is prefilled; decoding begins
  for (int i = 0; i < 16; ++i) {  // one short prompt per step, each step mostly decodes
    h.Add(Prompt(5, static_cast<TokenId>(20000 + 100 * i)), 4);
    h.Step();
  }
  h.RunToCompletion();
  CHECK(h.engine->Load().prefill_tokens_per_second > 0.5f * capacity);
}

// Measures the prefill rate on one long prompt, queues `n` prompts of `tokens` tokens (each
// generating `max_tokens`) and steps once. Checks that the predicted wait is the prefill queued
// at that rate, and that a 64-token newcomer's first token comes as predicted: the wait, then
// its own 64 tokens, within a step or two of the steps' rounding and the decodes beside them.
// Returns the load it checked.
LoadReport CheckWaitIsPrefillQueue(Harness& h, int n, uint32_t tokens, uint32_t max_tokens) {
  h.Add(Prompt(320, 5000), max_tokens);
  h.RunToCompletion();  // full prefill steps: the rate is measured
  const double rate = h.engine->Load().prefill_tokens_per_second;
  REQUIRE(rate > 0);
  for (int i = 0; i < n; ++i) h.Add(Prompt(tokens, static_cast<TokenId>(10000 + 1000 * i)), max_tokens);
  h.Step();
  const LoadReport load = h.engine->Load();
  CHECK(load.predicted_wait_us == doctest::Approx(1e6 * load.active_prefill_tokens / rate).epsilon(0.01));
  RequestId x = h.Add(Prompt(64, 30000), 1);
  h.RunToCompletion();
  const double predicted = load.predicted_wait_us / 1e6 + 64 / rate;
  const double actual = static_cast<double>(h.finals[x].usage.time_to_first_token) / kNsPerSec;
  CHECK(std::abs(actual - predicted) <= 2 * 64 / rate);
  return load;
}

TEST_CASE("the predicted wait says when a newcomer's prefill starts: behind a queue of prompts") {
  Harness h;  // 64 tokens per step; the manual clock moves by the mock's modelled step times
  CheckWaitIsPrefillQueue(h, 4, 256, 2);
}

TEST_CASE("the predicted wait says when a newcomer's prefill starts: behind a full batch") {
  HarnessOptions o;
  o.max_batch_size = 2;
  Harness h(o);
  h.Add(Prompt(8, 1000), 30);
  h.Add(Prompt(8, 2000), 60);
  for (int i = 0; i < 5; ++i) h.Step();
  // Nobody waits, but both slots are taken: the newcomer waits for the shorter to finish.
  const LoadReport load = h.engine->Load();
  CHECK(load.queued_requests == 0);
  REQUIRE(load.predicted_wait_us > 0);
  RequestId c = h.Add(Prompt(8, 3000), 1);
  h.RunToCompletion();
  const double actual = static_cast<double>(h.finals[c].usage.time_to_first_token) / kNsPerSec;
  const double step = load.predicted_wait_us / 1e6 / 25;  // 25 of the first request's 30 tokens remain
  CHECK(std::abs(actual - load.predicted_wait_us / 1e6) <= 2 * step);
  // With a slot free, no wait at all.
  CHECK(h.engine->Load().predicted_wait_us == 0);
}

TEST_CASE("the predicted wait counts a cache full of finished prompts' prefixes as room: a newcomer evicts them") {
  HarnessOptions o;
  o.device_blocks = 64;
  Harness h(o);
  // Finished prompts fill every block with prefixes kept for reuse, held by nobody (more than
  // fit: none is left on the free list).
  for (int i = 0; i < 10; ++i) h.Add(Prompt(testing::kBlock * 8 - 1, static_cast<TokenId>(1000 * (i + 1))), 1);
  h.RunToCompletion();
  // A long request decodes beside them, so a newcomer would have a finish to wait for.
  h.Add(Prompt(40, 50000), 200);
  for (int i = 0; i < 3; ++i) h.Step();
  const LoadReport load = h.engine->Load();
  REQUIRE(load.active_requests == 1);
  CHECK(load.free_blocks[0] == load.total_blocks[0] - 3);  // all but the decode's 3 blocks
  CHECK(load.predicted_wait_us == 0);
  h.Add(Prompt(testing::kBlock * 8, 60000), 1);
  h.Step();
  const LoadReport after = h.engine->Load();
  CHECK(after.active_requests == 2);  // admitted at once, evicting cached blocks
  CHECK(after.queued_requests == 0);
}

TEST_CASE("the predicted wait counts a queue of one-token prompts once: their slots free as their prefills end") {
  HarnessOptions o;  // a prefill worker's load: every request ends at its first token
  o.max_batch_size = 2;
  Harness h(o);
  // Its prefill queue is the whole wait: counting a step per blocked batch on top of it
  // predicted the newcomer several steps late.
  const LoadReport load = CheckWaitIsPrefillQueue(h, 8, 128, 1);
  CHECK(load.queued_requests >= 6);  // both slots taken, the rest waiting for them
}

TEST_CASE("a decode-role worker reports the short wait of a pulled prompt it admits ahead of its queue") {
  HarnessOptions o;
  o.max_batch_size = 4;
  o.max_step_over_decodes = 1.25;
  Harness h(o);
  for (int i = 0; i < 4; ++i) h.Add(Prompt(8, static_cast<TokenId>(1000 * (i + 1))), 50 * (i + 1));
  for (int i = 0; i < 3; ++i) h.Step();
  for (int i = 0; i < 2; ++i) h.Add(Prompt(300, static_cast<TokenId>(40000 + 1000 * i)), 50);
  h.Step();
  const LoadReport load = h.engine->Load();
  REQUIRE(load.active_requests == 4);  // the batch is full of decodes
  REQUIRE(load.queued_requests == 2);
  // In order, a newcomer waits for the third finish (two wait before it) and the prompts
  // ahead; admitted ahead, a pulled prompt waits for the first finish only.
  CHECK(load.pulled_wait_us > 0);
  CHECK(load.pulled_wait_us * 2 < load.predicted_wait_us);
}

TEST_CASE("stop conditions: EOS unless ignore_eos, stop token ids, max_tokens") {
  HarnessOptions o;
  o.eos_after = 3;  // the mock's third generated token is EOS
  Harness h(o);
  RequestId eos = h.Add(Prompt(10), 10);
  GenerateRequest r;
  r.prompt = Prompt(10);
  r.sampling.temperature = 0;
  r.sampling.seed = 7;
  r.sampling.max_tokens = 10;
  r.sampling.ignore_eos = true;
  RequestId ignore = *h.engine->Add(r, h.clock.Now());
  h.RunToCompletion();
  CHECK(h.finals[eos].finish == FinishReason::kStop);
  CHECK(h.tokens[eos].size() == 3);
  CHECK(h.finals[ignore].finish == FinishReason::kLength);
  CHECK(h.tokens[ignore].size() == 10);

  // A stop id: the second token of a known stream.
  Harness h2;
  RequestId probe = h2.Add(Prompt(10), 5);
  h2.RunToCompletion();
  GenerateRequest s;
  s.prompt = Prompt(10);
  s.sampling.temperature = 0;
  s.sampling.seed = 7;
  s.sampling.max_tokens = 5;
  s.sampling.stop_token_ids = {h2.tokens[probe][1]};
  RequestId stopped = *h2.engine->Add(s, h2.clock.Now());
  h2.RunToCompletion();
  CHECK(h2.finals[stopped].finish == FinishReason::kStop);
  CHECK(h2.tokens[stopped].size() == 2);
}

TEST_CASE("an eos id listed only in generation_config.json ends generation (Llama 3 Instruct's <|eot_id|>)") {
  // A probe finds the mock's third token; a model directory then lists it as
  // generation_config.json's second eos id, as Llama-3-8B-Instruct lists 128009.
  Harness probe_harness;
  RequestId probe = probe_harness.Add(Prompt(10), 5);
  probe_harness.RunToCompletion();
  const TokenId turn_end = probe_harness.tokens[probe][2];

  const auto dir = std::filesystem::temp_directory_path() / ("kvfleet-engine-eos-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
      "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "eos_token_id": 128001})";
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [128001, )" << turn_end << "]}";
  auto config = model::LoadModelConfig(dir.string());
  std::filesystem::remove_all(dir);
  REQUIRE_MESSAGE(config.ok(), config.status().ToString());

  HarnessOptions o;
  o.eos_token_ids.emplace(config->eos_token_ids.begin(), config->eos_token_ids.end());
  Harness h(o);
  RequestId id = h.Add(Prompt(10), 5);
  h.RunToCompletion();
  CHECK(h.finals[id].finish == FinishReason::kStop);
  CHECK(h.tokens[id].size() == 3);
  CHECK(h.tokens[id].back() == turn_end);
}

TEST_CASE("bad requests are refused with the code the wire error needs") {
  HarnessOptions o;
  o.max_queued = 2;
  Harness h(o);
  auto add = [&](auto edit) {
    GenerateRequest r;
    r.prompt = Prompt(8);
    edit(r);
    return h.engine->Add(std::move(r), h.clock.Now()).status().code();
  };
  CHECK(add([](GenerateRequest& r) { r.sampling.temperature = -1; }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.sampling.top_p = 0; }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.sampling.top_k = -2; }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.sampling.max_tokens = 0; }) == StatusCode::kInvalidArgument);
  // The router's bounds (schema/sampling.h): a worker once took repetition_penalty 200 and
  // temperature 5, which no router admits.
  CHECK(add([](GenerateRequest& r) { r.sampling.repetition_penalty = 200; }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.sampling.temperature = 5; }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.prompt.clear(); }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.prompt[0] = 1u << 30; }) == StatusCode::kInvalidArgument);
  CHECK(add([](GenerateRequest& r) { r.lora = "sql-adapter"; }) == StatusCode::kNotFound);  // serves no adapters
  CHECK(add([](GenerateRequest&) {}) == StatusCode::kOk);
  CHECK(add([](GenerateRequest&) {}) == StatusCode::kOk);
  CHECK(add([](GenerateRequest&) {}) == StatusCode::kResourceExhausted);  // two queued already
  h.RunToCompletion();
}

TEST_CASE("many requests with shared prefixes under pressure: every stream completes, blocks all return") {
  HarnessOptions o;
  o.device_blocks = 48;
  o.max_num_tokens = 96;
  o.max_batch_size = 8;
  Harness h(o);
  std::vector<RequestId> ids;
  for (uint32_t i = 0; i < 40; ++i) {
    std::vector<TokenId> p = Prompt(48);  // a shared 3-block system prompt
    for (uint32_t j = 0; j < 10 + i % 23; ++j) p.push_back(20000 + i * 50 + j);
    ids.push_back(h.Add(std::move(p), 5 + i % 17, i));
    if (i % 5 == 4) h.Step();  // arrivals between steps
  }
  h.RunToCompletion();
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(h.finals[ids[i]].finish == FinishReason::kLength);
    CHECK(h.tokens[ids[i]].size() == 5 + i % 17);
  }
  CHECK(h.DeviceBlocksInUse() == 0);
  CHECK(h.kv->Stats().reused_tokens > 0);
}

// ---- n sequences --------------------------------------------------------------------

// What a request of n sent: each index's tokens and final output, and how many outputs
// said `last`.

// Constrained decoding with the mask filled by the backend's call during the step (kvfleet
// issue 37): a complete document whose grammar then allows only the end token ends with stop
// one step after its last token; that step's draw (the end token) is dropped, so the text is
// the document alone, as when the mask was filled right after the token.
TEST_CASE("constrained decoding: a complete document ends with stop, without its end token, the step after") {
  constexpr TokenId kEos = 128001;
  HarnessOptions o;
  o.eos_token_ids = std::vector<TokenId>{kEos};
  for (const bool with_eos : {true, false}) {  // a vocabulary with the end token, and one with none
    INFO("end token in the vocabulary: " << with_eos);
    Harness h(o);
    std::vector<std::string> bytes(static_cast<size_t>(h.backend->config().vocab_size));
    for (int b = 0; b < 256; ++b) bytes[b] = std::string(1, static_cast<char>(b));
    const auto vocab = grammar::Vocabulary::FromTokenBytes(
        std::move(bytes), with_eos ? std::vector<int32_t>{static_cast<int32_t>(kEos)} : std::vector<int32_t>{});
    const std::string spec = R"(["yes","no","maybe"])";
    auto g = grammar::Compile({grammar::Kind::kChoice, spec}, vocab);
    REQUIRE(g.ok());
    GenerateRequest r;
    r.prompt = Prompt(20);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 5;
    r.sampling.max_tokens = 50;
    r.sampling.structured = {StructuredOutput::Kind::kChoice, spec};
    r.grammar = *g;
    auto id = h.engine->Add(std::move(r), h.clock.Now());
    REQUIRE(id.ok());
    h.RunToCompletion();
    const std::vector<TokenId>& t = h.tokens[*id];
    const std::string text(t.begin(), t.end());
    CHECK((text == "yes" || text == "no" || text == "maybe"));
    CHECK(h.finals[*id].finish == FinishReason::kStop);
    CHECK(h.finals[*id].usage.completion_tokens == t.size());
    // One mask per sampled row: each of the document's tokens, and the step whose draw was dropped.
    CHECK(h.engine->counters().masks_filled == t.size() + 1);
    CHECK(h.engine->counters().generated_tokens == t.size());
  }
}

}  // namespace
}  // namespace kvfleet::engine
