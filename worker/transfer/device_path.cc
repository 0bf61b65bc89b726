// The same-host device path of TransferService (Contract 4's `device` answer and release
// frame): the holder's held runs, the receiver's leases. Runs on the I/O thread only.
//
// Invariants (holder):
//   1. Every ServeDevice ends in exactly one Released: a run is in `held` from its send until
//      its release frame, its hold's end or Stop, and a run never sent is reported at once.
//   2. A release frame releases only a run held for the connection it came on.
#include "common/log.h"
#include "schema/limits.h"
#include "worker/transfer/transfer_service_impl.h"

namespace kvfleet::transfer {

void TransferService::Impl::ReportReleased(uint64_t peer_token, uint64_t transfer_id, bool expired) {
  {
    std::lock_guard lock(mu);
    releases_ready.push_back(Released{peer_token, transfer_id, expired});
    (expired ? stats.device_expired : stats.device_releases)++;
  }
  Notify();
}

void TransferService::Impl::DoServeDevice(ServeDeviceCommand& cmd) {
  const auto key = std::make_pair(cmd.peer_token, cmd.transfer_id);
  // Past the deadline the receiver would copy nothing.
  std::optional<OpenPull> open = TakeOpenPull(cmd.peer_token, cmd.transfer_id);
  if (!open) return ReportReleased(cmd.peer_token, cmd.transfer_id, true);
  const PullRequest& request = open->request;
  const TimeNs deadline = open->deadline;
  const std::string& identity = identity_of_token.at(cmd.peer_token);
  Status status = request.host_id.empty()
                      ? InvalidArgument("a device run for a receiver that gave no host id")
                      : CheckDeviceRun(request, cmd.run);
  std::string frame;
  if (status.ok()) {
    frame = EncodeDeviceRun(cmd.transfer_id, cmd.run);
    if (frame.size() > static_cast<size_t>(wire::limits::kMaxTransferBytes)) {
      status = OutOfRange("a device frame of " + std::to_string(frame.size()) + " bytes");
    }
  }
  if (!status.ok()) {
    Logger("transfer")->error("transfer {}: the engine served a device run that breaks Contract 4: {}", cmd.transfer_id,
                              status.message());
    SendRefusal(identity, cmd.transfer_id, RefusalReason::kMalformed, "holder error: " + status.message());
    return ReportReleased(cmd.peer_token, cmd.transfer_id, true);
  }
  bool gone = false;
  if (!SendTo(router, identity, frame, &gone)) {
    Logger("transfer")->info("transfer {}: the device run was not sent ({})", cmd.transfer_id,
                             gone ? "the receiver left" : "its queue is full");
    return ReportReleased(cmd.peer_token, cmd.transfer_id, true);
  }
  held[key] = deadline + config::kDeviceHoldGrace;
  std::lock_guard lock(mu);
  stats.served_device++;
}

void TransferService::Impl::HandleRelease(const std::string& identity, uint64_t transfer_id) {
  auto token = token_of_identity.find(identity);
  auto it = token == token_of_identity.end() ? held.end() : held.find({token->second, transfer_id});
  if (it == held.end()) {
    // Another peer's transfer, one already expired, or a duplicate: nothing of this peer's to let go.
    std::lock_guard lock(mu);
    stats.stray_releases++;
    return;
  }
  const auto [peer_token, id] = it->first;
  held.erase(it);
  ReportReleased(peer_token, id, false);
}

bool TransferService::Impl::SweepHeld(TimeNs now) {
  for (auto it = held.begin(); it != held.end();) {
    if (it->second < now) {
      const auto [peer_token, id] = it->first;
      it = held.erase(it);
      ReportReleased(peer_token, id, true);
    } else {
      ++it;
    }
  }
  return !held.empty();
}

void TransferService::Impl::ReleaseAllHeld() {
  auto all = std::move(held);
  held.clear();
  for (const auto& [key, until] : all) ReportReleased(key.first, key.second, true);
}

void TransferService::Impl::HandleDeviceRun(uint64_t id, DeviceRun run) {
  Pull& pull = pulls.at(id);
  const std::string source_key = pull.source_key;
  Status status = Status::Ok();
  if (pull.request.host_id.empty()) {
    status = InvalidArgument("a device answer to a pull that gave no host id");
  } else if (pull.received > 0 || pull.device) {
    status = InvalidArgument("a device answer after other replies");
  } else {
    status = CheckDeviceRun(pull.request, run);
  }
  if (!status.ok()) {
    FinishPull(id, PullOutcome::kMalformed, status);
    return SendRelease(source_key, id);  // nothing will be copied: the holder may unpin
  }
  pull.device = std::move(run);
  FinishPull(id, PullOutcome::kOk, Status::Ok());
}

void TransferService::Impl::DoRelease(uint64_t transfer_id) {
  auto it = leases.find(transfer_id);
  if (it == leases.end()) return;
  const std::string source_key = std::move(it->second.source_key);
  leases.erase(it);
  SendRelease(source_key, transfer_id);
}

void TransferService::Impl::SendRelease(const std::string& source_key, uint64_t transfer_id) {
  auto it = sources.find(source_key);
  if (it == sources.end()) return;
  const std::string frame = EncodeRelease(transfer_id);
  try {
    // A full queue drops it: the holder lets the run go at its hold's end anyway.
    (void)it->second.dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    Logger("transfer")->info("transfer {}: release not sent: {}", transfer_id, e.what());
  }
}

void TransferService::Impl::ExpireLeases(TimeNs now) {
  std::erase_if(leases, [now](const auto& entry) { return entry.second.expires < now; });
}

}  // namespace kvfleet::transfer
