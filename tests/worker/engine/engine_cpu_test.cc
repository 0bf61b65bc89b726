// The engine on the real cpu backend (make-model's `tiny`, fp32 math): greedy outputs must
// not depend on how the engine ran a request — chunked, batched with others, preempted and
// recomputed, or served from the reuse tree.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/backend/kv_setup.h"
#include "worker/engine/engine.h"
#include "worker/engine/structured_output.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::engine {

using backend::CheckPoolsAgree;
using backend::KvCacheConfigFor;
using backend::KvMemoryOf;

namespace {

struct CpuEngine {
  CpuEngine(int64_t blocks, uint32_t max_num_tokens, uint32_t max_batch, const std::string& shape = "tiny",
            uint64_t seed = 1, backend::AttentionOptions attention = {}) {
    backend::BackendOptions bo;
    bo.attention = attention;
    bo.model_dir = testing::RandomModelDir(shape, seed);
    bo.block_size = 16;
    bo.max_num_tokens = static_cast<int32_t>(max_num_tokens);
    bo.max_batch_size = static_cast<int32_t>(max_batch);
    bo.max_context = 1024;
    bo.num_blocks = blocks;
    bo.threads = 2;
    auto b = backend::CreateBackend("cpu", bo);
    REQUIRE_MESSAGE(b.ok(), b.status().ToString());
    backend = std::move(*b);
    auto k = kv::KvCacheManager::Make(KvCacheConfigFor(backend->config(), KvMemoryOf(*backend), attention),
                                      &backend->block_copier(), SystemClock::Default());
    REQUIRE_MESSAGE(k.ok(), k.status().ToString());
    kv = std::move(*k);
    REQUIRE(CheckPoolsAgree(kv->pools(), backend->pools()).ok());
    EngineOptions eo;
    eo.model_name = "tiny";
    eo.scheduler.max_num_tokens = max_num_tokens;
    eo.scheduler.max_batch_size = max_batch;
    eo.limits.max_context = 1024;
    eo.limits.vocab_size = static_cast<uint32_t>(backend->config().vocab_size);
    engine = std::make_unique<Engine>(eo, backend.get(), kv.get(), SystemClock::Default());
  }

  std::vector<std::vector<TokenId>> Run(const std::vector<std::vector<TokenId>>& prompts, uint32_t max_tokens) {
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      GenerateRequest r;
      r.prompt = p;
      r.sampling.temperature = 0;
      r.sampling.max_tokens = max_tokens;
      r.sampling.ignore_eos = true;
      auto id = engine->Add(std::move(r), 0);
      REQUIRE(id.ok());
      ids.push_back(*id);
    }
    std::map<RequestId, std::vector<TokenId>> got;
    for (int i = 0; i < 5000 && engine->HasWork(); ++i) {
      for (const RequestOutput& o : engine->Step()) {
        got[o.id].insert(got[o.id].end(), o.new_tokens.begin(), o.new_tokens.end());
        if (o.finish != FinishReason::kNone) usage[o.id] = o.usage;
      }
      Status st = engine->CheckInvariants();
      REQUIRE_MESSAGE(st.ok(), st.ToString());
    }
    REQUIRE_FALSE(engine->HasWork());
    std::vector<std::vector<TokenId>> out;
    for (RequestId id : ids) out.push_back(got[id]);
    last_ids = ids;
    return out;
  }

