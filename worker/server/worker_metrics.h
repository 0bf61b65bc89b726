// WorkerMetrics: the worker's Prometheus metrics (served on /metrics), updated by the
// engine thread after each step.
//
//   kvfleet_worker_kv_blocks{tier,state}            gauge: free, in_use, cached blocks
//   kvfleet_worker_prefix_hit_tokens_total          prompt tokens served from the cache
//   kvfleet_worker_prefix_miss_tokens_total         prompt tokens computed
//   kvfleet_worker_evictions_total{priority}        device blocks evicted, by retention priority
//   kvfleet_worker_offloads_total, _onboards_total  device <-> host block copies
//   kvfleet_worker_step_seconds                     histogram: engine step duration
//   kvfleet_worker_batch_tokens                     histogram: tokens computed per step
//   kvfleet_worker_requests{state}                  gauge: running, waiting
//   kvfleet_worker_preemptions_total
//   kvfleet_worker_time_to_first_token_seconds      histogram, measured inside the worker
//   kvfleet_worker_generated_tokens_total, kvfleet_worker_requests_finished_total{reason}
//   kvfleet_worker_step_bound_seconds               gauge: --max-step-ms (0: no bound)
//   kvfleet_worker_bounded_steps_total              steps whose prefill the bound cut
//   kvfleet_worker_step_model_seconds{term}         gauge: the fitted step-time model, seconds per
//                                                   step (base), per step with prefill
//                                                   (prefill_step), or per prefill_token,
//                                                   decode_sequence, kv_token, prefill_pair
//   kvfleet_worker_step_model_error_ratio           gauge: typical |measured - predicted| / predicted
//   kvfleet_worker_step_model_outliers_total        measured steps clipped as outliers
//   kvfleet_worker_requests_refused_total{code}     Generates answered with an Error, by its code
//                                                   (overloaded: the queue was full, --max-queued)
//   kvfleet_worker_lora_adapters{state}             gauge: LoRA adapters served (loaded) and in a
//                                                   device slot (resident)
//   kvfleet_worker_lora_loads_total                 adapter copies into a device slot
//   kvfleet_worker_lora_load_seconds_total          the time those copies took
//
// Thread safety: prometheus-cpp metrics are thread-safe; Update* run on the engine thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/clock.h"
#include "schema/requests.h"
#include "worker/engine/engine_stats.h"
#include "worker/engine/lora_registry.h"
#include "worker/engine/request.h"
#include "worker/engine/step_time_model.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::server {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  void OnStep(const engine::StepReport& report);
  // The KV gauges and counters from the manager's totals.
  void UpdateKv(const kv::KvStats& stats);
  // Generated tokens and finish reasons.
  void OnOutputs(const std::vector<engine::RequestOutput>& outputs);
  // A request's time to first token, as its Deltas report it (the request frame's read to
  // the first token handed to the socket). Thread-safe: the request socket's thread calls it.
  void OnFirstToken(DurationNs time_to_first_token);
  // The scheduler's step bound and its step-time model as fitted so far.
  void UpdateStepModel(const engine::StepTimeModel& model, double max_step_ms);
  // A Generate answered with an Error instead of a stream. Thread-safe.
  void OnRefused(WorkerErrorCode code);
  // The LoRA gauges and counters from the engine's adapter registry.
  void UpdateLoras(const engine::LoraRegistry& loras);

 private:
  prometheus::Family<prometheus::Gauge>& kv_blocks_;
  std::array<std::array<prometheus::Gauge*, 3>, kv::kNumTiers> kv_block_gauges_{};  // [tier][free,in_use,cached]
  prometheus::Counter& prefix_hit_;
  prometheus::Counter& prefix_miss_;
  prometheus::Family<prometheus::Counter>& evictions_;
  std::array<prometheus::Counter*, kv::kMaxPriority + 1> evictions_by_priority_{};  // created on first use
  prometheus::Counter& offloads_;
  prometheus::Counter& onboards_;
  prometheus::Histogram& step_seconds_;
  prometheus::Histogram& batch_tokens_;
  prometheus::Family<prometheus::Gauge>& requests_;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Counter& preemptions_;
  prometheus::Histogram& ttft_;
  prometheus::Counter& generated_;
  prometheus::Family<prometheus::Counter>& finished_;
  prometheus::Family<prometheus::Counter>& refused_;
  prometheus::Gauge& step_bound_;
  prometheus::Counter& bounded_steps_;
  std::array<prometheus::Gauge*, 6> step_model_{};  // base, prefill_step, prefill_token, decode_sequence, kv_token, prefill_pair
  prometheus::Gauge& step_model_error_;
  prometheus::Counter& step_model_outliers_;
  prometheus::Gauge* lora_loaded_ = nullptr;
  prometheus::Gauge* lora_resident_ = nullptr;
  prometheus::Counter& lora_loads_;
  prometheus::Counter& lora_load_seconds_;
  uint64_t seen_lora_loads_ = 0;
  double seen_lora_load_seconds_ = 0;

  // Last totals seen, to turn the manager's running totals into counter increments.
  uint64_t seen_hit_ = 0, seen_miss_ = 0, seen_offloads_ = 0, seen_onboards_ = 0, seen_outliers_ = 0;
  std::array<uint64_t, kv::kMaxPriority + 1> seen_evictions_{};
};

}  // namespace kvfleet::server
