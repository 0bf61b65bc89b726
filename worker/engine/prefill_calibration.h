// MeasurePrefillRate: the prefill rate a worker announces in its Hello before its load
// reports measure one (router/routing/README.md, "The kv cost model": a cold router costs
// each worker at it). It times single-sequence prefill steps of growing size straight on the
// backend, at start-up, before the KV cache manager exists: the steps write scratch KV blocks
// that no sequence owns yet, so the reuse tree and the published events start empty and the
// first request sees the cache as if no step had run.
//
// The procedure (a backend-agnostic microbenchmark):
//   1. One step of first_tokens is run and discarded: first-run costs (CUDA module loading,
//      GEMM heuristics, page faults) are no part of the rate.
//   2. Steps of first_tokens, 2x, 4x, ... are timed, up to the largest step the worker runs
//      (max_tokens, the context and every KV pool's blocks), stopping at the first step slower
//      than max_step_ms or once the next would overrun the time budget.
//   3. The rate is that of the largest step within the step bound, as the scheduler cuts
//      prefill to it (and as the mock backend's cost model announces): between the last step
//      within the bound and the first past it the step time is taken as linear in tokens.
//      Without a bound, the largest step timed.
//
// Thread safety: thread-compatible; runs on the thread that owns the backend, before the
// engine.
#pragma once

#include <cstdint>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/backend/backend.h"

namespace kvfleet::engine {

namespace config {
// The first step's tokens: small enough that a large model on the cpu backend runs it in
// about a second, large enough that a GPU's step is more than its launch overhead.
inline constexpr uint32_t kCalibrationFirstTokens = 64;
// The time the timed steps may take together, warm-up excluded: the worker's start-up is
// seconds anyway (the model loads), and a few doublings past the first step fit in it.
inline constexpr DurationNs kCalibrationBudget = 1 * kNsPerSec;
}  // namespace config

struct PrefillCalibrationOptions {
  uint32_t max_tokens = 8192;  // the scheduler's token budget per step (--max-num-tokens)
  double max_step_ms = 0;      // the step bound (--max-step-ms); 0: none
  uint32_t first_tokens = config::kCalibrationFirstTokens;
  DurationNs budget = config::kCalibrationBudget;
};

// One timed step.
struct CalibrationStep {
  uint32_t tokens = 0;
  DurationNs duration = 0;
};

struct PrefillCalibration {
  double tokens_per_second = 0;       // the rate to announce
  uint32_t step_tokens = 0;           // the step size it is the rate of (within the bound)
  std::vector<CalibrationStep> steps; // the timed steps, in order (the warm-up not among them)
  DurationNs elapsed = 0;             // the whole calibration, warm-up included
};

// The tokens of a calibration step of n tokens (any ids the model's vocabulary holds).
std::vector<TokenId> CalibrationTokens(uint32_t n, int64_t vocab_size);

// Times prefill steps on `backend` (the procedure above). REQUIRES: no KV cache manager has
// handed out the backend's blocks yet (every block is scratch). A failed step is an error.
Result<PrefillCalibration> MeasurePrefillRate(backend::ModelBackend* backend, const PrefillCalibrationOptions& options,
                                              const Clock* clock);

}  // namespace kvfleet::engine
