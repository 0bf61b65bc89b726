// Router: pull options, a candidate worker with its prefix pulled from a holder (README.md,
// "Pulling a prefix").
#include <memory>
#include <optional>

#include "router/routing/router.h"

namespace kvfleet::router {

void Router::AddPulls(std::span<const Candidate> holders, double fleet_rate, std::vector<Candidate>* candidates) const {
  if (!(options().transfer_bytes_per_s > 0) || holders.size() < 2 || candidates->empty()) return;
  // Two sources at most. The stored one holds the longest run by its own events (a pull for
  // it is served at once). The computing one matches a longer run counting its predicted
  // entries, a prefix routed there a moment ago and not stored yet: its holder serves the pull
  // once its prefill has stored the blocks (worker/server/kv_pulls.h), so the pull waits for
  // the prefill queued ahead there.
  // Each candidate's run by its own events came with its match (PrefixMatch::held_blocks, one
  // walk of the prompt's blocks for every worker), not from a lookup per block per candidate.
  struct Source {
    const Candidate* c = nullptr;
    uint32_t run = 0;
    double ready_s = 0;
    std::shared_ptr<const TransferPeer> peer;
  };
  Source stored, computing;
  for (const Candidate& c : holders) {
    const uint32_t matched = c.device_blocks + c.host_blocks;
    const bool may_store = c.held_blocks > stored.run;
    const bool may_compute = matched > c.held_blocks && matched >= computing.run;
    if (!may_store && !may_compute) continue;  // most workers of a large fleet: no lookup
    std::shared_ptr<const TransferPeer> peer = loads_->Transfer(c.worker);
    if (!peer || peer->bytes_per_block == 0) continue;
    if (may_store) stored = Source{&c, c.held_blocks, 0, peer};
    if (may_compute) {
      // Its queue ahead computes the run, and some of that queue may have come after the run's
      // request: the run's own prediction, which expires the event lag after its predicted
      // first token, says when it is done, where the index keeps expiries.
      double ready_s = picker_.QueuedSeconds(c, fleet_rate);
      if (c.predicted_ms_left > 0) {
        const double lag_s = static_cast<double>(options().predicted_ttl) / kNsPerSec;
        ready_s = std::min(ready_s, std::max(0.0, c.predicted_ms_left / 1e3 - lag_s));
      }
      if (matched > computing.run || (matched == computing.run && ready_s < computing.ready_s)) {
        computing = Source{&c, matched, ready_s, std::move(peer)};
      }
    }
  }
  const size_t n = candidates->size();
  if (computing.run <= stored.run) computing.c = nullptr;  // the stored source brings as much, sooner
  const double pull_bias_s = options().calibrate_ttft ? calibration_.pull_bias_s() : 0;
  const PairReads reads = ReadPairs();
  for (const Source* source_of : {&stored, &computing}) {
    const Source& from = *source_of;
    if (from.c == nullptr) continue;
    const WorkerId source = from.c->worker;
    // Each candidate's transfer service is compared by ids (Candidate::transfer_format), not read.
    const uint32_t format = TransferNameId(from.peer->format);
    const uint32_t host = from.peer->host_id.empty() ? 0 : TransferNameId(from.peer->host_id);
    for (size_t i = 0; i < n; ++i) {
      const Candidate& c = (*candidates)[i];
      const uint32_t have = c.device_blocks + c.host_blocks;
      if (c.worker == source || have >= from.run) continue;
      if (c.transfer_format == 0 || c.transfer_format != format) continue;
      const bool same_host = host != 0 && host == c.transfer_host;
      Candidate pulled = WithPull(c, source, *from.peer, same_host, from.run - have, reads);
      pulled.pull_ready_s = from.ready_s;
      pulled.pull_s += from.ready_s;
      pulled.pull_bias_s = pull_bias_s;
      candidates->push_back(pulled);
    }
  }
}

Router::PairReads Router::ReadPairs() const {
  // The pairs' failures are read only while some are recent: a healthy fleet looks up no pair.
  const TimeNs now = clock_->Now();
  const TimeNs failed_at = loads_->LastPullFailure();
  const bool failures = failed_at > 0 && now - failed_at < config::kPullFailuresForgottenNs;
  return PairReads{now, options().transfer_measured || failures};
}

Candidate Router::WithPull(const Candidate& c, WorkerId source, const TransferPeer& peer, bool same_host, uint32_t blocks,
                           const PairReads& reads) const {
  const double bandwidth = same_host ? options().transfer_ipc_bytes_per_s : options().transfer_bytes_per_s;
  const double bytes = static_cast<double>(blocks) * static_cast<double>(peer.bytes_per_block);
  const PullCost prior{options().transfer_setup_s, 1.0 / bandwidth};
  const std::optional<PullFit> measured = reads.read ? loads_->MeasuredPulls(c.worker, peer.endpoint) : std::nullopt;
  Candidate pulled = c;
  pulled.pull_from = source;
  pulled.pull_blocks = blocks;
  pulled.device_blocks += blocks;
  pulled.pull_s = (measured && options().transfer_measured ? measured->Solve(prior, bytes) : prior).Seconds(bytes);
  if (measured) {
    pulled.pull_failed_share = measured->FailedShare(reads.now);
    pulled.pull_failed_s = measured->FailedSeconds();
  }
  return pulled;
}

}  // namespace kvfleet::router
