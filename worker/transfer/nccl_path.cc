// The NCCL path of TransferService (Contract 4's `nccl` answer): the holder's frame and its
// Released report, the receiver's checks. The blocks themselves move outside the service, by
// NCCL send/recv on the engines' side (worker/server/kv_pulls_nccl.cc). Runs on the I/O
// thread only.
//
// Invariants:
//   1. Every ServeNccl ends in exactly one Released{nccl=true}, in the order its frames leave.
//   2. Every `nccl` answer a receiver gets is either handed to its engine as an ok PullResult
//      with `nccl` set, or reported `nccl_abandoned`: the engine receives every run its
//      holder sends on a communicator, or stops using that communicator.
#include "common/log.h"
#include "schema/limits.h"
#include "worker/transfer/transfer_service_impl.h"

namespace kvfleet::transfer {

void TransferService::Impl::DoServeNccl(ServeNcclCommand& cmd) {
  auto report = [&](bool sent) {
    {
      std::lock_guard lock(mu);
      releases_ready.push_back(Released{cmd.peer_token, cmd.transfer_id, !sent, true});
      if (sent) stats.served_nccl++;
    }
    Notify();
  };
  std::optional<OpenPull> open = TakeOpenPull(cmd.peer_token, cmd.transfer_id);
  if (!open) return report(false);
  const std::string& identity = identity_of_token.at(cmd.peer_token);
  Status status = CheckNcclRun(open->request, cmd.run);
  std::string frame;
  if (status.ok()) {
    frame = EncodeNcclRun(cmd.transfer_id, cmd.run);
    if (frame.size() > static_cast<size_t>(wire::limits::kMaxTransferBytes)) {
      status = OutOfRange("an nccl frame of " + std::to_string(frame.size()) + " bytes");
    }
  }
  if (!status.ok()) {
    Logger("transfer")->error("transfer {}: the engine served an nccl run that breaks Contract 4: {}", cmd.transfer_id,
                              status.message());
    SendRefusal(identity, cmd.transfer_id, RefusalReason::kMalformed, "holder error: " + status.message());
    return report(false);
  }
  bool gone = false;
  if (!SendTo(router, identity, frame, &gone)) {
    Logger("transfer")->info("transfer {}: the nccl answer was not sent ({})", cmd.transfer_id,
                             gone ? "the receiver left" : "its queue is full");
    return report(false);
  }
  report(true);
}

void TransferService::Impl::HandleNcclRun(uint64_t id, NcclRun run) {
  Pull& pull = pulls.at(id);
  Status status = pull.received > 0 || pull.device || pull.nccl
                      ? InvalidArgument("an nccl answer after other replies")
                      : CheckNcclRun(pull.request, run);
  if (!status.ok()) {
    // The holder may send the run all the same: the result says its communicator is spent.
    PullResult r;
    r.transfer_id = id;
    r.outcome = PullOutcome::kMalformed;
    r.status = std::move(status);
    r.source = pull.endpoint;
    r.elapsed = clock->Now() - pull.start;
    r.deadline = pull.deadline;
    r.nccl_abandoned = true;
    pulls.erase(id);
    return PushResult(std::move(r));
  }
  pull.nccl = std::move(run);
  FinishPull(id, PullOutcome::kOk, Status::Ok());
}

void TransferService::Impl::AbandonNccl(const std::string& source_key, uint64_t transfer_id) {
  auto source = sources.find(source_key);
  if (source == sources.end()) return;
  PullResult r;
  r.transfer_id = transfer_id;
  r.outcome = PullOutcome::kCancelled;
  r.status = CancelledStatus("an nccl answer after its pull ended");
  r.source = source->second.endpoint;
  r.nccl_abandoned = true;
  {
    std::lock_guard lock(mu);  // not CountPull: the pull's own result was counted
    stats.late_nccl++;
    results_ready.push_back(std::move(r));
  }
  Notify();
}

}  // namespace kvfleet::transfer
