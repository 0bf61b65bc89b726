#include "worker/engine/prefill_calibration.h"

#include <algorithm>
#include <string>

namespace kvfleet::engine {

namespace {

// The largest prefill step the worker can run: the token budget, the context, and every
// pool's blocks (the step writes each of its positions into a block of its own).
uint32_t LargestStep(const backend::ModelBackend& backend, uint32_t max_tokens) {
  uint64_t limit = std::min<uint64_t>(max_tokens, static_cast<uint64_t>(std::max(backend.max_num_tokens(), 1)));
  if (backend.max_context() > 0) limit = std::min<uint64_t>(limit, static_cast<uint64_t>(backend.max_context()));
  const auto block = static_cast<uint64_t>(backend.block_size());
  for (const backend::KvPoolInfo& pool : backend.pools()) {
    limit = std::min<uint64_t>(limit, static_cast<uint64_t>(pool.device_blocks) * block);
  }
  return static_cast<uint32_t>(limit);
}

// One prefill of the first n positions of a sequence whose blocks are 0, 1, 2, ... in
// every pool, sampling its last token (a sampled token waits for the step on every backend,
// so the step's time is its compute). Returns its duration.
Result<DurationNs> TimeStep(backend::ModelBackend* backend, uint32_t n, const Clock* clock) {
  const std::vector<TokenId> tokens = CalibrationTokens(n, backend->config().vocab_size);
  const auto block = static_cast<uint32_t>(backend->block_size());
  std::vector<backend::BlockId> table((n + block - 1) / block);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<backend::BlockId>(i);
  backend::StepBatch batch;
  backend::SequenceStep& s = batch.seqs.emplace_back();
  s.tokens = tokens;
  s.start_position = 0;
  s.block_tables.assign(backend->pools().size(), std::span<const backend::BlockId>(table));
  s.context_end = n;
  s.sample = true;
  s.history = tokens;
  s.prompt_len = n;
  backend::StepOutput out;
  const TimeNs start = clock->Now();
  Status st = backend->Execute(batch, &out);
  const DurationNs d = clock->Now() - start;
  if (!st.ok()) return st.WithContext("a calibration prefill of " + std::to_string(n) + " tokens");
  return std::max<DurationNs>(d, 1);
}

double Rate(uint32_t tokens, DurationNs d) { return static_cast<double>(tokens) * kNsPerSec / static_cast<double>(d); }

}  // namespace

std::vector<TokenId> CalibrationTokens(uint32_t n, int64_t vocab_size) {
  std::vector<TokenId> tokens(n);
  const uint64_t vocab = static_cast<uint64_t>(std::max<int64_t>(vocab_size, 2));
  // Spread over the vocabulary (a prime stride), avoiding id 0 (often a special token).
  for (uint32_t i = 0; i < n; ++i) tokens[i] = static_cast<TokenId>(1 + (uint64_t{i} * 7919) % (vocab - 1));
  return tokens;
}

Result<PrefillCalibration> MeasurePrefillRate(backend::ModelBackend* backend, const PrefillCalibrationOptions& options,
                                              const Clock* clock) {
  PrefillCalibration out;
  const TimeNs start = clock->Now();
  const uint32_t largest = LargestStep(*backend, options.max_tokens);
  if (largest == 0) return FailedPrecondition("no prefill step fits the backend's KV pools");
  const auto bound = static_cast<DurationNs>(options.max_step_ms * static_cast<double>(kNsPerMs));
  uint32_t n = std::clamp<uint32_t>(options.first_tokens, 1, largest);

  KVF_ASSIGN_OR_RETURN(const DurationNs warmup, TimeStep(backend, n, clock));
  if (warmup >= options.budget) {
    // A backend this slow does not get the budget twice: its first step, first-run costs
    // and all, is the figure (a low one, which routes less there, never a 504).
    out.steps.push_back({n, warmup});
  } else {
    DurationNs timed = 0;
    for (;;) {
      KVF_ASSIGN_OR_RETURN(const DurationNs d, TimeStep(backend, n, clock));
      out.steps.push_back({n, d});
      timed += d;
      if ((bound > 0 && d > bound) || n >= largest) break;
      const uint32_t next = std::min<uint32_t>(2 * n, largest);
      const auto predicted = static_cast<DurationNs>(static_cast<double>(d) * next / n);
      if (timed + predicted > options.budget) break;
      n = next;
    }
  }

  const CalibrationStep last = out.steps.back();
  out.step_tokens = last.tokens;
  out.tokens_per_second = Rate(last.tokens, last.duration);
  if (bound > 0 && last.duration > bound && out.steps.size() >= 2) {
    // The step time between the last step within the bound and this one, taken as linear in
    // tokens: the largest step within the bound, as the scheduler would cut it.
    const CalibrationStep prev = out.steps[out.steps.size() - 2];
    out.step_tokens = prev.tokens;
    out.tokens_per_second = Rate(prev.tokens, prev.duration);
    const double slope = static_cast<double>(last.duration - prev.duration) / (last.tokens - prev.tokens);
    if (slope > 0) {
      const double fit = prev.tokens + static_cast<double>(bound - prev.duration) / slope;
      const auto tokens = static_cast<uint32_t>(std::clamp<double>(fit, prev.tokens, last.tokens));
      const double duration = static_cast<double>(prev.duration) + slope * (tokens - prev.tokens);
      out.step_tokens = tokens;
      out.tokens_per_second = tokens * static_cast<double>(kNsPerSec) / duration;
    }
  }
  out.elapsed = clock->Now() - start;
  return out;
}

}  // namespace kvfleet::engine