  // Every output of each request, concatenated: tokens, logprobs and prompt logprobs.
  struct Answer {
    std::vector<TokenId> tokens;
    std::vector<backend::TokenLogprobs> logprobs, prompt_logprobs;
    int outputs_with_prompt_logprobs = 0;
  };
  std::vector<Answer> RunWith(const std::vector<std::vector<TokenId>>& prompts, const SamplingParams& sampling) {
    std::vector<RequestId> ids;
    for (const auto& p : prompts) {
      GenerateRequest r;
      r.prompt = p;
      r.sampling = sampling;
      auto id = engine->Add(std::move(r), 0);
      REQUIRE_MESSAGE(id.ok(), id.status().ToString());
      ids.push_back(*id);
    }
    std::map<RequestId, Answer> got;
    for (int i = 0; i < 5000 && engine->HasWork(); ++i) {
      for (const RequestOutput& o : engine->Step()) {
        Answer& a = got[o.id];
        a.tokens.insert(a.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
        a.logprobs.insert(a.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
        if (!o.prompt_logprobs.empty()) {
          a.prompt_logprobs = o.prompt_logprobs;
          ++a.outputs_with_prompt_logprobs;
        }
        if (o.finish != FinishReason::kNone) usage[o.id] = o.usage;
      }
      Status st = engine->CheckInvariants();
      REQUIRE_MESSAGE(st.ok(), st.ToString());
    }
    REQUIRE_FALSE(engine->HasWork());
    std::vector<Answer> out;
    for (RequestId id : ids) out.push_back(got[id]);
    last_ids = ids;
    return out;
  }

  std::unique_ptr<backend::ModelBackend> backend;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<Engine> engine;
  std::map<RequestId, Usage> usage;
  std::vector<RequestId> last_ids;
};

std::vector<std::vector<TokenId>> Prompts() {
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t s = 0; s < 4; ++s) {
    std::vector<TokenId> p;
    for (uint32_t i = 0; i < 30 + 13 * s; ++i) p.push_back((s * 7919 + i * 104729) % 30000 + 100);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

TEST_CASE("cpu backend: greedy tokens are the same alone, batched and chunked, and after preemption") {
  const auto prompts = Prompts();
  // Reference: each request alone, whole prompt in one step.
  std::vector<std::vector<TokenId>> alone;
  {
    CpuEngine e(256, 256, 1);
    for (const auto& p : prompts) alone.push_back(e.Run({p}, 24)[0]);
  }
  SUBCASE("batched, with 32-token chunks") {
    CpuEngine e(256, 32, 8);
    CHECK(e.Run(prompts, 24) == alone);
  }
  SUBCASE("a cache too small for all four: preemption and recompute") {
    CpuEngine e(12, 64, 8);  // the four need 4 + 4 + 5 + 6 blocks at the end
    CHECK(e.Run(prompts, 24) == alone);
    CHECK(e.engine->counters().preemptions > 0);
  }
}

TEST_CASE("cpu backend: a prompt served from the reuse tree gives the same tokens") {
  const auto prompts = Prompts();
  CpuEngine e(256, 256, 8);
  auto first = e.Run({prompts[3]}, 16);
  auto second = e.Run({prompts[3]}, 16);
  CHECK(second == first);
  CHECK(e.usage[e.last_ids[0]].cached_device_tokens > 0);
}

// A request of n on `e`: each index's tokens.
std::vector<std::vector<TokenId>> RunN(CpuEngine& e, const std::vector<TokenId>& prompt, uint32_t n, float temperature,
                                       std::optional<uint64_t> seed, uint32_t max_tokens) {
  GenerateRequest r;
  r.prompt = prompt;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.n = n;
  auto id = e.engine->Add(std::move(r), 0);
  REQUIRE(id.ok());
  std::vector<std::vector<TokenId>> got(n);
  for (int i = 0; i < 5000 && e.engine->HasWork(); ++i) {
    for (const RequestOutput& o : e.engine->Step()) {
      REQUIRE(o.id == *id);
      REQUIRE(o.index < n);
      got[o.index].insert(got[o.index].end(), o.new_tokens.begin(), o.new_tokens.end());
    }
    Status st = e.engine->CheckInvariants();
    REQUIRE_MESSAGE(st.ok(), st.ToString());
  }
  REQUIRE_FALSE(e.engine->HasWork());
  return got;
}

TEST_CASE("cpu backend, n=3: greedy sequences equal the n=1 answer; seeded ones differ by index and repeat") {
  const auto prompt = Prompts()[2];  // 56 tokens: 3 full blocks shared, 8 recomputed by each fork
  std::vector<TokenId> greedy;
  {
    CpuEngine e(256, 256, 8);
    greedy = RunN(e, prompt, 1, 0, std::nullopt, 16)[0];
  }
  {
    CpuEngine e(256, 32, 8);  // chunked prompt: the fork waits for its last chunk
    for (const auto& tokens : RunN(e, prompt, 3, 0, std::nullopt, 16)) CHECK(tokens == greedy);
  }
  std::vector<std::vector<TokenId>> first;
  {
    CpuEngine e(256, 256, 8);
    first = RunN(e, prompt, 3, 1.0f, 1234, 16);
    // Index 0 samples with the request's seed, as n=1 does.
    CHECK(RunN(e, prompt, 1, 1.0f, 1234, 16)[0] == first[0]);
  }
  CHECK(first[0] != first[1]);
  CHECK(first[1] != first[2]);
  CHECK(first[0] != first[2]);
  CpuEngine again(256, 64, 8);
  CHECK(RunN(again, prompt, 3, 1.0f, 1234, 16) == first);
}

TEST_CASE("cpu backend, sliding window (tiny-mistral, window 20): chunked and batched runs match runs alone") {
  const auto prompts = Prompts();  // 30..69 tokens: longer than the window
  std::vector<std::vector<TokenId>> alone;
  {
    CpuEngine e(256, 256, 1, "tiny-mistral", 2);
    for (const auto& p : prompts) alone.push_back(e.Run({p}, 20)[0]);
  }
  CpuEngine e(256, 16, 8, "tiny-mistral", 2);
  CHECK(e.Run(prompts, 20) == alone);
}

TEST_CASE("cpu backend, StreamingLLM: chunked, batched and reused runs match runs alone") {
  // Sinks 4, window 24 over the tiny model's two layers; prompts of 30..69 tokens run a dense
  // context phase longer than sinks + window, then generate past it.
  backend::AttentionOptions streaming;
  streaming.sink_tokens = 4;
  streaming.max_attention_window = {24};
  streaming.streaming_llm = true;
  const auto prompts = Prompts();
  std::vector<std::vector<TokenId>> alone;
  {
    CpuEngine e(256, 256, 1, "tiny", 1, streaming);
    for (const auto& p : prompts) alone.push_back(e.Run({p}, 40)[0]);
  }
  SUBCASE("batched, with 16-token chunks") {
    CpuEngine e(256, 16, 8, "tiny", 1, streaming);
    CHECK(e.Run(prompts, 40) == alone);
  }
  SUBCASE("the first window served from the reuse tree") {
    CpuEngine e(256, 256, 8, "tiny", 1, streaming);
    CHECK(e.Run({prompts[3]}, 40)[0] == alone[3]);
    CHECK(e.Run({prompts[3]}, 40)[0] == alone[3]);
    CHECK(e.usage[e.last_ids[0]].cached_device_tokens == 16);  // the blocks wholly inside [0, 24)
  }
  // The streaming runs are not the plain model's: the window applies after the prompt.
  CpuEngine plain(256, 256, 1);
  CHECK(plain.Run({prompts[3]}, 40)[0] != alone[3]);
}

TEST_CASE("cpu backend, Llama 4 (16-token chunks on its RoPE layers only): chunked, batched and reused runs match") {
  const auto prompts = Prompts();
  std::vector<std::vector<TokenId>> alone;
  {
    CpuEngine e(256, 256, 1, "tiny-llama4", 1);
    REQUIRE(e.backend->pools().size() == 2);  // the NoPE layer's full attention, the chunked layers
    for (const auto& p : prompts) alone.push_back(e.Run({p}, 24)[0]);
  }
  CpuEngine e(256, 16, 8, "tiny-llama4", 1);
  CHECK(e.Run(prompts, 24) == alone);
  CHECK(e.Run({prompts[3]}, 24)[0] == alone[3]);  // its first chunk from the reuse tree
  CHECK(e.usage[e.last_ids[0]].cached_device_tokens > 0);
}

TEST_CASE("cpu backend, --attention-chunk-size: chunked and batched runs match runs alone") {
  // Chunks of 32 tokens (Llama 4's chunked attention) on the tiny model: prompts of 30..69
  // tokens cross chunk boundaries while prefilling and decoding.
  backend::AttentionOptions chunked;
  chunked.attention_chunk_size = 32;
  const auto prompts = Prompts();
  std::vector<std::vector<TokenId>> alone;
  {
    CpuEngine e(256, 256, 1, "tiny", 1, chunked);
    REQUIRE(e.backend->pools()[0].attention_chunk == 32);
    for (const auto& p : prompts) alone.push_back(e.Run({p}, 40)[0]);
  }
  CpuEngine e(256, 16, 8, "tiny", 1, chunked);
  CHECK(e.Run(prompts, 40) == alone);
  CpuEngine plain(256, 256, 1);
  CHECK(plain.Run({prompts[3]}, 40)[0] != alone[3]);
}

}  // namespace
}  // namespace kvfleet::engine

namespace kvfleet::engine {
namespace {

float MaxLogprobDiff(const std::vector<backend::TokenLogprobs>& a, const std::vector<backend::TokenLogprobs>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].token == b[i].token);
    d = std::max(d, std::fabs(a[i].logprob - b[i].logprob));
    REQUIRE(a[i].top.size() == b[i].top.size());
    for (size_t k = 0; k < a[i].top.size(); ++k) d = std::max(d, std::fabs(a[i].top[k].second - b[i].top[k].second));
  }
  return d;
}

