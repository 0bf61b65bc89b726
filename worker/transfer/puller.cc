// The receiver's side of TransferService: pulls out on a DEALER per holder, blocks in,
// checked one by one and handed to the engine a frame at a time (arrivals), deadlines. Runs
// on the I/O thread only.
#include <algorithm>

#include "common/log.h"
#include "schema/limits.h"
#include "worker/transfer/transfer_service_impl.h"

namespace kvfleet::transfer {

void TransferService::Impl::DoPull(PullCommand& cmd) {
  const uint64_t id = cmd.request.transfer_id;
  auto fail = [&](PullOutcome outcome, Status status) {
    PullResult r;
    r.transfer_id = id;
    r.outcome = outcome;
    r.status = std::move(status);
    r.elapsed = clock->Now() - cmd.start;
    r.source = cmd.endpoint;
    PushResult(std::move(r));
  };
  if (stopping.load()) return fail(PullOutcome::kCancelled, CancelledStatus("the transfer service stopped"));
  if (pulls.size() + delayed.size() >= options.max_inflight_pulls) {
    return fail(PullOutcome::kBusy, ResourceExhausted(std::to_string(pulls.size() + delayed.size()) +
                                                      " pulls already in flight"));
  }
  // What the holder would refuse as malformed is caught here, before anything is sent.
  const std::string frame = EncodePullRequest(cmd.request);
  if (auto check = DecodePullRequest(frame.data(), frame.size()); !check.ok()) {
    return fail(PullOutcome::kInvalid, check.status());
  }
  if (!cmd.server_key.empty() && !options.keypair) {
    return fail(PullOutcome::kInvalid, InvalidArgument("the holder is a CURVE server but this worker has no key pair"));
  }
  const std::string key = cmd.endpoint + '\n' + cmd.server_key;
  auto it = sources.find(key);
  if (it == sources.end()) {
    auto dealer = std::make_unique<zmq::socket_t>(context, zmq::socket_type::dealer);
    try {
      dealer->set(zmq::sockopt::maxmsgsize, wire::limits::kMaxTransferBytes);
      dealer->set(zmq::sockopt::linger, 0);
      // Frames buffered from one holder before TCP pushes back: up to 64 MiB each.
      dealer->set(zmq::sockopt::rcvhwm, config::kFrameHwm);
      if (!cmd.server_key.empty()) {
        if (Status s = MakeCurveClient(*dealer, *options.keypair, cmd.server_key); !s.ok()) {
          return fail(PullOutcome::kInvalid, s);
        }
      }
      dealer->connect(cmd.endpoint);
    } catch (const zmq::error_t& e) {
      return fail(PullOutcome::kInvalid, InvalidArgument("holder " + cmd.endpoint + ": " + e.what()));
    }
    it = sources.emplace(key, Source{cmd.endpoint, std::move(dealer)}).first;
  }
  bool sent = false;
  try {
    sent = it->second.dealer->send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t& e) {
    return fail(PullOutcome::kInvalid, Unavailable("holder " + cmd.endpoint + ": " + e.what()));
  }
  if (!sent) return fail(PullOutcome::kBusy, ResourceExhausted("the queue to holder " + cmd.endpoint + " is full"));
  Pull pull;
  pull.deadline = cmd.start + static_cast<DurationNs>(cmd.request.deadline_ms) * kNsPerMs;
  pull.request = std::move(cmd.request);
  pull.source_key = key;
  pull.endpoint = cmd.endpoint;
  pull.start = cmd.start;
  pulls.emplace(id, std::move(pull));
}

void TransferService::Impl::DoCancel(uint64_t transfer_id) {
  if (pulls.count(transfer_id) != 0) {
    return FinishPull(transfer_id, PullOutcome::kCancelled, CancelledStatus("cancelled"));
  }
  for (auto it = delayed.begin(); it != delayed.end(); ++it) {
    if (it->second.transfer_id != transfer_id) continue;
    PullResult r = std::move(it->second);
    delayed.erase(it);
    r.outcome = PullOutcome::kCancelled;
    r.status = CancelledStatus("cancelled");
    r.streamed_blocks = 0;
    r.bytes = 0;
    return PushResult(std::move(r));
  }
}

void TransferService::Impl::DrainDealer(const std::string& source_key, zmq::socket_t& dealer) {
  for (int i = 0; i < 64; ++i) {
    {
      // The engine has kArrivalsAhead frames of blocks to take first: the rest wait (IoLoop).
      std::lock_guard lock(mu);
      if (arrivals_ready.size() >= config::kArrivalsAhead) return;
    }
    zmq::message_t frame;
    if (!dealer.recv(frame, zmq::recv_flags::dontwait)) return;
    bool extra = frame.more();
    while (extra) {  // a holder sends one frame per message: the rest is dropped
      zmq::message_t part;
      if (!dealer.recv(part, zmq::recv_flags::dontwait)) break;
      extra = part.more();
    }
    HandleReply(source_key, frame);
  }
}

void TransferService::Impl::HandleReply(const std::string& source_key, zmq::message_t& frame) {
  BlockFrame views;
  auto reply = DecodePullReply(frame.data(), frame.size(), &views);
  // A reply that cannot name its pull, or names one that ended (or another holder's), has
  // no pull to fail: it is counted and dropped.
  const uint64_t id = reply.ok() ? reply->transfer_id : 0;
  auto it = pulls.find(id);
  if (it == pulls.end() || it->second.source_key != source_key) {
    {
      std::lock_guard lock(mu);
      stats.late_frames++;
    }
    // A device run that came too late is still pinned at its holder: let it go now.
    if (reply.ok() && std::holds_alternative<DeviceRun>(reply->body)) SendRelease(source_key, id);
    // An nccl run that came too late is sent all the same: its communicator is spent.
    if (reply.ok() && std::holds_alternative<NcclRun>(reply->body)) AbandonNccl(source_key, id);
    return;
  }
  Pull& pull = it->second;
  if (!reply.ok()) return FinishPull(id, PullOutcome::kMalformed, reply.status());
  if (auto* refusal = std::get_if<Refusal>(&reply->body)) {
    return FinishPull(id, PullOutcome::kRefused,
                      Unavailable("refused " + std::string(RefusalReasonName(refusal->reason)) + ": " + refusal->message),
                      refusal->reason);
  }
  if (auto* run = std::get_if<DeviceRun>(&reply->body)) return HandleDeviceRun(id, std::move(*run));
  if (auto* run = std::get_if<NcclRun>(&reply->body)) return HandleNcclRun(id, std::move(*run));
  if (std::holds_alternative<std::vector<Block>>(reply->body)) {
    const uint32_t first = pull.received;
    for (const BlockView& b : views.blocks) {
      Status s = CheckBlock(pull.request, b, pull.received, true);
      if (!s.ok()) {
        const PullOutcome outcome = s.code() == StatusCode::kDataLoss ? PullOutcome::kBadChecksum : PullOutcome::kMalformed;
        return FinishPull(id, outcome, s);
      }
      ++pull.received;
    }
    if (views.blocks.empty()) return;
    // The views read the frame (in place) or the message's copy of it, and their tokens:
    // the arrival keeps all three (a moved vector keeps its buffer, so the views stay valid).
    struct Kept {
      zmq::message_t frame;
      std::shared_ptr<const void> message;
      std::vector<TokenId> tokens;
    };
    Arrival a;
    a.transfer_id = id;
    a.first = first;
    a.blocks = std::move(views.blocks);
    a.frame = std::make_shared<Kept>(Kept{std::move(frame), std::move(views.message), std::move(views.tokens)});
    {
      std::lock_guard lock(mu);
      arrivals_ready.push_back(std::move(a));
    }
    Notify();
    return;
  }
  const uint32_t count = std::get<Done>(reply->body).count;
  if (count != pull.received) {
    return FinishPull(id, PullOutcome::kMalformed,
                      DataLoss("done with " + std::to_string(count) + " blocks, " + std::to_string(pull.received) +
                               " arrived"));
  }
  FinishPull(id, PullOutcome::kOk, Status::Ok());
}

void TransferService::Impl::FinishPull(uint64_t id, PullOutcome outcome, Status status,
                                       std::optional<RefusalReason> refusal) {
  auto it = pulls.find(id);
  if (it == pulls.end()) return;
  Pull pull = std::move(it->second);
  pulls.erase(it);
  const TimeNs now = clock->Now();
  PullResult r;
  r.transfer_id = id;
  r.outcome = outcome;
  r.refusal = refusal;
  r.status = std::move(status);
  r.source = pull.endpoint;
  r.elapsed = now - pull.start;
  r.deadline = pull.deadline;
  if (outcome != PullOutcome::kOk) return PushResult(std::move(r));
  if (pull.nccl) {
    // Received by the engine over NCCL: no modelled link.
    r.bytes = pull.nccl->blocks.size() * pull.request.layout.BytesPerBlock();
    r.nccl = std::move(pull.nccl);
    return PushResult(std::move(r));
  }
  if (pull.device) {
    // Same host: no modelled link; the run is leased until released or its hold ends.
    r.bytes = pull.device->blocks.size() * pull.request.layout.BytesPerBlock();
    r.device = std::move(pull.device);
    leases[id] = Lease{pull.source_key, pull.deadline + config::kDeviceHoldGrace};
    return PushResult(std::move(r));
  }
  r.bytes = pull.received * pull.request.layout.BytesPerBlock();
  r.streamed_blocks = pull.received;
  const TimeNs ready = pull.start + ModelledTransferTime(r.bytes, options.simulated_bandwidth_bytes_per_s);
  if (ready <= now) return PushResult(std::move(r));
  if (ready > pull.deadline) {
    // The modelled link could not have carried the run in time: the pull fails at its deadline.
    r.outcome = PullOutcome::kDeadline;
    r.status = DeadlineStatus("a modelled " + std::to_string(r.bytes) + " bytes take past the deadline");
    r.streamed_blocks = 0;
    r.bytes = 0;
    r.elapsed = pull.deadline - pull.start;
    delayed.emplace_back(pull.deadline, std::move(r));
    return;
  }
  r.elapsed = ready - pull.start;
  delayed.emplace_back(ready, std::move(r));
}

TimeNs TransferService::Impl::CheckPullTimers(TimeNs now) {
  std::vector<uint64_t> expired;
  TimeNs next = 0;
  auto wait_for = [&](TimeNs t) { next = next == 0 ? t : std::min(next, t); };
  for (const auto& [id, pull] : pulls) {
    if (pull.deadline <= now) {
      expired.push_back(id);
    } else {
      wait_for(pull.deadline);
    }
  }
  for (uint64_t id : expired) {
    FinishPull(id, PullOutcome::kDeadline,
               DeadlineStatus("no answer from " + pulls.at(id).endpoint + " within " +
                                std::to_string(pulls.at(id).request.deadline_ms) + " ms"));
  }
  for (auto it = delayed.begin(); it != delayed.end();) {
    if (it->first <= now) {
      PushResult(std::move(it->second));
      it = delayed.erase(it);
    } else {
      wait_for(it->first);
      ++it;
    }
  }
  return next;
}

void TransferService::Impl::CancelAllPulls(const std::string& why) {
  std::vector<uint64_t> ids;
  for (const auto& [id, pull] : pulls) ids.push_back(id);
  for (uint64_t id : ids) FinishPull(id, PullOutcome::kCancelled, CancelledStatus(why));
  for (auto& [at, r] : delayed) {
    r.outcome = PullOutcome::kCancelled;
    r.status = CancelledStatus(why);
    r.streamed_blocks = 0;
    r.bytes = 0;
    PushResult(std::move(r));
  }
  delayed.clear();
}

}  // namespace kvfleet::transfer
