// The engine on the real cpu backend (make-model's `tiny`, fp32 math): greedy outputs must
// not depend on how the engine ran a request — chunked, batched with others, preempted and
// recomputed, or served from the reuse tree.
#include <doctest/doctest.h>

#include <map>
#include <optional>

#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/backend/kv_setup.h"
#include "worker/engine/engine.h"
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
