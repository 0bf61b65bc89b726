#include "worker/server/transfer_metrics.h"

namespace kvfleet::server {

namespace {

prometheus::Family<prometheus::Counter>& Counter(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

}  // namespace

TransferMetrics::TransferMetrics(prometheus::Registry& r)
    : pulls_(Counter(r, "kvfleet_worker_kv_pulls_total", "KV pulls this worker made, by holder and outcome")),
      pulled_blocks_(Counter(r, "kvfleet_worker_kv_pulled_blocks_total", "KV blocks received from successful pulls")),
      pulled_bytes_(Counter(r, "kvfleet_worker_kv_pulled_bytes_total", "Bytes of KV blocks received from successful pulls")),
      pull_seconds_(Counter(r, "kvfleet_worker_kv_pull_seconds_total", "Time of successful pulls, start to done")),
      fallbacks_(Counter(r, "kvfleet_worker_kv_pull_fallbacks_total",
                         "Pulls that brought less than asked (the rest was computed), by reason")),
      imported_(Counter(r, "kvfleet_worker_kv_imported_blocks_total", "Pulled KV blocks checked and stored")),
      served_(Counter(r, "kvfleet_worker_kv_served_total", "Pulls from other workers answered, by result")),
      served_bytes_(Counter(r, "kvfleet_worker_kv_served_bytes_total", "Bytes of KV blocks sent to other workers")),
      device_pulls_(Counter(r, "kvfleet_worker_kv_device_pulls_total",
                            "Pulls answered with the holder's device blocks and copied device to device (same host)")),
      device_copy_bytes_(Counter(r, "kvfleet_worker_kv_device_copy_bytes_total",
                                 "Bytes of pulled KV blocks copied device to device from the holder's pools")),
      device_copy_seconds_(Counter(r, "kvfleet_worker_kv_device_copy_seconds_total",
                                   "Time of those device-to-device copies (bytes over time: the pair's bandwidth)")),
      nccl_pulls_(Counter(r, "kvfleet_worker_kv_nccl_pulls_total",
                          "Pulls whose blocks the holder sent by NCCL and this worker received into its pools")),
      nccl_copy_bytes_(Counter(r, "kvfleet_worker_kv_nccl_copy_bytes_total",
                               "Bytes of pulled KV blocks received by NCCL from the holder's pools")),
      nccl_copy_seconds_(Counter(r, "kvfleet_worker_kv_nccl_copy_seconds_total",
                                 "Time of those NCCL receives, a communicator's set-up included")),
      nccl_send_failures_(Counter(r, "kvfleet_worker_kv_nccl_send_failures_total",
                                  "NCCL sends of pulled runs (this worker the holder) that failed or timed out")),
      serve_waits_(Counter(r, "kvfleet_worker_kv_serve_waits_total",
                           "Pulls held until blocks this worker was computing were stored, by how the wait ended")),
      nccl_released_(Counter(r, "kvfleet_worker_kv_nccl_communicators_released_total",
                             "NCCL communicators with other workers let go: idle, or more peers than a worker keeps")),
      nccl_communicators_(prometheus::BuildGauge()
                              .Name("kvfleet_worker_kv_nccl_communicators")
                              .Help("Workers this worker keeps an NCCL communicator with (each holds device memory)")
                              .Register(r)
                              .Add({})),
      kept_blocks_(prometheus::BuildGauge()
                       .Name("kvfleet_worker_kv_pulled_kept_blocks")
                       .Help("KV blocks pulled here and kept for requests not admitted yet (evicted by nothing)")
                       .Register(r)
                       .Add({})),
      in_flight_(prometheus::BuildGauge()
                     .Name("kvfleet_worker_kv_pulls_in_flight")
                     .Help("KV pulls this worker has started and not ended")
                     .Register(r)
                     .Add({})),
      held_requests_(prometheus::BuildGauge()
                         .Name("kvfleet_worker_kv_pull_held_requests")
                         .Help("Requests held for a KV pull in flight, theirs or another's, before they queue "
                               "for admission (not in kvfleet_worker_requests)")
                         .Register(r)
                         .Add({})) {}

void TransferMetrics::Advance(prometheus::Family<prometheus::Counter>& family,
                              const std::map<std::string, std::string>& labels, double total) {
  double& seen = seen_[{&family, labels}];
  if (total > seen) family.Add(labels).Increment(total - seen);
  seen = std::max(seen, total);
}

void TransferMetrics::Update(const KvPullStats& pulls, const transfer::TransferStats& service) {
  for (const auto& [source, s] : service.pulls) {
    for (size_t o = 0; o < transfer::kNumPullOutcomes; ++o) {
      if (s.by_outcome[o] == 0) continue;
      const auto outcome = std::string(transfer::PullOutcomeName(static_cast<transfer::PullOutcome>(o)));
      Advance(pulls_, {{"source", source}, {"outcome", outcome}}, static_cast<double>(s.by_outcome[o]));
    }
    Advance(pulled_blocks_, {{"source", source}}, static_cast<double>(s.blocks));
    Advance(pulled_bytes_, {{"source", source}}, static_cast<double>(s.bytes));
    Advance(pull_seconds_, {{"source", source}}, s.seconds);
    if (s.device_copy_bytes > 0) {
      Advance(device_copy_bytes_, {{"source", source}}, static_cast<double>(s.device_copy_bytes));
      Advance(device_copy_seconds_, {{"source", source}}, s.device_copy_seconds);
    }
    if (s.nccl_copy_bytes > 0) {
      Advance(nccl_copy_bytes_, {{"source", source}}, static_cast<double>(s.nccl_copy_bytes));
      Advance(nccl_copy_seconds_, {{"source", source}}, s.nccl_copy_seconds);
    }
  }
  for (const auto& [reason, n] : pulls.fallbacks) Advance(fallbacks_, {{"reason", reason}}, static_cast<double>(n));
  Advance(imported_, {}, static_cast<double>(pulls.imported_blocks));
  Advance(served_, {{"result", "served"}}, static_cast<double>(service.served));
  Advance(served_, {{"result", "served_device"}}, static_cast<double>(pulls.device_served));
  Advance(served_, {{"result", "served_nccl"}}, static_cast<double>(pulls.nccl_served));
  Advance(device_pulls_, {}, static_cast<double>(pulls.device_pulls));
  Advance(nccl_pulls_, {}, static_cast<double>(pulls.nccl_pulls));
  Advance(nccl_send_failures_, {}, static_cast<double>(pulls.nccl_send_failures));
  Advance(nccl_released_, {}, static_cast<double>(pulls.nccl_peers_forgotten));
  nccl_communicators_.Set(static_cast<double>(pulls.nccl_peers));
  kept_blocks_.Set(static_cast<double>(pulls.kept_blocks));
  in_flight_.Set(static_cast<double>(pulls.in_flight));
  held_requests_.Set(static_cast<double>(pulls.held_requests));
  Advance(serve_waits_, {{"ended", "half_deadline"}}, static_cast<double>(pulls.serve_waits_cut));
  Advance(serve_waits_, {{"ended", "stored"}}, static_cast<double>(pulls.serve_waits_stored));
  for (size_t r = 0; r < transfer::kNumRefusalReasons; ++r) {
    if (service.refused[r] == 0) continue;
    const auto reason = std::string(transfer::RefusalReasonName(static_cast<transfer::RefusalReason>(r)));
    Advance(served_, {{"result", "refused_" + reason}}, static_cast<double>(service.refused[r]));
  }
  Advance(served_bytes_, {}, static_cast<double>(service.served_bytes));
}

}  // namespace kvfleet::server
