// grammar_bench --engine: constrained decoding end to end, the engine's decode step with and
// without a JSON-schema grammar on a real backend (kvfleet issue 37's goal: at most 5% slower
// per step at batch 64).
//
//   build/bench/grammar_bench --engine --model DIR [--backend cpu|cuda] [--batches 1,64]
//                             [--prompt 1024] [--steps 20] [--warmup 6] [--rounds 2] [--threads N]
//
// DIR is a model directory with a tokenizer (`kvfleet make-model --shape llama-3.1-8b --seed 7
// --tokenizer <llama3 tokenizer dir> --out DIR`): the worker's grammar vocabulary is built
// from it (server::LoadGrammarVocabulary). For each batch size B, B requests of random
// prompts decode at temperature 1, first unconstrained, then each under the order schema of
// grammar_bench (its token cache filled first, as the worker's warming thread leaves it). A
// sequence that ends (its document complete, or max_tokens) is replaced by a new request;
// only steps that decode exactly B sequences and compute nothing else are timed (wall time of
// Engine::Step: schedule, the backend's step, postprocess; the median is the figure), --steps
// per round after --warmup, the two modes alternating for --rounds rounds. The mask fill
// time per token is the engine's own count (EngineCounters::mask_fill_ns), spent while the
// backend's forward pass runs (cuda at one rank; the cpu backend computes first, then asks).
#include "tests/bench/grammar_engine_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "grammar/grammar.h"
#include "worker/backend/backend.h"
#include "worker/backend/kv_setup.h"
#include "worker/engine/engine.h"
#include "worker/engine/structured_output.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/server/grammar_vocabulary.h"

namespace kvfleet::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, backend = "cpu";
  std::vector<int32_t> batches = {1, 64};
  int32_t prompt = 1024, steps = 20, warmup = 6, threads = 0, rounds = 2;
};

// One mode's timed steps over every round.
struct Measured {
  std::vector<double> step_ms;  // each timed step's wall time
  uint64_t masks = 0;           // masks filled during the timed steps
  uint64_t mask_ns = 0;         // and the engine's time in them
  uint64_t finished = 0;        // sequences that ended (and were replaced) meanwhile

  double Median() const {
    std::vector<double> t = step_ms;
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return t[t.size() / 2];
  }
  double Mean() const {
    double sum = 0;
    for (double t : step_ms) sum += t;
    return sum / static_cast<double>(step_ms.size());
  }
};

// Tokens a sequence may generate beyond the timed and warm-up steps: the batch's prefill
// steps, where the first prompts computed already decode, and a margin.
int32_t ExtraTokens(const Args& a, int32_t batch) {
  return 64 + static_cast<int32_t>(static_cast<int64_t>(a.prompt) * batch / 8192);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "grammar_bench --engine: %s\n", what.c_str());
  return 1;
}

class Bench {
 public:
  Bench(const Args& a, backend::ModelBackend* b, kv::KvCacheManager* kv, engine::StructuredOutputs* so)
      : args_(a), backend_(b), kv_(kv), so_(so) {}

  // B sequences decoding; `grammar`: each under the order schema.
  // Adds one round's timed steps to *m.
  Status Run(int32_t batch, bool grammar, Measured* m) {
    engine::EngineOptions eo;
    eo.model_name = "bench";
    eo.scheduler.max_num_tokens = static_cast<uint32_t>(backend_->max_num_tokens());
    eo.scheduler.max_batch_size = static_cast<uint32_t>(batch);
    eo.limits.max_context = static_cast<uint32_t>(backend_->max_context());
    eo.limits.max_queued = 1u << 20;
    eo.limits.vocab_size = static_cast<uint32_t>(backend_->config().vocab_size);
    for (int64_t e : backend_->config().eos_token_ids) eo.eos_token_ids.push_back(static_cast<TokenId>(e));
    engine::Engine engine(eo, backend_, kv_, SystemClock::Default());
    std::mt19937_64 rng(7);
    auto add = [&]() -> Status {
      engine::GenerateRequest r;
      std::uniform_int_distribution<TokenId> token(0, static_cast<TokenId>(backend_->config().vocab_size - 1));
      for (int32_t i = 0; i < args_.prompt; ++i) r.prompt.push_back(token(rng));
      r.sampling.temperature = 1.0f;
      r.sampling.seed = rng();
      r.sampling.ignore_eos = true;  // unconstrained sequences run to max_tokens
      r.sampling.max_tokens = static_cast<uint32_t>(args_.warmup + args_.steps + ExtraTokens(args_, batch));
      if (grammar) {
        r.sampling.structured = {StructuredOutput::Kind::kJsonSchema, kOrderSchema};
        KVF_RETURN_IF_ERROR(so_->Prepare(&r));
      }
      return engine.Add(std::move(r), 0).status();
    };
    for (int32_t i = 0; i < batch; ++i) KVF_RETURN_IF_ERROR(add());
    int32_t full = 0, timed = 0;  // full decode steps so far (warm-up first)
    uint64_t masks0 = 0, ns0 = 0;
    for (int64_t guard = 0; timed < args_.steps; ++guard) {
      if (guard > 100 * (args_.steps + args_.warmup) + 10 * args_.prompt) return Internal("no full decode steps");
      const auto t0 = Clock::now();
      const std::vector<engine::RequestOutput> outputs = engine.Step();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      const engine::StepReport& r = engine.last_step();
      for (const engine::RequestOutput& o : outputs) {
        if (o.finish == engine::FinishReason::kError) return Internal("a sequence ended with an error");
        if (o.finish != engine::FinishReason::kNone) {
          ++m->finished;
          KVF_RETURN_IF_ERROR(add());
        }
      }
      if (r.decode_sequences != static_cast<uint32_t>(batch) || r.batch_tokens != static_cast<uint32_t>(batch)) continue;
      if (++full == args_.warmup) {
        masks0 = engine.counters().masks_filled;
        ns0 = engine.counters().mask_fill_ns;
      }
      if (full <= args_.warmup) continue;
      m->step_ms.push_back(ms);
      ++timed;
    }
    m->masks += engine.counters().masks_filled - masks0;
    m->mask_ns += engine.counters().mask_fill_ns - ns0;
    engine.CancelAll();
    while (engine.HasWork()) engine.Step();
    return Status::Ok();
  }

