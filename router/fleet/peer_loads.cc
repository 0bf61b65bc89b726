#include "router/fleet/peer_loads.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/check.h"

namespace kvfleet::router {

const char* GossipRefusalName(GossipRefusal refusal) {
  switch (refusal) {
    case GossipRefusal::kNone: return "none";
    case GossipRefusal::kStale: return "stale";
    case GossipRefusal::kTooManyPeers: return "too_many_peers";
    case GossipRefusal::kTooManyWorkers: return "too_many_workers";
  }
  return "none";
}

namespace {

OwnLoadCounts CountsOf(const GossipWorker& w) {
  OwnLoadCounts c;
  c.requests = static_cast<double>(w.requests);
  c.waiting = static_cast<double>(w.waiting);
  c.prefill_tokens = static_cast<double>(w.prefill_tokens);
  c.prompt_tokens = static_cast<double>(w.prompt_tokens);
  return c;
}

OwnLoadCounts Plus(OwnLoadCounts a, const OwnLoadCounts& b, double sign) {
  a.requests += sign * b.requests;
  a.waiting += sign * b.waiting;
  a.prefill_tokens += sign * b.prefill_tokens;
  a.prompt_tokens += sign * b.prompt_tokens;
  return a;
}

}  // namespace

PeerLoads::PeerLoads(DurationNs ttl) : ttl_(ttl) { KVF_CHECK(ttl > 0); }

void PeerLoads::Change(const std::string& worker, const OwnLoadCounts& before, const OwnLoadCounts& after,
                       TimeNs now) {
  if (before == after) return;
  auto [it, added] = sums_.try_emplace(worker);
  Sum& sum = it->second;
  if (added) Link(worker, &sum);
  sum.now = Plus(Plus(sum.now, after, 1), before, -1);
  sum.changed_at = now;
  sum.history.Record(now, sum.now);
}

void PeerLoads::Replace(Peer& peer, std::map<std::string, OwnLoadCounts, std::less<>> workers, TimeNs now) {
  static const OwnLoadCounts kZero;
  for (const auto& [name, old] : peer.workers) {
    auto it = workers.find(name);
    Change(name, old, it == workers.end() ? kZero : it->second, now);
  }
  for (const auto& [name, counts] : workers) {
    if (!peer.workers.contains(name)) Change(name, kZero, counts, now);
  }
  peer.workers = std::move(workers);
}

size_t PeerLoads::NewNames(const std::map<std::string, OwnLoadCounts, std::less<>>& workers) const {
  size_t added = 0;
  for (const auto& entry : workers) added += sums_.contains(entry.first) ? 0 : 1;
  return added;
}

GossipRefusal PeerLoads::Apply(const RouterGossip& g, TimeNs now) {
  std::map<std::string, OwnLoadCounts, std::less<>> workers;
  for (const GossipWorker& w : g.workers) {
    if (w.requests > 0) workers.emplace(w.worker, CountsOf(w));  // an idle entry counts nothing
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = peers_.find(g.router_id);
  if (it == peers_.end()) {
    if (peers_.size() >= config::kMaxPeerRouters) return GossipRefusal::kTooManyPeers;
  } else if (it->second.incarnation == g.incarnation && g.seq <= it->second.seq) {
    return GossipRefusal::kStale;
  }
  if (sums_.size() + NewNames(workers) > config::kMaxPeerWorkerNames) return GossipRefusal::kTooManyWorkers;
  if (it == peers_.end()) it = peers_.emplace(g.router_id, Peer{}).first;
  Peer& peer = it->second;
  peer.incarnation = g.incarnation;
  peer.seq = g.seq;
  peer.heard_at = now;
  Replace(peer, std::move(workers), now);
  peer.models.clear();
  for (const GossipModel& m : g.models) {
    if (m.prefill_tokens_per_second > 0) peer.models.emplace(m.model, m.prefill_tokens_per_second);
  }
  return GossipRefusal::kNone;
}

void PeerLoads::Expire(TimeNs now) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (now - it->second.heard_at <= ttl_) {
      ++it;
      continue;
    }
    Replace(it->second, {}, now);
    it = peers_.erase(it);
  }
  // A sum no peer feeds is zero (invariant 1); once older than the ttl no report still
  // being read can need its history.
  for (auto it = sums_.begin(); it != sums_.end();) {
    if (it->second.now == OwnLoadCounts{} && now - it->second.changed_at > ttl_) {
      Link(it->first, nullptr);
      it = sums_.erase(it);
    } else {
      ++it;
    }
  }
}