SamplingParams EchoSampling() {
  SamplingParams s;
  s.temperature = 0;
  s.max_tokens = 24;
  s.ignore_eos = true;
  s.logprobs = 3;
  s.prompt_logprobs = true;
  return s;
}

TEST_CASE("cpu backend: prompt logprobs cover tokens 1..n-1 once, alike chunked, batched, preempted and when cached") {
  const auto prompts = Prompts();
  std::vector<CpuEngine::Answer> alone;
  {
    CpuEngine e(256, 256, 1);
    for (const auto& p : prompts) alone.push_back(e.RunWith({p}, EchoSampling())[0]);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    REQUIRE(alone[i].prompt_logprobs.size() == prompts[i].size() - 1);
    CHECK(alone[i].outputs_with_prompt_logprobs == 1);
    for (size_t p = 0; p + 1 < prompts[i].size(); ++p) CHECK(alone[i].prompt_logprobs[p].token == prompts[i][p + 1]);
    // Greedy: each generated token is its row's top entry, and its logprob that entry's.
    REQUIRE(alone[i].logprobs.size() == alone[i].tokens.size());
    for (size_t t = 0; t < alone[i].tokens.size(); ++t) {
      CHECK(alone[i].logprobs[t].token == alone[i].tokens[t]);
      CHECK(alone[i].logprobs[t].top[0].first == alone[i].tokens[t]);
      CHECK(alone[i].logprobs[t].logprob == alone[i].logprobs[t].top[0].second);
    }
  }
  auto expect_same = [&](const std::vector<CpuEngine::Answer>& got) {
    REQUIRE(got.size() == alone.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].tokens == alone[i].tokens);
      CHECK(got[i].outputs_with_prompt_logprobs == 1);
      CHECK(MaxLogprobDiff(got[i].prompt_logprobs, alone[i].prompt_logprobs) <= 1e-4f);
      CHECK(MaxLogprobDiff(got[i].logprobs, alone[i].logprobs) <= 1e-4f);
    }
  };
  SUBCASE("batched, with 16-token chunks") {
    CpuEngine e(256, 16, 8);
    expect_same(e.RunWith(prompts, EchoSampling()));
  }
  SUBCASE("a cache too small for all four: preemption and recompute") {
    CpuEngine e(12, 64, 8);  // as in the greedy test above
    expect_same(e.RunWith(prompts, EchoSampling()));
    CHECK(e.engine->counters().preemptions > 0);
  }
  SUBCASE("the prompt is in the reuse tree: it is computed again, not matched") {
    CpuEngine e(256, 256, 8);
    SamplingParams plain = EchoSampling();
    plain.logprobs = -1;
    plain.prompt_logprobs = false;
    e.RunWith(prompts, plain);
    expect_same(e.RunWith(prompts, EchoSampling()));
    for (RequestId id : e.last_ids) CHECK(e.usage[id].cached_device_tokens == 0);
    e.RunWith({prompts[0]}, plain);  // the echo run stored its blocks for others
    CHECK(e.usage[e.last_ids[0]].cached_device_tokens > 0);
  }
}