 private:
  const Args& args_;
  backend::ModelBackend* backend_;
  kv::KvCacheManager* kv_;
  engine::StructuredOutputs* so_;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--engine") continue;
    if (i + 1 >= argc) return false;
    const std::string v = argv[++i];
    if (k == "--model") {
      a->model = v;
    } else if (k == "--backend") {
      a->backend = v;
    } else if (k == "--batches") {
      a->batches.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) a->batches.push_back(std::stoi(item));
    } else if (k == "--prompt") {
      a->prompt = std::stoi(v);
    } else if (k == "--steps") {
      a->steps = std::stoi(v);
    } else if (k == "--warmup") {
      a->warmup = std::stoi(v);
    } else if (k == "--rounds") {
      a->rounds = std::stoi(v);
    } else if (k == "--threads") {
      a->threads = std::stoi(v);
    } else {
      return false;
    }
  }
  return !a->model.empty() && !a->batches.empty() && a->prompt > 0 && a->steps > 0 && a->warmup > 0 && a->rounds > 0 &&
         std::all_of(a->batches.begin(), a->batches.end(), [](int32_t b) { return b > 0; });
}

}  // namespace

int RunEngineBench(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    return Fail("usage: grammar_bench --engine --model DIR [--backend cpu|cuda] [--batches 1,64] [--prompt N] "
                "[--steps N] [--warmup N] [--rounds N] [--threads N]");
  }
  const int32_t max_batch = *std::max_element(a.batches.begin(), a.batches.end());
  backend::BackendOptions bo;
  bo.model_dir = a.model;
  bo.block_size = 32;
  bo.max_batch_size = max_batch;
  bo.max_num_tokens = std::max(8192, max_batch);
  bo.max_context = a.prompt + a.warmup + a.steps + ExtraTokens(a, max_batch) + 64;
  bo.threads = a.threads;
  auto b = backend::CreateBackend(a.backend, bo);
  if (!b.ok()) return Fail(b.status().ToString());
  std::unique_ptr<backend::ModelBackend> be = std::move(*b);
  if (!be->applies_token_bitmask()) return Fail("the " + a.backend + " backend does not apply token masks");
  auto kv = kv::KvCacheManager::Make(backend::KvCacheConfigFor(be->config(), backend::KvMemoryOf(*be), bo.attention),
                                     &be->block_copier(), SystemClock::Default());
  if (!kv.ok()) return Fail(kv.status().ToString());
  std::vector<TokenId> eos;
  for (int64_t e : be->config().eos_token_ids) eos.push_back(static_cast<TokenId>(e));
  auto vocab = server::LoadGrammarVocabulary(a.model, static_cast<size_t>(be->config().vocab_size), eos);
  if (!vocab.ok()) return Fail(vocab.status().ToString());
  engine::StructuredOutputs so(std::move(*vocab), 16, /*warm=*/false);
  {  // the order schema's token cache, every state (the worker's warming thread does this)
    engine::GenerateRequest r;
    r.sampling.structured = {StructuredOutput::Kind::kJsonSchema, kOrderSchema};
    const Status st = so.Prepare(&r);
    if (!st.ok()) return Fail(st.ToString());
    const auto t0 = Clock::now();
    grammar::WarmTokenCache(*r.grammar);
    std::printf("order schema on %zu tokens: token cache filled in %.0f ms\n", so.vocabulary().size(),
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  const model::ModelConfig& c = be->config();
  std::printf("grammar_bench --engine: %s backend, %s (hidden %lld, %lld layers, vocabulary %lld), prompt %d, "
              "%d rounds of %d timed decode steps after %d\n",
              a.backend.c_str(), a.model.c_str(), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_layers), static_cast<long long>(c.vocab_size), a.prompt, a.rounds, a.steps,
              a.warmup);
  std::printf("ms/step: the median of the timed steps (mean in brackets)\n");
  std::printf("%6s %22s %22s %8s %14s %11s\n", "batch", "plain ms/step", "schema ms/step", "diff", "mask us/token",
              "docs ended");
  Bench bench(a, be.get(), kv->get(), &so);
  for (int32_t batch : a.batches) {
    Measured plain, schema;
    for (int32_t round = 0; round < a.rounds; ++round) {  // alternated: drift on a shared host hits both
      Status st = bench.Run(batch, false, &plain);
      if (st.ok()) st = bench.Run(batch, true, &schema);
      if (!st.ok()) return Fail(st.ToString());
    }
    const double mask_us = schema.masks > 0 ? static_cast<double>(schema.mask_ns) / 1e3 / static_cast<double>(schema.masks) : 0;
    std::printf("%6d %10.3f (%9.3f) %10.3f (%9.3f) %+7.1f%% %14.2f %11llu\n", batch, plain.Median(), plain.Mean(),
                schema.Median(), schema.Mean(), 100.0 * (schema.Median() / plain.Median() - 1.0), mask_us,
                static_cast<unsigned long long>(schema.finished));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace kvfleet::bench
