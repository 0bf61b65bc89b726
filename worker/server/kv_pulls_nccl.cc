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

// The holder's name for a receiver: its connection on the holder's ROUTER.
std::string PeerOfToken(uint64_t peer_token) { return "receiver-" + std::to_string(peer_token); }

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
  t.peer = PeerOfToken(pull.peer_token);
  t.send = true;
  auto answered = answered_comm_.find(pull.peer_token);
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
  answered_comm_[pull.peer_token] = t.comm;
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
  service_->ServeNccl(pull.peer_token, r.transfer_id, std::move(out));
  return true;
}

void KvPulls::NcclAnswered(const transfer::Released& r) {
  auto it = nccl_held_.find({r.peer_token, r.transfer_id});
  if (it == nccl_held_.end()) return;
  NcclHeld& held = it->second;
  if (r.expired) {  // the answer never left: nothing will be received
    if (answered_comm_[r.peer_token] == held.transfer.comm && !held.transfer.unique_id.empty()) {
      answered_comm_.erase(r.peer_token);  // the receiver never learnt of that communicator
    }
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
  p.nccl_source = result.source;
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
        if (held != nccl_held_.end() && answered_comm_[s->second.first] == held->second.transfer.comm) {
          answered_comm_.erase(s->second.first);
        }
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
      service_->RecordNcclCopy(p.nccl_source, d.bytes, d.seconds);
      if (good < p.nccl_received) why = "token_mismatch";
    } else {
      Logger("transfer")->warn("pull {}: the NCCL receive failed: {}; its prefix is computed", transfer_id,
                               d.status.ToString());
      why = "nccl_failed";
    }
    Complete(p, good, why);
    pending_.erase(it);
  }
}

}  // namespace kvfleet::server