TEST_CASE("cpu backend: frequency and presence penalties steer greedy decoding by the raw logprobs") {
  // Greedy with only subtractive penalties picks argmax(raw logprob - penalty). The raw top 20
  // hold the winner while fewer than 20 distinct tokens are penalised (a token outside them
  // loses to an unpenalised one among them); the tiny model's greedy path repeats, so the
  // unpenalised answer differs.
  CpuEngine e(256, 256, 4);
  SamplingParams s;
  s.temperature = 0;
  s.max_tokens = 30;
  s.ignore_eos = true;
  s.logprobs = 20;
  s.frequency_penalty = 1.5f;
  s.presence_penalty = 0.5f;
  const auto prompts = Prompts();
  const auto got = e.RunWith({prompts[0], prompts[1]}, s);
  SamplingParams plain = s;
  plain.frequency_penalty = plain.presence_penalty = 0;
  const auto unpenalised = e.RunWith({prompts[0], prompts[1]}, plain);
  for (size_t r = 0; r < got.size(); ++r) {
    std::map<TokenId, int> count;
    for (size_t t = 0; t < got[r].tokens.size(); ++t) {
      const auto& lp = got[r].logprobs[t];
      if (count.size() >= 20) break;
      TokenId best = 0;
      double best_v = -1e30;
      for (auto [id, v] : lp.top) {
        const double adj = v - (count[id] ? 1.5 * count[id] + 0.5 : 0.0);
        if (adj > best_v) best_v = adj, best = id;
      }
      CHECK(got[r].tokens[t] == best);
      ++count[got[r].tokens[t]];
    }
    CHECK(got[r].tokens != unpenalised[r].tokens);
  }
}

