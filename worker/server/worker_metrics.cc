#include "worker/server/worker_metrics.h"

#include <string>

namespace kvfleet::server {

namespace {

// Engine steps: 1 ms (a small decode) to 10 s (a huge CPU prefill).
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}
prometheus::Histogram::BucketBoundaries TokenBuckets() {
  return {1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}
const char* ErrorCodeLabel(WorkerErrorCode code) {
  switch (code) {
    case WorkerErrorCode::kInvalidRequest: return "invalid_request";
    case WorkerErrorCode::kContextTooLong: return "context_too_long";
    case WorkerErrorCode::kUnknownLora: return "unknown_lora";
    case WorkerErrorCode::kOverloaded: return "overloaded";
    case WorkerErrorCode::kShuttingDown: return "shutting_down";
    case WorkerErrorCode::kInternal: return "internal";
    case WorkerErrorCode::kUnknownModel: return "unknown_model";
  }
  return "internal";
}

// TTFT: 5 ms (a prefix hit on a GPU) to a minute (a long queue).
prometheus::Histogram::BucketBoundaries TtftBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r)
    : kv_blocks_(prometheus::BuildGauge().Name("kvfleet_worker_kv_blocks").Help("KV cache blocks by tier and state").Register(r)),
      prefix_hit_(prometheus::BuildCounter()
                      .Name("kvfleet_worker_prefix_hit_tokens_total")
                      .Help("Prompt tokens served from the KV cache")
                      .Register(r)
                      .Add({})),
      prefix_miss_(prometheus::BuildCounter()
                       .Name("kvfleet_worker_prefix_miss_tokens_total")
                       .Help("Prompt tokens that had to be computed")
                       .Register(r)
                       .Add({})),
      evictions_(prometheus::BuildCounter()
                     .Name("kvfleet_worker_evictions_total")
                     .Help("Device KV blocks evicted, by retention priority")
                     .Register(r)),
      offloads_(prometheus::BuildCounter().Name("kvfleet_worker_offloads_total").Help("Blocks copied device -> host").Register(r).Add({})),
      onboards_(prometheus::BuildCounter().Name("kvfleet_worker_onboards_total").Help("Blocks copied host -> device").Register(r).Add({})),
      step_seconds_(prometheus::BuildHistogram()
                        .Name("kvfleet_worker_step_seconds")
                        .Help("Engine step duration")
                        .Register(r)
                        .Add({}, StepBuckets())),
      batch_tokens_(prometheus::BuildHistogram()
                        .Name("kvfleet_worker_batch_tokens")
                        .Help("Tokens computed per engine step")
                        .Register(r)
                        .Add({}, TokenBuckets())),
      requests_(prometheus::BuildGauge().Name("kvfleet_worker_requests").Help("Requests by state").Register(r)),
      preemptions_(prometheus::BuildCounter()
                       .Name("kvfleet_worker_preemptions_total")
                       .Help("Requests preempted for KV memory and recomputed")
                       .Register(r)
                       .Add({})),
      ttft_(prometheus::BuildHistogram()
                .Name("kvfleet_worker_time_to_first_token_seconds")
                .Help("Time from reading a request off the socket to handing its first token to the socket")
                .Register(r)
                .Add({}, TtftBuckets())),
      generated_(prometheus::BuildCounter().Name("kvfleet_worker_generated_tokens_total").Help("Tokens generated").Register(r).Add({})),
      finished_(prometheus::BuildCounter()
                    .Name("kvfleet_worker_requests_finished_total")
                    .Help("Requests finished, by reason")
                    .Register(r)),
      refused_(prometheus::BuildCounter()
                   .Name("kvfleet_worker_requests_refused_total")
                   .Help("Generates answered with an Error instead of a stream, by code (overloaded: queue full)")
                   .Register(r)),
      step_bound_(prometheus::BuildGauge()
                      .Name("kvfleet_worker_step_bound_seconds")
                      .Help("Longest a step may take while requests decode (--max-step-ms); 0: no bound")
                      .Register(r)
                      .Add({})),
      bounded_steps_(prometheus::BuildCounter()
                         .Name("kvfleet_worker_bounded_steps_total")
                         .Help("Engine steps whose prefill chunk the step bound cut")
                         .Register(r)
                         .Add({})),
      step_model_error_(prometheus::BuildGauge()
                            .Name("kvfleet_worker_step_model_error_ratio")
                            .Help("The step-time model's typical relative error on recent steps (floored at 0.02)")
                            .Register(r)
                            .Add({})),
      step_model_outliers_(prometheus::BuildCounter()
                               .Name("kvfleet_worker_step_model_outliers_total")
                               .Help("Measured steps the step-time model clipped as outliers (warm-up, captures)")
                               .Register(r)
                               .Add({})),
      lora_loads_(prometheus::BuildCounter()
                      .Name("kvfleet_worker_lora_loads_total")
                      .Help("LoRA adapter copies into a device slot")
                      .Register(r)
                      .Add({})),
      lora_load_seconds_(prometheus::BuildCounter()
                             .Name("kvfleet_worker_lora_load_seconds_total")
                             .Help("Time the LoRA adapter copies into device slots took")
                             .Register(r)
                             .Add({})) {
  auto& adapters = prometheus::BuildGauge()
                       .Name("kvfleet_worker_lora_adapters")
                       .Help("LoRA adapters served (loaded) and on the device (resident)")
                       .Register(r);
  lora_loaded_ = &adapters.Add({{"state", "loaded"}});
  lora_resident_ = &adapters.Add({{"state", "resident"}});
  refused_.Add({{"code", "overloaded"}});  // present at 0, so an alert on it has a series
  auto& terms = prometheus::BuildGauge()
                    .Name("kvfleet_worker_step_model_seconds")
                    .Help("Fitted step-time model: seconds per step (base) or per unit of each term")
                    .Register(r);
  const char* names[] = {"base", "prefill_step", "prefill_token", "decode_sequence", "kv_token", "prefill_pair"};
  for (size_t i = 0; i < step_model_.size(); ++i) step_model_[i] = &terms.Add({{"term", names[i]}});
  running_ = &requests_.Add({{"state", "running"}});
  waiting_ = &requests_.Add({{"state", "waiting"}});
  const char* states[3] = {"free", "in_use", "cached"};
  for (int t = 0; t < kv::kNumTiers; ++t) {
    for (int s = 0; s < 3; ++s) {
      kv_block_gauges_[t][s] = &kv_blocks_.Add({{"tier", kv::TierName(static_cast<kv::Tier>(t))}, {"state", states[s]}});
    }
  }
}

void WorkerMetrics::UpdateLoras(const engine::LoraRegistry& loras) {
  lora_loaded_->Set(static_cast<double>(loras.size()));
  lora_resident_->Set(static_cast<double>(loras.Resident().size()));
  const engine::LoraCounters& c = loras.counters();
  if (c.loads > seen_lora_loads_) lora_loads_.Increment(static_cast<double>(c.loads - seen_lora_loads_));
  if (c.load_seconds > seen_lora_load_seconds_) lora_load_seconds_.Increment(c.load_seconds - seen_lora_load_seconds_);
  seen_lora_loads_ = c.loads;
  seen_lora_load_seconds_ = c.load_seconds;
}

void WorkerMetrics::OnStep(const engine::StepReport& report) {
  if (report.batch_sequences > 0) {
    step_seconds_.Observe(static_cast<double>(report.duration) / kNsPerSec);
    batch_tokens_.Observe(report.batch_tokens);
  }
  running_->Set(report.load.active_requests);
  waiting_->Set(report.load.queued_requests);
  if (report.preemptions > 0) preemptions_.Increment(report.preemptions);
  if (report.time_bounded) bounded_steps_.Increment();
}

void WorkerMetrics::UpdateStepModel(const engine::StepTimeModel& model, double max_step_ms) {
  step_bound_.Set(max_step_ms / 1000);
  const engine::StepCoefficients& c = model.coefficients();
  const double us[] = {c.base_us,        c.prefill_step_us, c.prefill_token_us,
                       c.decode_seq_us,  c.kv_token_us,     c.prefill_pair_us};
  for (size_t i = 0; i < step_model_.size(); ++i) step_model_[i]->Set(us[i] * 1e-6);
  step_model_error_.Set(model.relative_error());
  if (model.outliers() > seen_outliers_) {
    step_model_outliers_.Increment(static_cast<double>(model.outliers() - seen_outliers_));
  }
  seen_outliers_ = model.outliers();
}

void WorkerMetrics::UpdateKv(const kv::KvStats& stats) {
  std::array<std::array<uint64_t, 3>, kv::kNumTiers> blocks{};
  uint64_t offloads = 0, onboards = 0;
  std::array<uint64_t, kv::kMaxPriority + 1> evictions{};
  for (const kv::PoolStats& pool : stats.pools) {
    for (int t = 0; t < kv::kNumTiers; ++t) {
      blocks[t][0] += pool.tiers[t].free;
      blocks[t][1] += pool.tiers[t].in_use;
      blocks[t][2] += pool.tiers[t].cached;
    }
    for (size_t p = 0; p < evictions.size(); ++p) evictions[p] += pool.tiers[0].evictions_by_priority[p];
    offloads += pool.offloads;
    onboards += pool.onboards;
  }
  for (int t = 0; t < kv::kNumTiers; ++t) {
    for (int s = 0; s < 3; ++s) kv_block_gauges_[t][s]->Set(static_cast<double>(blocks[t][s]));
  }
  auto advance = [](prometheus::Counter& c, uint64_t total, uint64_t* seen) {
    if (total > *seen) c.Increment(static_cast<double>(total - *seen));
    *seen = total;
  };
  advance(prefix_hit_, stats.reused_tokens, &seen_hit_);
  advance(prefix_miss_, stats.missed_tokens, &seen_miss_);
  advance(offloads_, offloads, &seen_offloads_);
  advance(onboards_, onboards, &seen_onboards_);
  for (size_t p = 0; p < evictions.size(); ++p) {
    if (evictions[p] == seen_evictions_[p]) continue;
    if (!evictions_by_priority_[p]) evictions_by_priority_[p] = &evictions_.Add({{"priority", std::to_string(p)}});
    advance(*evictions_by_priority_[p], evictions[p], &seen_evictions_[p]);
  }
}

void WorkerMetrics::OnFirstToken(DurationNs time_to_first_token) {
  ttft_.Observe(static_cast<double>(time_to_first_token) / kNsPerSec);
}

void WorkerMetrics::OnRefused(WorkerErrorCode code) { refused_.Add({{"code", ErrorCodeLabel(code)}}).Increment(); }

void WorkerMetrics::OnOutputs(const std::vector<engine::RequestOutput>& outputs) {
  for (const engine::RequestOutput& out : outputs) {
    if (!out.new_tokens.empty()) generated_.Increment(static_cast<double>(out.new_tokens.size()));
    if (out.last) {  // one per request, its last sequence's reason
      finished_.Add({{"reason", engine::FinishReasonName(out.finish)}}).Increment();
    }
  }
}

}  // namespace kvfleet::server
