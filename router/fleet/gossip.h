// Gossip: the channel over which the routers of one fleet tell each other what each knows
// only for itself (Contract 5, schema/gossip.capnp): its in-flight counts per worker and its
// routed work per model (router/README.md, "Several routers").
//
// Each router binds one PUB socket and connects one SUB socket to every peer's PUB (the
// --peer-routers list; its own endpoint there is skipped, so every router of a fleet can
// take the same list; and every address of --peer-routers-dns, re-resolved periodically).
// It publishes its whole state, read from `source`, whenever its own counts change
// (OwnStateChanged), at most once per gap (config::kGossipMinGap; changes meanwhile go out
// together at the gap's end), and after `interval` without a message, as a heartbeat. A
// routing decision is published on the deciding thread, before the request goes to its
// worker, when the gap allows. Every `interval` it forgets peers not heard for `ttl`
// (PeerLoads::Expire). What it reads is checked (DecodeGossip, then PeerLoads::Apply); a
// refused frame is counted by reason in kvfleet_router_gossip_refused_total, never applied.
//
// With a key pair (GossipOptions::keypair_file, one per fleet, `kvfleet keygen`) the channel
// is CURVE: every PUB is a CURVE server with the fleet's gossip key, which every SUB
// presents and the PUB's ZAP handler alone admits; a peer without it never subscribes, and a
// SUB only ever reads the PUBs it connected to. Without keys the PUB binds only a loopback
// or ipc address, unless `insecure`.
//
// Thread safety: thread-safe; one thread of its own, which writes the PeerLoads. `source` is
// called on that thread, or on a thread calling OwnStateChanged(routed), never two at once.
// Owned by the router's main; stop it before what `source` reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "router/fleet/gossip_faults.h"
#include "router/fleet/peer_loads.h"
#include "schema/gossip_codec.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::router {

namespace config {
// A router that sent nothing for this long sends its state anyway: the heartbeat that keeps
// an idle router from being forgotten, and the most a lost message leaves a peer behind.
// Before changes were sent as they happen (kGossipMinGap) this was the only period: at 50 ms,
// four routers facing a Mooncake burst sent requests behind each other's (mean TTFT +34%
// against one router on a quiet host); at 10 ms +3-11%, still +11% at 0.9x load
// (tests/bench/results/2026-11-30-routers-quiet-host.txt).
inline constexpr DurationNs kGossipInterval = 10 * kNsPerMs;
// Messages sent on change are at least this far apart; changes meanwhile go out together at
// the gap's end. A peer's counts are then at most ~1-2 ms (and the network's delay) behind,
// short against the time between two routers' choices of one worker (about 70 ms per router
// in a Mooncake run on 8 workers), while a router sends at most 1,000 messages/s, each ~500
// bytes for a small fleet: ~1 us of a peer's gossip thread to decode.
inline constexpr DurationNs kGossipMinGap = kNsPerMs;
// ...and at most this many bytes per second: the gap after a frame of B bytes is at least
// B / this. A small fleet's frames never reach it (8 KB a message: ~140 busy workers); 1,000
// busy workers (56-64 KB) go out every 7-8 ms, 1.4x the 10 ms heartbeat's bytes, so that each
// peer decodes ~140 such frames/s from each router (~1 ms each on a loaded 2-core host), not
// 1,000.
inline constexpr double kGossipBytesPerSecond = 8e6;
// A peer not heard for this long is forgotten: 100 intervals, so a few lost frames or a
// slow scheduler do not drop it, yet a dead router's requests stop counting within a second.
inline constexpr DurationNs kGossipTtl = kNsPerSec;
// Frames queued per peer connection, each a whole state: the newest matters, so a few do.
inline constexpr int kGossipHighWaterMark = 16;
}  // namespace config

struct GossipOptions {
  // This router's PUB socket. Without keys, loopback or ipc only unless `insecure`.
  std::string endpoint = "tcp://127.0.0.1:5560";
  // The peers' PUB endpoints (the --peer-routers list); one equal to `endpoint` is skipped.
  std::vector<std::string> peers;
  // "host:port" (--peer-routers-dns): every address it resolves to is a peer's PUB, the list
  // re-resolved every `dns_interval` (a Kubernetes headless Service over the routers). This
  // router's own address among them is heard and passed over. Empty: none.
  std::string peers_dns;
  DurationNs dns_interval = 10 * kNsPerSec;
  // This router's name on the channel, unique in the fleet; empty: the bound endpoint.
  std::string router_id;
  DurationNs interval = config::kGossipInterval;  // heartbeat: a message after this long without one
  // Send on change (OwnStateChanged), at most once per `min_gap` (and kGossipBytesPerSecond).
  // false: only the heartbeat, every `interval`.
  bool on_change = true;
  DurationNs min_gap = config::kGossipMinGap;
  DurationNs ttl = config::kGossipTtl;  // as the PeerLoads it writes was made with
  std::string keypair_file;  // the fleet's gossip key pair (common/curve_keys.h); empty: no CURVE
  bool insecure = false;     // without keys, bind an address other hosts reach anyway
  // Testing only (gossip_faults.h): while it says the channel is down, nothing is sent or
  // applied. Null: never down.
  std::shared_ptr<GossipFaults> faults;
};

// Fills `out`'s workers and models with this router's state now (the gossip thread calls it).
using GossipSource = std::function<void(RouterGossip* out)>;

// A worker's entry from this router's own counts (Fleet::OwnLoadsByName), clamped into the
// bounds DecodeGossip checks (a count read mid-change may briefly cross another).
GossipWorker ToGossipWorker(const std::string& worker, const OwnLoadCounts& own);

class Gossip {
 public:
  // Binds, connects and starts the thread. REQUIRES: `peers`, `clock` and `registry` (may
  // be null) outlive the Gossip; `source` may be called until Stop returns.
  static Result<std::unique_ptr<Gossip>> Start(const GossipOptions& options, GossipSource source, PeerLoads* peers,
                                               const Clock* clock, prometheus::Registry* registry);
  ~Gossip();  // Stop()s
  Gossip(const Gossip&) = delete;
  Gossip& operator=(const Gossip&) = delete;

  // This router's own counts changed (a request counted on a worker, its first token, its
  // end): publish soon, within the gap. `routed`: a request was just counted on its worker
  // and is about to be sent: publish now, on this thread, when the gap allows and no other
  // thread is publishing. Any thread; cheap when the gap holds it back; a no-op once stopped.
  // REQUIRES: the caller holds no lock `source` takes.
  void OwnStateChanged(bool routed);
  // Joins the thread and closes the sockets. Idempotent.
  void Stop();
  // The PUB endpoint as bound (the port filled in when it was 0 or *).
  const std::string& endpoint() const;
  const std::string& router_id() const;
  // Frames sent, and frames read and applied.
  uint64_t sent() const;
  uint64_t applied() const;

 private:
  class Impl;
  explicit Gossip(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfleet::router
