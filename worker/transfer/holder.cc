// The holder's side of TransferService: pulls in on the ROUTER, refusals out (blocks out:
// serving.cc). Runs on the I/O thread only.
#include <algorithm>
#include <set>

#include "common/log.h"
#include "schema/limits.h"
#include "worker/transfer/transfer_service_impl.h"

namespace kvfleet::transfer {

namespace {

// A receiver's name for as long as its connection lasts: "receiver-" and its routing id in hex.
std::string PeerName(const std::string& identity) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string name = "receiver-";
  for (const char c : identity) {
    const auto byte = static_cast<unsigned char>(c);
    name += kDigits[byte >> 4];
    name += kDigits[byte & 15];
  }
  return name;
}

// Frees a sent frame's bytes; libzmq calls it, on its I/O thread, once the frame is written.
void FreeSentFrame(void* /*data*/, void* hint) { delete static_cast<std::string*>(hint); }

}  // namespace

bool SendTo(zmq::socket_t& router, const std::string& identity, std::string& frame, bool* gone) {
  *gone = false;
  try {
    if (!router.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
    // Once the identity part is accepted the message is committed; the body goes with it.
    auto* owned = new std::string(std::move(frame));
    frame.clear();
    zmq::message_t body(owned->data(), owned->size(), FreeSentFrame, owned);
    router.send(body, zmq::send_flags::dontwait);
    return true;
  } catch (const zmq::error_t&) {
    *gone = true;  // EHOSTUNREACH: no such peer (any more)
    return false;
  }
}

void TransferService::Impl::DrainRouter() {
  for (int i = 0; i < 256; ++i) {
    std::vector<zmq::message_t> parts;
    while (true) {
      zmq::message_t part;
      if (!router.recv(part, zmq::recv_flags::dontwait)) break;
      const bool more = part.more();
      if (parts.size() < 3) parts.push_back(std::move(part));  // the rest of a long message is dropped
      if (!more) break;
    }
    if (parts.empty()) return;
    HandleRequest(parts);
  }
}

void TransferService::Impl::HandleRequest(std::vector<zmq::message_t>& parts) {
  const std::string identity = parts[0].to_string();
  auto drop = [&](const std::string& why) {
    {
      std::lock_guard lock(mu);
      stats.dropped_frames++;
    }
    uint64_t suppressed = 0;
    if (log_limit.Allow(&suppressed)) Logger("transfer")->warn("dropped a pull frame: {} ({} more suppressed)", why, suppressed);
  };
  if (parts.size() < 2) return drop("no body");
  const zmq::message_t& body = parts[1];
  if (parts.size() != 2) {
    const uint64_t id = ReadTransferId(body.data(), body.size());
    if (id == 0) return drop("more than one frame");
    return SendRefusal(identity, id, RefusalReason::kMalformed, "a pull request is one frame");
  }
  auto request = DecodePullRequest(body.data(), body.size());
  if (!request.ok()) {
    const uint64_t id = ReadTransferId(body.data(), body.size());
    if (id == 0) return drop(request.status().message());
    const RefusalReason reason =
        request.status().code() == StatusCode::kOutOfRange ? RefusalReason::kTooLarge : RefusalReason::kMalformed;
    return SendRefusal(identity, id, reason, request.status().message());
  }
  if (request->release) return HandleRelease(identity, request->transfer_id);
  if (stopping.load()) {
    return SendRefusal(identity, request->transfer_id, RefusalReason::kShuttingDown, "the holder is shutting down");
  }
  // Device runs held count: each pins blocks of this holder's cache.
  const size_t inflight = open_pulls.size() + serving.size() + held.size();
  if (inflight >= options.max_inflight_pulls) {
    return SendRefusal(identity, request->transfer_id, RefusalReason::kBusy, std::to_string(inflight) + " pulls in flight");
  }
  auto [it, fresh] = token_of_identity.try_emplace(identity, next_peer_token);
  if (fresh) identity_of_token[next_peer_token++] = identity;
  const uint64_t token = it->second;
  const auto key = std::make_pair(token, request->transfer_id);
  if (open_pulls.count(key) != 0) {
    return SendRefusal(identity, request->transfer_id, RefusalReason::kMalformed, "transfer id already in flight");
  }
  const TimeNs deadline = clock->Now() + static_cast<DurationNs>(request->deadline_ms) * kNsPerMs;
  open_pulls[key] = OpenPull{*request, deadline};
  {
    std::lock_guard lock(mu);
    pulls_ready.push_back(IncomingPull{token, PeerName(identity), std::move(*request), deadline});
  }
  Notify();
}

void TransferService::Impl::SendRefusal(const std::string& identity, uint64_t transfer_id, RefusalReason reason,
                                        const std::string& message) {
  bool gone = false;
  std::string frame = EncodeRefused(transfer_id, reason, message);
  SendTo(router, identity, frame, &gone);  // a full queue: the deadline tells
  std::lock_guard lock(mu);
  stats.refused[static_cast<size_t>(reason)]++;
}

void TransferService::Impl::DoRefuse(RefuseCommand& cmd) {
  auto it = open_pulls.find({cmd.peer_token, cmd.transfer_id});
  if (it == open_pulls.end()) {
    std::lock_guard lock(mu);
    stats.stale_serves++;
    return;
  }
  open_pulls.erase(it);
  SendRefusal(identity_of_token.at(cmd.peer_token), cmd.transfer_id, cmd.reason, cmd.message);
}

std::optional<TransferService::Impl::OpenPull> TransferService::Impl::TakeOpenPull(uint64_t peer_token,
                                                                                  uint64_t transfer_id) {
  auto it = open_pulls.find({peer_token, transfer_id});
  std::optional<OpenPull> open;
  if (it != open_pulls.end()) {
    if (it->second.deadline >= clock->Now()) open = std::move(it->second);
    open_pulls.erase(it);
  }
  if (!open) {
    std::lock_guard lock(mu);
    stats.stale_serves++;
  }
  return open;
}

void TransferService::Impl::SweepOpenPulls(TimeNs now) {
  if (now < next_sweep) return;
  next_sweep = now + kNsPerSec;
  std::set<uint64_t> live;
  for (auto it = open_pulls.begin(); it != open_pulls.end();) {
    if (it->second.deadline + config::kOpenPullGrace < now) {
      it = open_pulls.erase(it);  // the receiver gave up long ago; a Serve now is stale
      continue;
    }
    live.insert(it->first.first);
    ++it;
  }
  // A held run's release must find its peer's token again.
  for (const auto& [key, until] : held) live.insert(key.first);
  std::set<std::string> sending;
  for (const Serving& s : serving) sending.insert(s.identity);
  for (auto it = identity_of_token.begin(); it != identity_of_token.end();) {
    if (live.count(it->first) != 0 || sending.count(it->second) != 0) {
      ++it;
      continue;
    }
    token_of_identity.erase(it->second);
    it = identity_of_token.erase(it);
  }
}

void TransferService::Impl::RefuseAllOpen(RefusalReason reason, const std::string& message) {
  for (const auto& [key, pull] : open_pulls) SendRefusal(identity_of_token.at(key.first), key.second, reason, message);
  open_pulls.clear();
}

}  // namespace kvfleet::transfer
