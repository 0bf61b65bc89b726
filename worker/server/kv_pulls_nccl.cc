// KvPulls' NCCL path (kv_pulls.h): the holder's answer and send, the receiver's receive.
//
// Order is what keeps the pair's communicator honest: a holder sends runs in the order its
// answers left (TakeReleases reports them in that order), a receiver posts receives in the
// order the answers arrived (TakeResults), and KvNccl runs each side's transfers in the order
// submitted. An answer a side will not move (the receiver's pull ended, a failed transfer)
// retires the communicator on that side: the next pull between the pair sets up a new one.
#include <algorithm>

#include "common/log.h"
#include "worker/server/kv_pulls.h"

namespace kvfleet::server {

namespace {

DurationNs AtLeast(DurationNs d, DurationNs floor) { return std::max(d, floor); }

}  // namespace

bool KvPulls::ServeNccl(const transfer::IncomingPull& pull) {
  const transfer::PullRequest& r = pull.request;
  const auto key = std::pair(pull.peer_token, r.transfer_id);
  if (!nccl() || !r.nccl || nccl_held_.count(key) != 0) return false;
  std::vector<kv::ExportedBlock> run = PinDeviceRun(r);
  if (run.empty()) return false;
  NcclHeld held;
  backend::KvNccl::Transfer& t = held.transfer;
  t.peer = pull.peer;
  t.send = true;
  auto answered = answered_comm_.find(pull.peer);
  if (r.nccl_comm != 0 && answered != answered_comm_.end() && answered->second == r.nccl_comm) {
    t.comm = r.nccl_comm;  // the pair's communicator, which both sides still keep
  } else {
    Result<std::string> id = nccl_->NewUniqueId();
    if (!id.ok()) {
      Logger("transfer")->warn("pull {}: no NCCL communicator ({}); answered with bytes", r.transfer_id,
                               id.status().ToString());
      kv_->UnpinChain(run);
      return false;
    }
    t.comm = next_comm_++;
    t.unique_id = std::move(*id);
  }
  answered_comm_[pull.peer] = t.comm;
  TouchNcclPeer(pull.peer);
  transfer::NcclRun out;
  out.comm = t.comm;
  out.unique_id = t.unique_id;
  t.blocks.resize(layout_->pools.size());
  for (size_t i = 0; i < run.size(); ++i) {
    out.blocks.push_back(transfer::DeviceBlock{static_cast<uint32_t>(i), run[i].hash, run[i].tokens, {}});
    for (size_t p = 0; p < run[i].pools.size(); ++p) t.blocks[p].push_back(run[i].pools[p].block);
  }
  held.run = std::move(run);
  held.deadline = pull.deadline;
  nccl_held_.emplace(key, std::move(held));
  ++stats_.served_requests;
  ++stats_.nccl_served;
  Logger("transfer")->debug("pull {}: answered by NCCL, {} blocks on communicator {}{}", r.transfer_id,
                            out.blocks.size(), out.comm, out.unique_id.empty() ? "" : " (new)");
  service_->ServeNccl(pull.peer_token, r.transfer_id, std::move(out));
  return true;
}

void KvPulls::NcclAnswered(const transfer::Released& r) {
  auto it = nccl_held_.find({r.peer_token, r.transfer_id});
  if (it == nccl_held_.end()) return;
  NcclHeld& held = it->second;
  if (r.expired) {  // the answer never left: nothing will be received
    if (!held.transfer.unique_id.empty()) Unanswer(held.transfer);  // the receiver never learnt of it
    kv_->UnpinChain(held.run);
    nccl_held_.erase(it);
    return;
  }
  // Pinned until the send ends, and no longer than the receiver's pull (its deadline plus
  // the grace a device run gets), or a communicator's set-up.
  backend::KvNccl::Transfer t = held.transfer;
  t.id = next_nccl_id_++;
  const DurationNs left = held.deadline + transfer::config::kDeviceHoldGrace - service_->Now();
  t.timeout = AtLeast(left, t.unique_id.empty() ? kNsPerMs : config::kNcclSetupTimeout + transfer::config::kDeviceHoldGrace / 2);
  nccl_sending_.emplace(t.id, it->first);
  Logger("transfer")->debug("pull {}: the NCCL answer left; send {} submitted", r.transfer_id, t.id);
  nccl_->Submit(std::move(t));
}

bool KvPulls::ReceiveNccl(Pending& p, const transfer::PullResult& result) {
  const transfer::NcclRun& run = *result.nccl;
  if (nccl_ == nullptr || run.blocks.empty()) {
    if (nccl_ != nullptr && !run.unique_id.empty()) {
      // Nothing follows an empty run; a new communicator named in it is still to be set up by
      // both sides, or neither: this side retires it.
      nccl_->Forget(result.source);
    }
    return false;
  }
  if (run.unique_id.empty() && nccl_->CommFor(result.source) != run.comm) {
    // A communicator this side no longer keeps: the holder sends on one nobody receives on.
    nccl_->Forget(result.source);
    return false;
  }
  const uint32_t received = static_cast<uint32_t>(run.blocks.size());
  p.nccl_received = received;
  p.nccl_good = CountGood(p, result, received);
  TouchNcclPeer(p.source);
  // Every block of the run is received (the holder sends them all), into the blocks allocated
  // for the chain: the ones past a token mismatch are not imported.
  backend::KvNccl::Transfer t;
  t.id = next_nccl_id_++;
  t.peer = result.source;
  t.comm = run.comm;
  t.unique_id = run.unique_id;
  t.send = false;
  t.blocks.resize(layout_->pools.size());
  for (size_t pool = 0; pool < layout_->pools.size(); ++pool) {
    const kv::PoolView view = kv_->View(p.plan.seq, static_cast<uint32_t>(pool));
    for (uint32_t j = 0; j < received; ++j) t.blocks[pool].push_back(view.linear[p.plan.first_block + j]);
  }
  // The holder keeps the run a grace past the deadline; this side waits half of it (as a
  // device copy does), or a communicator's set-up.
  const DurationNs left = result.deadline + transfer::config::kDeviceHoldGrace / 2 - service_->Now();
  t.timeout = AtLeast(left, t.unique_id.empty() ? kNsPerMs : config::kNcclSetupTimeout);
  nccl_receiving_.emplace(t.id, result.transfer_id);
  Logger("transfer")->debug("pull {}: NCCL answer from {}, {} blocks; receive {} submitted", result.transfer_id,
                            result.source, received, t.id);
  nccl_->Submit(std::move(t));
  return true;
}

void KvPulls::PollNccl() {
  if (nccl_ == nullptr) return;
  for (const backend::KvNccl::Done& d : nccl_->TakeDone()) {
    if (auto s = nccl_sending_.find(d.id); s != nccl_sending_.end()) {
      auto held = nccl_held_.find(s->second);
      if (!d.status.ok()) {
        ++stats_.nccl_send_failures;
        Logger("transfer")->warn("pull {}: the NCCL send failed: {}", s->second.second, d.status.ToString());
        if (held != nccl_held_.end()) Unanswer(held->second.transfer);
      }
      if (held != nccl_held_.end()) {
        kv_->UnpinChain(held->second.run);
        nccl_held_.erase(held);
      }
      nccl_sending_.erase(s);
      continue;
    }
    auto r = nccl_receiving_.find(d.id);
    if (r == nccl_receiving_.end()) continue;
    const uint64_t transfer_id = r->second;
    nccl_receiving_.erase(r);
    auto it = pending_.find(transfer_id);
    if (it == pending_.end()) continue;
    Pending& p = it->second;
    uint32_t good = 0;
    std::string why = "short";
    if (d.status.ok()) {
      good = p.nccl_good;
      ++stats_.nccl_pulls;
      service_->RecordNcclCopy(p.source, d.bytes, d.seconds);
      if (good < p.nccl_received) why = "token_mismatch";
    } else {
      Logger("transfer")->warn("pull {}: the NCCL receive failed: {}; its prefix is computed", transfer_id,
                               d.status.ToString());
      why = "nccl_failed";
    }
    Complete(p, good, why, d.status);
    pending_.erase(it);
  }
  ForgetIdleNcclPeers();
}

void KvPulls::Unanswer(const backend::KvNccl::Transfer& t) {
  auto it = answered_comm_.find(t.peer);
  if (it != answered_comm_.end() && it->second == t.comm) answered_comm_.erase(it);
}

void KvPulls::TouchNcclPeer(const std::string& peer) {
  nccl_peer_used_[peer] = service_->Now();
  stats_.nccl_peers = nccl_peer_used_.size();
}

bool KvPulls::NcclPeerBusy(const std::string& peer) const {
  // A pull in flight may name the pair's communicator (its request's nccl_comm), or an
  // answer may be about to use it: forgetting it then would leave the other side's half of a
  // transfer unmatched until its deadline.
  for (const auto& [id, p] : pending_) {
    if (p.source == peer) return true;
  }
  for (const auto& [key, held] : nccl_held_) {
    if (held.transfer.peer == peer) return true;
  }
  return false;
}

void KvPulls::ForgetIdleNcclPeers() {
  const TimeNs now = service_->Now();
  if (now < next_nccl_sweep_) return;
  next_nccl_sweep_ = now + std::min(kNsPerSec, options_.nccl_peer_idle);
  auto forget = [&](std::map<std::string, TimeNs>::iterator it, const char* why) {
    Logger("transfer")->debug("NCCL communicator with {} let go ({})", it->first, why);
    nccl_->Forget(it->first);
    answered_comm_.erase(it->first);
    ++stats_.nccl_peers_forgotten;
    return nccl_peer_used_.erase(it);
  };
  for (auto it = nccl_peer_used_.begin(); it != nccl_peer_used_.end();) {
    it = now - it->second > options_.nccl_peer_idle && !NcclPeerBusy(it->first) ? forget(it, "idle") : std::next(it);
  }
  while (nccl_peer_used_.size() > options_.max_nccl_peers) {
    auto oldest = nccl_peer_used_.end();
    for (auto it = nccl_peer_used_.begin(); it != nccl_peer_used_.end(); ++it) {
      if (!NcclPeerBusy(it->first) && (oldest == nccl_peer_used_.end() || it->second < oldest->second)) oldest = it;
    }
    if (oldest == nccl_peer_used_.end()) break;  // every one in use: the next sweep
    forget(oldest, "the least recently used of too many");
  }
  stats_.nccl_peers = nccl_peer_used_.size();
}

}  // namespace kvfleet::server
