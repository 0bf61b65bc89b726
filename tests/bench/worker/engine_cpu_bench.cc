// Engine + cpu backend throughput: generated tokens per second for make-model's `tiny` at
// batch 1 and batch 8, through the whole engine (scheduler, KV cache manager, backend).
//
//   build/bench/engine_cpu_bench [--threads N] [--tokens N] [--prompt N]
//
// Greedy, ignore_eos; tokens/s counts every generated token over the time from the first
// Add to the last one finished (prefill included).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/log.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/backend/kv_setup.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache_manager.h"

using namespace kvfleet;

namespace {

// Process CPU seconds: a figure that a loaded machine distorts less than wall time.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int Arg(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = Arg(argc, argv, "--threads", 2);
  const int tokens = Arg(argc, argv, "--tokens", 128);
  const int prompt = Arg(argc, argv, "--prompt", 64);
  (void)InitLogging(LogOptions{"warn", "text"});
  for (int batch : {1, 8}) {
    backend::BackendOptions bo;
    bo.model_dir = testing::RandomModelDir("tiny", 1);
    bo.block_size = 16;
    bo.max_num_tokens = 2048;
    bo.max_batch_size = 64;
    bo.max_context = 4096;
    bo.threads = threads;
    auto b = backend::CreateBackend("cpu", bo);
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
      return 1;
    }
    auto kv = kv::KvCacheManager::Make(backend::KvCacheConfigFor((*b)->config(), backend::KvMemoryOf(**b)),
                                       &(*b)->block_copier(), SystemClock::Default());
    if (!kv.ok()) return 1;
    engine::EngineOptions eo;
    eo.model_name = "tiny";
    eo.scheduler.max_num_tokens = 2048;
    eo.scheduler.max_batch_size = 64;
    eo.limits.max_context = 4096;
    engine::Engine e(eo, b->get(), kv->get(), SystemClock::Default());
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = CpuSeconds();
    for (int s = 0; s < batch; ++s) {
      engine::GenerateRequest r;
      for (int i = 0; i < prompt; ++i) r.prompt.push_back(static_cast<TokenId>((s * 7919 + i * 104729) % 30000 + 100));
      r.sampling.temperature = 0;
      r.sampling.max_tokens = static_cast<uint32_t>(tokens);
      r.sampling.ignore_eos = true;
      (void)e.Add(std::move(r), 0);
    }
    uint64_t generated = 0, steps = 0;
    while (e.HasWork()) {
      for (const auto& o : e.Step()) generated += o.new_tokens.size();
      ++steps;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = CpuSeconds() - cpu0;
    std::printf("cpu backend, tiny, batch %d: %lu tokens in %.3f s = %.0f tokens/s wall, %.0f tokens per CPU-second "
                "(%lu steps, %d threads, prompt %d)\n",
                batch, static_cast<unsigned long>(generated), s, generated / s, generated / cpu,
                static_cast<unsigned long>(steps), threads, prompt);
  }
  return 0;
}
