// The engine under test: the real KV cache manager and the mock backend in verify_kv mode
// (its tokens depend on everything attention reads through the block tables), on a manual
// clock that the mock advances by its modelled step time. Harness checks the engine's
// invariants after every step.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <doctest/doctest.h>

#include "worker/backend/kv_setup.h"
#include "worker/backend/mock/mock_backend.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/model/lora_adapter.h"

namespace kvfleet::engine::testing {

inline constexpr uint32_t kBlock = 16;

struct HarnessOptions {
  int64_t device_blocks = 256;
  uint32_t max_num_tokens = 64;
  uint32_t max_batch_size = 16;
  uint32_t max_context = 1024;
  uint32_t max_queued = 64;
  uint32_t eos_after = 0;
  // The engine's eos ids; unset: the backend's model config's.
  std::optional<std::vector<TokenId>> eos_token_ids;
  int32_t max_loras = 0;  // adapter slots on the backend
  int32_t max_lora_rank = model::kMaxLoraRank;
  double max_step_over_decodes = 0;  // > 0: a decode-role worker's scheduler (SchedulerOptions)
  // The mock checks that every KV slot a step reads was written by an earlier step. Off for
  // a receiver of mock pulls (dtype none): their blocks come with tokens, no bytes.
  bool verify_kv = true;
};

struct Harness {
  explicit Harness(const HarnessOptions& o = {}) {
    backend::BackendOptions bo;
    bo.block_size = kBlock;
    bo.max_num_tokens = static_cast<int32_t>(o.max_num_tokens);
    bo.max_batch_size = static_cast<int32_t>(o.max_batch_size);
    bo.max_context = o.max_context;
    bo.num_blocks = o.device_blocks;
    bo.max_loras = o.max_loras;
    backend::mock::MockOptions mo;
    mo.verify_kv = o.verify_kv;
    mo.eos_after = o.eos_after;
    mo.clock = &clock;
    mo.wait = [this](TimeNs deadline) {
      if (deadline > clock.Now()) clock.Set(deadline);
    };
    auto b = backend::mock::MockBackend::Make(bo, mo);
    REQUIRE_MESSAGE(b.ok(), b.status().ToString());
    backend = std::move(*b);
    backend::KvMemorySettings memory;
    memory.block_size = kBlock;
    memory.max_context = o.max_context;
    memory.device_bytes = backend->kv_device_bytes();
    auto k = kv::KvCacheManager::Make(backend::KvCacheConfigFor(backend->config(), memory), &backend->block_copier(),
                                      &clock);
    REQUIRE_MESSAGE(k.ok(), k.status().ToString());
    kv = std::move(*k);
    REQUIRE(backend::CheckPoolsAgree(kv->pools(), backend->pools()).ok());
    EngineOptions eo;
    eo.model_name = "mock-8b";
    eo.scheduler.max_num_tokens = o.max_num_tokens;
    eo.scheduler.max_batch_size = o.max_batch_size;
    eo.scheduler.max_step_over_decodes = o.max_step_over_decodes;
    eo.limits.max_context = o.max_context;
    eo.limits.max_queued = o.max_queued;
    eo.limits.vocab_size = static_cast<uint32_t>(backend->config().vocab_size);
    for (int64_t e : backend->config().eos_token_ids) eo.eos_token_ids.push_back(static_cast<TokenId>(e));
    if (o.eos_token_ids) eo.eos_token_ids = *o.eos_token_ids;
    eo.max_lora_rank = o.max_lora_rank;
    engine = std::make_unique<Engine>(eo, backend.get(), kv.get(), &clock);
  }

  // A greedy request (of adapter `lora`, "" for the base model).
  Result<RequestId> TryAdd(std::vector<TokenId> prompt, uint32_t max_tokens, uint64_t seed = 7,
                           std::string lora = "") {
    GenerateRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.sampling.seed = seed;
    r.sampling.max_tokens = max_tokens;
    r.lora = std::move(lora);
    return engine->Add(std::move(r), clock.Now());
  }
  RequestId Add(std::vector<TokenId> prompt, uint32_t max_tokens, uint64_t seed = 7, std::string lora = "") {
    auto id = TryAdd(std::move(prompt), max_tokens, seed, std::move(lora));
    REQUIRE_MESSAGE(id.ok(), id.status().ToString());
    return *id;
  }

  // One step; accumulates tokens, final outputs and the stored blocks of each adapter;
  // checks invariants.
  std::vector<RequestOutput> Step() {
    auto outs = engine->Step();
    for (const RequestOutput& o : outs) {
      auto& t = tokens[o.id];
      t.insert(t.end(), o.new_tokens.begin(), o.new_tokens.end());
      CHECK_FALSE(finals.contains(o.id));  // nothing after the final Delta
      if (o.finish != FinishReason::kNone) finals[o.id] = o;
    }
    for (const kv::KvEvent& e : kv->TakeEvents()) {
      if (auto* s = std::get_if<kv::StoredEvent>(&e.data)) {
        for (const kv::StoredBlock& b : s->blocks) ++stored_by_lora[b.lora_id];
      }
    }
    Status st = engine->CheckInvariants();
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    return outs;
  }

  void RunToCompletion(int max_steps = 10'000) {
    for (int i = 0; i < max_steps && engine->HasWork(); ++i) Step();
    REQUIRE_FALSE(engine->HasWork());
  }

  uint32_t DeviceBlocksInUse() const { return kv->Stats().pools[0].tiers[0].in_use; }

  ManualClock clock;
  std::unique_ptr<backend::mock::MockBackend> backend;
  std::unique_ptr<kv::KvCacheManager> kv;
  std::unique_ptr<Engine> engine;
  std::map<RequestId, std::vector<TokenId>> tokens;
  std::map<RequestId, RequestOutput> finals;
  std::map<uint64_t, int> stored_by_lora;  // blocks stored, by loraId (0: the base model)
};

inline std::vector<TokenId> Prompt(uint32_t n, TokenId first = 1000) {
  std::vector<TokenId> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

}  // namespace kvfleet::engine::testing