void PeerLoads::Link(const std::string& name, const Sum* sum) {
  auto ids = ids_by_name_.find(name);
  if (ids == ids_by_name_.end()) return;
  for (WorkerId id : ids->second) sum_by_id_[id] = sum;
}

void PeerLoads::NameWorker(WorkerId id, std::string_view name) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (id >= name_by_id_.size()) {
    if (name.empty()) return;
    name_by_id_.resize(size_t{id} + 1);
    sum_by_id_.resize(size_t{id} + 1, nullptr);
  }
  std::string& held = name_by_id_[id];
  if (held == name) return;
  if (!held.empty()) {
    auto ids = ids_by_name_.find(held);
    std::erase(ids->second, id);
    if (ids->second.empty()) ids_by_name_.erase(ids);
  }
  held = std::string(name);
  sum_by_id_[id] = nullptr;
  if (name.empty()) return;
  ids_by_name_[held].push_back(id);
  if (auto it = sums_.find(name); it != sums_.end()) sum_by_id_[id] = &it->second;
}

void PeerLoads::Reader::NowAndAt(WorkerId id, std::optional<TimeNs> at, OwnLoadCounts* now,
                                 OwnLoadCounts* then) const {
  if (id >= loads_.sum_by_id_.size() || loads_.sum_by_id_[id] == nullptr) return;
  const Sum& sum = *loads_.sum_by_id_[id];
  *now = sum.now;
  if (at) *then = sum.history.At(*at, sum.now);
}

OwnLoadCounts PeerLoads::Load(std::string_view worker) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = sums_.find(worker);
  return it == sums_.end() ? OwnLoadCounts{} : it->second.now;
}

OwnLoadCounts PeerLoads::LoadAt(std::string_view worker, TimeNs at) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = sums_.find(worker);
  return it == sums_.end() ? OwnLoadCounts{} : it->second.history.At(at, it->second.now);
}

double PeerLoads::WorkRate(std::string_view model) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  double rate = 0;
  for (const auto& entry : peers_) {
    auto it = entry.second.models.find(model);
    if (it != entry.second.models.end()) rate += it->second;
  }
  return rate;
}

size_t PeerLoads::Peers() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return peers_.size();
}

void PeerLoads::CheckInvariants() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::map<std::string, OwnLoadCounts, std::less<>> expected;
  for (const auto& entry : peers_) {
    for (const auto& [name, counts] : entry.second.workers) expected[name] = Plus(expected[name], counts, 1);
  }
  for (const auto& [name, sum] : sums_) {
    const OwnLoadCounts want = expected.contains(name) ? expected[name] : OwnLoadCounts{};
    KVF_CHECK(std::abs(sum.now.requests - want.requests) < 1e-6);
    KVF_CHECK(std::abs(sum.now.waiting - want.waiting) < 1e-6);
    KVF_CHECK(std::abs(sum.now.prefill_tokens - want.prefill_tokens) < 1e-6);
    KVF_CHECK(std::abs(sum.now.prompt_tokens - want.prompt_tokens) < 1e-6);
  }
  for (const auto& entry : expected) KVF_CHECK(sums_.contains(entry.first));
  KVF_CHECK(sum_by_id_.size() == name_by_id_.size());
  size_t named = 0;
  for (size_t id = 0; id < name_by_id_.size(); ++id) {
    const std::string& name = name_by_id_[id];
    auto it = sums_.find(name);
    KVF_CHECK(sum_by_id_[id] == (name.empty() || it == sums_.end() ? nullptr : &it->second));
    if (name.empty()) continue;
    ++named;
    auto ids = ids_by_name_.find(name);
    KVF_CHECK(ids != ids_by_name_.end() && std::count(ids->second.begin(), ids->second.end(), id) == 1);
  }
  for (const auto& entry : ids_by_name_) named -= entry.second.size();
  KVF_CHECK(named == 0);  // no id listed under a name it does not have
  KVF_CHECK(peers_.size() <= config::kMaxPeerRouters);
  KVF_CHECK(sums_.size() <= config::kMaxPeerWorkerNames);
}

}  // namespace kvfleet::router
