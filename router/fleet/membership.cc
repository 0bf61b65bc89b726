#include "router/fleet/membership.h"

#include <algorithm>
#include <vector>

namespace kvfleet::router {

Status Membership::AdmitHello(const WorkerHello& hello, const RegistrationPeer& peer, TimeNs now) {
  if (now - pruned_at_ >= lease_) Prune(now);
  auto held = claims_.find(hello.name);
  if (held != claims_.end() && held->second.identity != peer.identity && Fresh(held->second, now)) {
    return FailedPrecondition("worker id '" + hello.name + "' is registered by another peer");
  }
  const std::string endpoints[3] = {hello.requests_endpoint, hello.events_endpoint, hello.replay_endpoint};
  std::vector<std::string> lapsed;
  for (const std::string& ep : endpoints) {
    if (ep.empty()) continue;
    auto owner = endpoints_.find(ep);
    if (owner == endpoints_.end() || owner->second == hello.name) continue;
    const Claim& other = claims_.at(owner->second);
    if (Fresh(other, now)) {
      return FailedPrecondition("endpoint " + ep + " belongs to live worker '" + owner->second + "'");
    }
    lapsed.push_back(owner->second);
  }
  for (const std::string& name : lapsed) Drop(name);
  Drop(hello.name);  // its endpoints may have changed
  Claim& claim = claims_[hello.name];
  claim.identity = peer.identity;
  claim.last_hello = now;
  claim.epoch = hello.epoch;
  for (int i = 0; i < 3; ++i) {
    claim.endpoints[i] = endpoints[i];
    if (!endpoints[i].empty()) endpoints_[endpoints[i]] = hello.name;
  }
  return Status::Ok();
}

Status Membership::AdmitBye(const WorkerBye& bye, const RegistrationPeer& peer) {
  auto held = claims_.find(bye.name);
  if (held == claims_.end()) return FailedPrecondition("bye for worker '" + bye.name + "', which no peer registered");
  if (held->second.identity != peer.identity) {
    return FailedPrecondition("bye for worker '" + bye.name + "' from a peer other than the one that registered it");
  }
  if (bye.epoch != 0 && held->second.epoch != 0 && bye.epoch != held->second.epoch) {
    return NotFound("bye from an earlier run of worker '" + bye.name + "', which has registered again");
  }
  Drop(bye.name);
  return Status::Ok();
}

std::string PeerOfRoutingId(std::string_view routing_id) {
  constexpr size_t kEpochDigits = 16;
  if (routing_id.size() > kEpochDigits + 1) {
    const size_t hash = routing_id.size() - kEpochDigits - 1;
    const std::string_view digits = routing_id.substr(hash + 1);
    const bool hex = std::all_of(digits.begin(), digits.end(), [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    });
    if (routing_id[hash] == '#' && hex) return std::string(routing_id.substr(0, hash));
  }
  return std::string(routing_id);
}

void Membership::Prune(TimeNs now) {
  pruned_at_ = now;
  std::vector<std::string> lapsed;
  for (const auto& [name, claim] : claims_) {
    if (!Fresh(claim, now)) lapsed.push_back(name);
  }
  for (const std::string& name : lapsed) Drop(name);
}

void Membership::Drop(const std::string& name) {
  auto it = claims_.find(name);
  if (it == claims_.end()) return;
  for (const std::string& ep : it->second.endpoints) {
    auto owner = endpoints_.find(ep);
    if (owner != endpoints_.end() && owner->second == name) endpoints_.erase(owner);
  }
  claims_.erase(it);
}

}  // namespace kvfleet::router