TEST_CASE("cpu backend: logit_bias +100 forces a token and -100 bans the greedy one") {
  CpuEngine e(256, 256, 4);
  const auto prompts = Prompts();
  SamplingParams s;
  s.temperature = 0;
  s.max_tokens = 5;
  s.ignore_eos = true;
  const auto plain = e.RunWith({prompts[2]}, s)[0].tokens;
  s.logit_bias = {{plain[0], -100.0f}};
  CHECK(e.RunWith({prompts[2]}, s)[0].tokens[0] != plain[0]);
  s.logit_bias = {{4242, 100.0f}};
  s.temperature = 1.0f;
  CHECK(e.RunWith({prompts[2]}, s)[0].tokens == std::vector<TokenId>(5, 4242));
}

}  // namespace
}  // namespace kvfleet::engine

// ---- Constrained decoding (structured outputs) ----------------------------------------
// The random model's ids 0..255 read as bytes (engine::ByteVocabulary, the mock fleets'
// vocabulary); temperature 1 walks the grammar at random, so every output must still be a
// document the grammar accepts.
namespace kvfleet::engine {
namespace {

struct Constrained {
  std::vector<std::string> texts;  // per sequence index
  std::vector<FinishReason> finish;
};

Constrained RunConstrained(CpuEngine& e, StructuredOutputs& so, StructuredOutput::Kind kind, std::string spec,
                           uint32_t n = 1, uint32_t max_tokens = 600, uint64_t seed = 3) {
  GenerateRequest r;
  r.prompt = {300, 301, 302, 303, 304};
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.sampling.n = n;
  r.sampling.max_tokens = max_tokens;
  r.sampling.structured = {kind, std::move(spec)};
  REQUIRE(so.Prepare(&r).ok());
  auto id = e.engine->Add(std::move(r), 0);
  REQUIRE_MESSAGE(id.ok(), id.status().ToString());
  Constrained out;
  out.texts.resize(n);
  out.finish.assign(n, FinishReason::kNone);
  for (int i = 0; i < 20000 && e.engine->HasWork(); ++i) {
    for (const RequestOutput& o : e.engine->Step()) {
      for (TokenId t : o.new_tokens) {
        REQUIRE(t < 256);  // only byte tokens are ever allowed
        out.texts[o.index] += static_cast<char>(t);
      }
      if (o.finish != FinishReason::kNone) out.finish[o.index] = o.finish;
    }
    REQUIRE(e.engine->CheckInvariants().ok());
  }
  REQUIRE_FALSE(e.engine->HasWork());
  return out;
}

const char* kOrderSchema = R"({"type":"object","properties":{
  "id":{"type":"integer","minimum":0,"maximum":999},
  "status":{"enum":["pending","paid","shipped"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":6},"minItems":1,"maxItems":3},
  "owner":{"type":"object","properties":{"name":{"type":"string","maxLength":8},"vip":{"type":"boolean"}},
           "required":["name","vip"]},
  "note":{"anyOf":[{"type":"null"},{"type":"string","maxLength":5}]}},
  "required":["id","status","tags","owner","note"]})";

void CheckOrder(const std::string& text) {
  CAPTURE(text);
  const auto j = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  REQUIRE(j.is_object());
  CHECK(j.size() == 5);
  REQUIRE(j["id"].is_number_integer());
  CHECK(j["status"].is_string());
  const std::string status = j["status"].get<std::string>();
  CHECK((status == "pending" || status == "paid" || status == "shipped"));
  REQUIRE(j["tags"].is_array());
  CHECK(j["tags"].size() >= 1);
  CHECK(j["tags"].size() <= 3);
  for (const auto& t : j["tags"]) CHECK(t.is_string());
  CHECK(j["owner"]["name"].is_string());
  CHECK(j["owner"]["vip"].is_boolean());
  CHECK((j["note"].is_null() || j["note"].is_string()));
}

TEST_CASE("constrained decoding: every output of a JSON schema parses and matches it, and ends with stop") {
  CpuEngine e(/*blocks=*/256, /*max_num_tokens=*/256, /*max_batch=*/8);
  StructuredOutputs so(ByteVocabulary(static_cast<size_t>(e.backend->config().vocab_size)));
  for (uint64_t seed : {1, 2, 3}) {
    Constrained c = RunConstrained(e, so, StructuredOutput::Kind::kJsonSchema, kOrderSchema, 1, 900, seed);
    CHECK(c.finish[0] == FinishReason::kStop);
    CheckOrder(c.texts[0]);
  }
  // n = 2: each sequence follows the grammar on its own.
  Constrained two = RunConstrained(e, so, StructuredOutput::Kind::kJsonSchema, kOrderSchema, 2, 900, 9);
  for (int i = 0; i < 2; ++i) {
    CHECK(two.finish[i] == FinishReason::kStop);
    CheckOrder(two.texts[i]);
  }
  CHECK(so.cache().hits() >= 3);  // one compile for the lot
}

TEST_CASE("constrained decoding: a prepared grammar's token cache fills in the background, beside generation") {
  CpuEngine e(256, 256, 8);
  StructuredOutputs so(ByteVocabulary(static_cast<size_t>(e.backend->config().vocab_size)));
  CheckOrder(RunConstrained(e, so, StructuredOutput::Kind::kJsonSchema, kOrderSchema, 1, 900, 5).texts[0]);
  for (int i = 0; i < 6000 && so.grammars_warmed() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(so.grammars_warmed() >= 1);
  // Every state's entry is filled: as much as a grammar warmed here, more than one generation
  // alone fills (a cold compile that only generated would hold fewer).
  GenerateRequest r;
  r.sampling.structured = {StructuredOutput::Kind::kJsonSchema, kOrderSchema};
  REQUIRE(so.Prepare(&r).ok());
  auto full = grammar::Compile(SpecOf(r.sampling.structured), so.vocabulary());
  REQUIRE(full.ok());
  const size_t cold = grammar::MemoryBytes(**full);
  grammar::WarmTokenCache(**full);
  CHECK(grammar::MemoryBytes(**full) > cold);
  CHECK(grammar::MemoryBytes(*r.grammar) == grammar::MemoryBytes(**full));
}

TEST_CASE("constrained decoding: a choice, a regex and any JSON object") {
  CpuEngine e(256, 256, 8);
  StructuredOutputs so(ByteVocabulary(static_cast<size_t>(e.backend->config().vocab_size)));
  for (uint64_t seed : {1, 2, 3, 4}) {
    Constrained c = RunConstrained(e, so, StructuredOutput::Kind::kChoice, R"(["yes","no","maybe"])", 1, 50, seed);
    CHECK(c.finish[0] == FinishReason::kStop);
    CHECK((c.texts[0] == "yes" || c.texts[0] == "no" || c.texts[0] == "maybe"));
    Constrained r = RunConstrained(e, so, StructuredOutput::Kind::kRegex, "[a-c]{2,4}-[0-9]{3}", 1, 50, seed);
    CHECK(r.finish[0] == FinishReason::kStop);
    CHECK(std::regex_match(r.texts[0], std::regex("[a-c]{2,4}-[0-9]{3}")));
  }
  Constrained any = RunConstrained(e, so, StructuredOutput::Kind::kJsonObject, "", 1, 900, 5);
  if (any.finish[0] == FinishReason::kStop) {
    const auto j = nlohmann::json::parse(any.texts[0], nullptr, false);
    CHECK(j.is_object());
  }
}

TEST_CASE("constrained decoding: max_tokens cuts the document (length), and its text is a prefix the grammar accepts") {
  CpuEngine e(256, 256, 8);
  StructuredOutputs so(ByteVocabulary(static_cast<size_t>(e.backend->config().vocab_size)));
  Constrained c = RunConstrained(e, so, StructuredOutput::Kind::kJsonSchema, kOrderSchema, 1, 6);
  CHECK(c.finish[0] == FinishReason::kLength);
  REQUIRE(c.texts[0].size() == 6);
  auto g = grammar::Compile({grammar::Kind::kJsonSchema, kOrderSchema}, so.vocabulary());
  REQUIRE(g.ok());
  grammar::Matcher m(*g);
  CHECK(m.AcceptBytes(c.texts[0]));
  CHECK_FALSE(m.CanTerminate());
}

TEST_CASE("constrained decoding: a request without a grammar or a bad spec is refused") {
  CpuEngine e(256, 256, 8);
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.sampling.structured = {StructuredOutput::Kind::kJsonObject, ""};
  auto id = e.engine->Add(r, 0);
  REQUIRE_FALSE(id.ok());
  CHECK(id.status().message().find("response_format") != std::string::npos);
  StructuredOutputs so(ByteVocabulary(static_cast<size_t>(e.backend->config().vocab_size)));
  r.sampling.structured = {StructuredOutput::Kind::kJsonSchema, R"({"type":"object","not":{}})"};
  Status st = so.Prepare(&r);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("response_format") != std::string::npos);
  CHECK(st.message().find("not") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::engine
