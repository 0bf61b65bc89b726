// Stall-bounded batching end to end: the engine with the real KV cache manager and the mock
// backend, whose cost model (a Llama-3.1-8B on an H100, worker/backend/mock/cost_model.h)
// advances a manual clock. Closed-loop clients send a new prompt as soon as their answer
// ends, as the benchmark does; times are the simulated clock's, so nothing here
// depends on the speed of the machine running it.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "worker/backend/kv_setup.h"
#include "worker/backend/mock/mock_backend.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::engine {
namespace {

constexpr uint32_t kBlock = 32;

struct LoopResult {
  std::vector<double> itl_ms;   // every gap between successive tokens of a request
  std::vector<double> ttft_ms;  // arrival to first token
  double output_tokens_per_s = 0;
  uint64_t bounded_steps = 0;     // steps whose prefill the bound cut
  double model_error = 0;         // the step-time model's typical relative error at the end
  double prefill_tokens_per_s = 0;  // the rate the load report gives the router
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// `clients` closed-loop clients, each sending `prompt`-token prompts for `output` tokens,
// for `seconds` of simulated time after `warmup_s`.
LoopResult RunClosedLoop(double max_step_ms, uint32_t clients, uint32_t prompt, uint32_t output, double warmup_s,
                         double seconds) {
  ManualClock clock;
  backend::BackendOptions bo;
  bo.block_size = kBlock;
  bo.max_num_tokens = 8192;
  bo.max_batch_size = 256;
  bo.max_context = 4096;
  bo.num_blocks = static_cast<int64_t>(clients) * ((prompt + output) / kBlock + 2) + 64;
  backend::mock::MockOptions mo;
  mo.clock = &clock;
  mo.wait = [&clock](TimeNs deadline) {
    if (deadline > clock.Now()) clock.Set(deadline);
  };
  auto b = backend::mock::MockBackend::Make(bo, mo);
  REQUIRE(b.ok());
  std::unique_ptr<backend::mock::MockBackend> backend = std::move(*b);
  backend::KvMemorySettings memory;
  memory.block_size = kBlock;
  memory.max_context = bo.max_context;
  memory.device_bytes = backend->kv_device_bytes();
  auto k = kv::KvCacheManager::Make(backend::KvCacheConfigFor(backend->config(), memory), &backend->block_copier(),
                                    &clock);
  REQUIRE(k.ok());
  std::unique_ptr<kv::KvCacheManager> kv = std::move(*k);
  EngineOptions eo;
  eo.model_name = "mock-8b";
  eo.scheduler.max_num_tokens = bo.max_num_tokens;
  eo.scheduler.max_batch_size = bo.max_batch_size;
  eo.scheduler.max_step_ms = max_step_ms;
  eo.limits.max_context = bo.max_context;
  eo.limits.max_queued = clients;
  eo.limits.vocab_size = static_cast<uint32_t>(backend->config().vocab_size);
  Engine engine(eo, backend.get(), kv.get(), &clock);

  TokenId next_token = 1;
  auto send = [&] {
    GenerateRequest r;
    r.prompt.resize(prompt);
    for (TokenId& t : r.prompt) t = next_token++ % 100'000 + 1;  // fresh prompts: no prefix hits
    r.sampling.temperature = 0;
    r.sampling.max_tokens = output;
    r.sampling.ignore_eos = true;
    auto id = engine.Add(std::move(r), clock.Now());
    REQUIRE(id.ok());
  };
  for (uint32_t c = 0; c < clients; ++c) send();
  LoopResult out;
  const TimeNs start = clock.Now() + static_cast<TimeNs>(warmup_s * kNsPerSec);
  const TimeNs end = start + static_cast<TimeNs>(seconds * kNsPerSec);
  std::map<RequestId, TimeNs> last_token;
  uint64_t tokens = 0;
  while (clock.Now() < end) {
    std::vector<RequestOutput> outputs = engine.Step();
    const TimeNs now = clock.Now();
    const bool measuring = now >= start;
    if (measuring && engine.last_step().time_bounded) ++out.bounded_steps;
    for (const RequestOutput& o : outputs) {
      if (!o.new_tokens.empty()) {
        auto it = last_token.find(o.id);
        if (measuring) {
          tokens += o.new_tokens.size();
          if (it == last_token.end()) {
            out.ttft_ms.push_back(static_cast<double>(o.usage.time_to_first_token) / kNsPerMs);
          } else {
            out.itl_ms.push_back(static_cast<double>(now - it->second) / kNsPerMs / o.new_tokens.size());
          }
        }
        last_token[o.id] = now;
      }
      if (o.finish != FinishReason::kNone) {
        REQUIRE(o.finish == FinishReason::kLength);
        last_token.erase(o.id);
        send();
      }
    }
  }
  out.output_tokens_per_s = static_cast<double>(tokens) / seconds;
  out.model_error = engine.scheduler().step_model().relative_error();
  out.prefill_tokens_per_s = engine.Load().prefill_tokens_per_second;
  return out;
}

void CheckStallBounded(uint32_t clients, uint32_t prompt) {
  const double bound = SchedulerOptions{}.max_step_ms;
  const LoopResult off = RunClosedLoop(0, clients, prompt, 128, 5, 20);
  const LoopResult on = RunClosedLoop(bound, clients, prompt, 128, 5, 20);
  const double off_p50 = Percentile(off.itl_ms, 0.5), off_p99 = Percentile(off.itl_ms, 0.99);
  const double on_p50 = Percentile(on.itl_ms, 0.5), on_p99 = Percentile(on.itl_ms, 0.99);
  INFO("off: ITL p50 " << off_p50 << " p99 " << off_p99 << " ms, " << off.output_tokens_per_s << " tok/s; on: ITL p50 "
                       << on_p50 << " p99 " << on_p99 << " ms, " << on.output_tokens_per_s << " tok/s");
  // The issue: every step with a big prefill stalls every decode in it.
  CHECK(off_p99 > 10 * off_p50);
  CHECK(off.bounded_steps == 0);
  // The bound: steps even, throughput kept, and the model's predictions held.
  CHECK(on.bounded_steps > 0);
  CHECK(on_p99 <= 2.5 * on_p50);
  CHECK(on_p99 <= 1.05 * bound);
  CHECK(on.output_tokens_per_s >= 0.9 * off.output_tokens_per_s);
  CHECK(on.model_error < 0.05);
  // Bounded steps still tell the router how fast queued prompts drain.
  CHECK(on.prefill_tokens_per_s > 0);
}

TEST_CASE("64 closed-loop clients, 1024-token prompts: the default bound evens out inter-token latency") {
  CheckStallBounded(64, 1024);
}

TEST_CASE("128 closed-loop clients, 512-token prompts: the default bound evens out inter-token latency") {
  CheckStallBounded(128, 512);
}

TEST_CASE("a request alone has nothing to protect: the bound leaves its time to first token as it was") {
  const LoopResult off = RunClosedLoop(0, 1, 3000, 8, 0, 5);
  const LoopResult on = RunClosedLoop(SchedulerOptions{}.max_step_ms, 1, 3000, 8, 0, 5);
  REQUIRE(!off.ttft_ms.empty());
  CHECK(on.ttft_ms == off.ttft_ms);
  CHECK(on.bounded_steps == 0);
}

}  // namespace
}  // namespace kvfleet::engine
