// TransferMetrics: the worker's KV transfer counters on /metrics (Contract 4), from the
// running totals of its TransferService and KvPulls:
//   kvfleet_worker_kv_pulls_total{source, outcome}     pulls made, by holder and how they ended
//   kvfleet_worker_kv_pulled_blocks_total{source}      blocks received from ok pulls
//   kvfleet_worker_kv_pulled_bytes_total{source}       their bytes (modelled ones on the mock)
//   kvfleet_worker_kv_pull_seconds_total{source}       the ok pulls' time: bytes over it is the pair's bandwidth
//   kvfleet_worker_kv_pull_fallbacks_total{reason}     pulls that brought less than asked: the rest was computed
//   kvfleet_worker_kv_imported_blocks_total            pulled blocks checked and stored
//   kvfleet_worker_kv_served_total{result}             pulls answered: served, or refused and why
//   kvfleet_worker_kv_served_bytes_total
//   kvfleet_worker_kv_device_pulls_total               pulls copied device to device (CUDA IPC, same host)
//   kvfleet_worker_kv_device_copy_{bytes,seconds}_total{source}   those copies
//   kvfleet_worker_kv_nccl_pulls_total                 pulls received by NCCL send/recv
//   kvfleet_worker_kv_nccl_copy_{bytes,seconds}_total{source}     those receives (set-up included)
//   kvfleet_worker_kv_nccl_send_failures_total         NCCL sends (as holder) that failed or timed out
//   kvfleet_worker_kv_nccl_communicators               peers this worker keeps an NCCL communicator with now
//   kvfleet_worker_kv_nccl_communicators_released_total  communicators let go (idle, or too many peers)
//   kvfleet_worker_kv_pulled_kept_blocks               pulled blocks kept for requests not admitted yet
//   kvfleet_worker_kv_pulls_in_flight                  pulls started here and not ended
//   kvfleet_worker_kv_pull_held_requests               requests held for them (not yet queued for admission)
//   kvfleet_worker_kv_serve_waits_total{ended}         pulls held for blocks this worker was computing:
//                                                      ended "stored", or "half_deadline" with part of the chain
//
// Thread safety: thread-compatible; the engine thread calls Update.
#pragma once

#include <map>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "worker/server/kv_pulls.h"
#include "worker/transfer/transfer_service.h"

namespace kvfleet::server {

class TransferMetrics {
 public:
  explicit TransferMetrics(prometheus::Registry& registry);
  // Brings the counters up to the totals.
  void Update(const KvPullStats& pulls, const transfer::TransferStats& service);

 private:
  // Adds `total` − what was seen under `key` to the counter.
  void Advance(prometheus::Family<prometheus::Counter>& family, const std::map<std::string, std::string>& labels,
               double total);

  prometheus::Family<prometheus::Counter>& pulls_;
  prometheus::Family<prometheus::Counter>& pulled_blocks_;
  prometheus::Family<prometheus::Counter>& pulled_bytes_;
  prometheus::Family<prometheus::Counter>& pull_seconds_;
  prometheus::Family<prometheus::Counter>& fallbacks_;
  prometheus::Family<prometheus::Counter>& imported_;
  prometheus::Family<prometheus::Counter>& served_;
  prometheus::Family<prometheus::Counter>& served_bytes_;
  prometheus::Family<prometheus::Counter>& device_pulls_;
  prometheus::Family<prometheus::Counter>& device_copy_bytes_;
  prometheus::Family<prometheus::Counter>& device_copy_seconds_;
  prometheus::Family<prometheus::Counter>& nccl_pulls_;
  prometheus::Family<prometheus::Counter>& nccl_copy_bytes_;
  prometheus::Family<prometheus::Counter>& nccl_copy_seconds_;
  prometheus::Family<prometheus::Counter>& nccl_send_failures_;
  prometheus::Family<prometheus::Counter>& serve_waits_;
  prometheus::Family<prometheus::Counter>& nccl_released_;
  prometheus::Gauge& nccl_communicators_;
  prometheus::Gauge& kept_blocks_;
  prometheus::Gauge& in_flight_;
  prometheus::Gauge& held_requests_;
  std::map<std::pair<const void*, std::map<std::string, std::string>>, double> seen_;
};

}  // namespace kvfleet::server
