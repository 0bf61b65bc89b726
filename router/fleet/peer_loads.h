// PeerLoads: what the fleet's other routers said of themselves over the gossip channel
// (gossip.h, Contract 5): each peer's in-flight counts per worker and its routed work per
// model, keyed by the worker's and the model's names (ids are each router's own). Routing
// adds the peers' counts to this router's own (WorkerLoads::PeerLoad; routing/README.md,
// "Several routers"), and their work to the fleet load ρ.
//
// A peer's message is its whole state, so a newer one replaces its entries. A peer not heard
// for the ttl is forgotten (Expire): a router that dies or loses the channel drops out, and
// with no peer left routing is what it is with none, this router's own counts alone.
//
// Routing reads the sums of every worker of a model per decision: by this router's worker id
// (NameWorker tells which name an id has), through a Reader that holds the lock once for the
// lot, so a decision makes no string lookup.
//
// Thread safety: thread-safe. The gossip thread applies and expires, the fleet thread names
// workers; HTTP threads read.
//
// Invariants:
//   1. Each worker's sum is the sum of the live peers' entries for it (CheckInvariants).
//   2. Within one incarnation of a peer, seq only rises: an older or repeated one is refused.
//   3. At most config::kMaxPeerRouters peers and config::kMaxPeerWorkerNames worker names
//      are held: forged router ids or names cannot grow it without bound.
//   4. The sum found by a worker's id is the one found by its name: sum_by_id_[id] is
//      sums_'s entry for name_by_id_[id], or null when it has none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "router/core/worker.h"
#include "router/fleet/own_load_history.h"
#include "schema/gossip_codec.h"

namespace kvfleet::router {

namespace config {
// Routers one router hears at once; a message from one more is refused (too_many_peers).
// A fleet of 64 routers gossips 64 x 64 x 100 = 410K messages/s in all at 10 ms: past that a
// tree or a shared store fits better than all-to-all PUB/SUB.
inline constexpr size_t kMaxPeerRouters = 64;
// Worker names held at once: twice the most one router knows (config::kMaxWorkers), so
// workers joining while others are forgotten fit; a message naming more is refused.
inline constexpr size_t kMaxPeerWorkerNames = 2 * 1024;
// Changes of the peers' sum kept per worker (PeerLoads::LoadAt). A load report is at most
// ~250 ms old (heartbeats every 200 ms); 4 peers at one message per 10 ms change a sum at most
// 100 times in that, and only a message that changes it records a sample. 10 busy peers fill
// it; past that a report older than the kept samples is set against the current sum
// (own_load_history.h, invariant 2). 256 samples of 40 bytes: 20 MiB for 2,048 workers.
inline constexpr size_t kPeerLoadHistory = 256;
}  // namespace config

// Why Apply refused a message: the reason label of kvfleet_router_gossip_refused_total.
enum class GossipRefusal { kNone, kStale, kTooManyPeers, kTooManyWorkers };
const char* GossipRefusalName(GossipRefusal refusal);

class PeerLoads {
 public:
  // `ttl`: a peer not heard for this long is forgotten (Expire). REQUIRES: ttl > 0.
  explicit PeerLoads(DurationNs ttl);

  // Applies one peer's message, received at `now`: its entries replace that peer's earlier
  // ones. A new incarnation of a known peer (a restart) replaces it whole. kNone: applied.
  GossipRefusal Apply(const RouterGossip& gossip, TimeNs now);
  // Forgets the peers not heard since now - ttl, and the worker sums no peer feeds that have
  // not changed within the ttl.
  void Expire(TimeNs now);

  // The live peers' counts on `worker` (its name), summed; zero when none counts it.
  OwnLoadCounts Load(std::string_view worker) const;
  // Those counts as they stood at `at` (the router's clock): what a load report received then
  // already counted of the peers' requests (router/routing/router.h, AddLoad).
  OwnLoadCounts LoadAt(std::string_view worker, TimeNs at) const;
  // The live peers' routed work on `model`, uncached prefill tokens per second, summed.
  double WorkRate(std::string_view model) const;

  // This router's worker `id` goes by `name` (the name its peers know it by); an empty name
  // forgets the id. The fleet calls it as workers join, rename and are forgotten.
  void NameWorker(WorkerId id, std::string_view name);

  // Reads sums by worker id under one shared lock, held while the Reader lives: routing reads
  // every candidate's. Not to outlive the PeerLoads; no other call on it from the holder's
  // thread meanwhile.
  class Reader {
   public:
    explicit Reader(const PeerLoads& loads) : loads_(loads), lock_(loads.mu_) {}
    // Load() of the name the worker `id` has (NameWorker) into *now and, when `at` is set,
    // LoadAt(*at) into *then; nothing written when no peer counts it.
    void NowAndAt(WorkerId id, std::optional<TimeNs> at, OwnLoadCounts* now, OwnLoadCounts* then) const;

   private:
    const PeerLoads& loads_;
    std::shared_lock<std::shared_mutex> lock_;
  };
  size_t Peers() const;

  // Asserts the invariants (tests).
  void CheckInvariants() const;

 private:
  struct Peer {
    uint64_t incarnation = 0;
    uint64_t seq = 0;
    TimeNs heard_at = 0;
    std::map<std::string, OwnLoadCounts, std::less<>> workers;
    std::map<std::string, double, std::less<>> models;
  };
  struct Sum {
    OwnLoadCounts now;
    TimeNs changed_at = 0;
    OwnLoadHistory<config::kPeerLoadHistory> history;
  };
  // Moves `worker`'s sum by `after` - `before` at `now`. REQUIRES: mu_ held exclusively.
  void Change(const std::string& worker, const OwnLoadCounts& before, const OwnLoadCounts& after, TimeNs now);
  // Replaces `peer`'s workers with `workers`, moving the sums. REQUIRES: mu_ held exclusively.
  void Replace(Peer& peer, std::map<std::string, OwnLoadCounts, std::less<>> workers, TimeNs now);
  // Worker names `workers` would add to sums_. REQUIRES: mu_ held.
  size_t NewNames(const std::map<std::string, OwnLoadCounts, std::less<>>& workers) const;
  // Points the ids named `name` at `sum` (null: it is being erased). REQUIRES: mu_ held exclusively.
  void Link(const std::string& name, const Sum* sum);

  DurationNs ttl_;
  mutable std::shared_mutex mu_;
  std::map<std::string, Peer, std::less<>> peers_;  // GUARDED_BY(mu_); by router id
  std::map<std::string, Sum, std::less<>> sums_;    // GUARDED_BY(mu_); by worker name
  // This router's worker ids (NameWorker): each one's name, and its entry in sums_ (invariant 4).
  std::vector<std::string> name_by_id_;  // GUARDED_BY(mu_); "" for an id not named
  std::vector<const Sum*> sum_by_id_;    // GUARDED_BY(mu_)
  std::map<std::string, std::vector<WorkerId>, std::less<>> ids_by_name_;  // GUARDED_BY(mu_)
};

}  // namespace kvfleet::router
