// The fake fleet the Router tests route over: loads set by hand (this router's own counts,
// reports, announced rates, transfer services) and in-memory indexes.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "router/routing/predicted_index.h"
#include "router/routing/router.h"

namespace kvfleet::router::testing {

inline constexpr uint32_t kBlockSize = 4;

// Loads set by hand: this router's own counts now and at any earlier time, the other
// routers' (gossip), and reports.
class FakeLoads final : public WorkerLoads {
 public:
  OwnLoadCounts OwnLoad(WorkerId w) const override { return Get(own, w); }
  OwnLoadCounts OwnLoadAt(WorkerId w, TimeNs at) const override {
    asked_at = at;
    return Get(own_then, w);
  }
  std::optional<WorkerLoad> ReportedLoad(WorkerId w) const override {
    auto it = reported.find(w);
    if (it == reported.end()) return std::nullopt;
    return it->second;
  }
  uint32_t StoredPrefixBlocks(WorkerId w) const override {
    auto it = stored_prefix.find(w);
    return it == stored_prefix.end() ? 0 : it->second;
  }
  double AnnouncedPrefillRate(WorkerId w) const override {
    auto it = announced.find(w);
    return it == announced.end() ? 0 : it->second;
  }
  std::shared_ptr<const TransferPeer> Transfer(WorkerId w) const override {
    auto it = transfer.find(w);
    if (it == transfer.end()) return nullptr;
    return std::make_shared<const TransferPeer>(it->second);
  }

  std::optional<PullFit> MeasuredPulls(WorkerId receiver, std::string_view holder) const override {
    auto it = measured.find({receiver, std::string(holder)});
    if (it == measured.end()) return std::nullopt;
    return it->second;
  }
  TimeNs LastPullFailure() const override { return last_pull_failure; }

  WorkerRole Role(WorkerId w) const override {
    auto it = roles.find(w);
    return it == roles.end() ? WorkerRole::kBoth : it->second;
  }

  OwnLoadCounts PeerLoad(WorkerId w) const override { return Get(peers, w); }
  OwnLoadCounts PeerLoadAt(WorkerId w, TimeNs) const override { return Get(peers_then, w); }
  double PeerWorkRate(std::string_view) const override { return peer_work; }
  bool Routable(WorkerId w) const override { return gone.count(w) == 0; }
  std::vector<WorkerId> DeviceMates(WorkerId w) const override {
    auto it = mates.find(w);
    return it == mates.end() ? std::vector<WorkerId>{} : it->second;
  }

  std::map<WorkerId, OwnLoadCounts> own, own_then;
  // The other routers' counts, now and when the report came (their gossip), and their work.
  std::map<WorkerId, OwnLoadCounts> peers, peers_then;
  double peer_work = 0;
  std::map<WorkerId, WorkerLoad> reported;
  std::map<WorkerId, uint32_t> stored_prefix;
  std::map<WorkerId, TransferPeer> transfer;
  std::map<std::pair<WorkerId, std::string>, PullFit> measured;  // by receiver and holder endpoint
  TimeNs last_pull_failure = 0;
  std::map<WorkerId, double> announced;
  std::map<WorkerId, WorkerRole> roles;  // kBoth when not set
  std::map<WorkerId, std::vector<WorkerId>> mates;  // workers sharing each one's device
  std::set<WorkerId> gone;                           // not Routable: left since the decision
  mutable TimeNs asked_at = 0;

 private:
  static OwnLoadCounts Get(const std::map<WorkerId, OwnLoadCounts>& m, WorkerId w) {
    auto it = m.find(w);
    return it == m.end() ? OwnLoadCounts{} : it->second;
  }
};

struct Fixture {
  explicit Fixture(const RoutingOptions& options = {})
      : kv(&clock), approx(&clock), router(options, &loads, &kv, &approx, nullptr, &clock) {
    fleet.block_size = kBlockSize;
    fleet.routable = {0, 1, 2};
    fleet.workers = 3;
    tokens.resize(10 * kBlockSize);
    std::iota(tokens.begin(), tokens.end(), 100);
  }
  Prompt PromptOf(Policy policy) const { return Prompt{"m", tokens, "", policy}; }
  std::vector<BlockHash> Hashes() const {
    return BlockHasher(kBlockSize, HashNamespace{"m", "", ""}).HashAll(tokens);
  }
  size_t Matched(const PrefixIndex& index, WorkerId w) const {
    std::vector<PrefixMatch> out;
    index.FindMatches(Hashes(), &out);
    for (const PrefixMatch& m : out) {
      if (m.worker == w) return m.device_blocks;
    }
    return 0;
  }

  ManualClock clock;
  FakeLoads loads;
  PredictedIndex kv;
  PredictedIndex approx;
  Router router;
  ModelFleet fleet;
  std::vector<TokenId> tokens;
};

}  // namespace kvfleet::router::testing
