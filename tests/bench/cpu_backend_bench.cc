// cpu backend throughput: generated tokens per second at batch 1 and batch 8, greedy.
//
//   build/bench/cpu_backend_bench [--model DIR] [--threads N] [--steps N]
//
// Without --model it uses make-model's `tiny` shape (seed 1). Prints one line per batch
// size: prefill time for the prompts, then decode tokens/s (all sequences together).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"

using namespace kvfleet;
using WallClock = std::chrono::steady_clock;

namespace {

double Since(WallClock::time_point t0) { return std::chrono::duration<double>(WallClock::now() - t0).count(); }

void Run(backend::ModelBackend& b, int batch, int prompt_len, int steps) {
  const int B = b.block_size();
  const int blocks_per_seq = (prompt_len + steps + B - 1) / B;
  std::vector<std::vector<backend::BlockId>> tables(batch);
  std::vector<std::vector<TokenId>> prompts(batch);
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < blocks_per_seq; ++i) tables[s].push_back(static_cast<backend::BlockId>(s * blocks_per_seq + i));
    for (int i = 0; i < prompt_len; ++i) prompts[s].push_back(static_cast<TokenId>((s * 7919 + i * 104729) % 30000 + 100));
  }
  backend::StepBatch step;
  backend::StepOutput out;
  std::vector<TokenId> last(batch);
  step.seqs.resize(batch);
  for (int s = 0; s < batch; ++s) {
    auto& q = step.seqs[s];
    q.request_id = s;
    q.tokens = prompts[s];
    q.start_position = 0;
    q.block_tables = {tables[s]};
    q.sample = true;
  }
  auto t0 = WallClock::now();
  Status st = b.Execute(step, &out);
  if (!st.ok()) {
    std::fprintf(stderr, "prefill: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  const double prefill_s = Since(t0);
  for (int s = 0; s < batch; ++s) last[s] = out.tokens[s];
  t0 = WallClock::now();
  for (int i = 0; i < steps; ++i) {
    for (int s = 0; s < batch; ++s) {
      auto& q = step.seqs[s];
      q.tokens = std::span<const TokenId>(&last[s], 1);
      q.start_position = prompt_len + i;
      q.rng_counter = static_cast<uint64_t>(i + 1);
    }
    st = b.Execute(step, &out);
    if (!st.ok()) {
      std::fprintf(stderr, "decode: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    for (int s = 0; s < batch; ++s) last[s] = out.tokens[s];
  }
  const double decode_s = Since(t0);
  std::printf("batch %d: prefill %d x %d tokens in %.1f ms; decode %d steps: %.1f tokens/s (%.2f ms/step)\n", batch,
              batch, prompt_len, prefill_s * 1e3, steps, batch * steps / decode_s, decode_s * 1e3 / steps);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  int threads = 2, steps = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
  }
  if (model.empty()) model = testing::RandomModelDir("tiny", 1);
  backend::BackendOptions o;
  o.model_dir = model;
  o.threads = threads;
  o.num_blocks = 256;
  o.max_context = 4096;
  auto b = backend::CreateBackend("cpu", o);
  if (!b.ok()) {
    std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
    return 1;
  }
  std::printf("cpu backend, %s, %d threads\n", model.c_str(), threads);
  Run(**b, 1, 32, steps);
  Run(**b, 8, 32, steps);
  return 0;
}
