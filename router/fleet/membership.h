// Membership: which registration peer may speak for which worker. A Hello claims its worker
// id and its endpoints for the peer that sent it; while the claim is fresh (a Hello within
// the lease), a Hello from another peer for that id or any of those endpoints is refused,
// and so is a Bye from any peer but the claimant. A claim lapses when its Hellos stop (the
// worker died) and ends with its Bye.
//
// A peer is who the registration socket says sent the message: the client's CURVE public
// key when registration is authenticated (router/fleet/discovery.h), else the worker id its
// connection's routing id names (PeerOfRoutingId: a worker sets "<id>#<epoch>",
// worker/server/registration.h). Only the first is proof: without CURVE, a peer that knows a
// worker's id can connect with it as its routing id and speak for that worker, which is why
// an unauthenticated registration socket binds only loopback addresses unless the operator
// says otherwise (--registration-insecure).
//
// Runs: a claim remembers the epoch of the run (process) that last said Hello. A Bye from
// another run of the worker (one still shutting down while its replacement registers) is
// refused and leaves the claim to the run that holds it.
//
// Thread safety: thread-compatible; the fleet thread owns it.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "schema/registration.h"

namespace kvfleet::router {

struct RegistrationPeer {
  std::string identity;        // CURVE public key (Z85), or the connection's routing id
  bool authenticated = false;  // identity is a CURVE key the router admitted
};

// The unauthenticated peer a registration routing id names: the worker id before a trailing
// "#<16 hex digits>" (the run's epoch), or the whole id from a worker that sets none.
std::string PeerOfRoutingId(std::string_view routing_id);

class Membership {
 public:
  explicit Membership(DurationNs lease) : lease_(lease) {}

  // Ok, and the claim recorded or renewed, when `peer` may register `hello` at `now`;
  // FailedPrecondition naming the holder otherwise.
  Status AdmitHello(const WorkerHello& hello, const RegistrationPeer& peer, TimeNs now);
  // Ok, and the claim ended, when `peer` holds the claim on `bye.name`; FailedPrecondition
  // otherwise (a Bye for a worker no peer claims is refused too: it names no one this
  // router registered). A Bye of another run than the claim's (both epochs known) is
  // NotFound: the run it ends is not the one registered.
  Status AdmitBye(const WorkerBye& bye, const RegistrationPeer& peer);

  // Forgets claims whose Hellos stopped a lease ago or more: memory follows the live fleet,
  // not every id ever sent. AdmitHello calls it at most once per lease.
  void Prune(TimeNs now);

  size_t claims() const { return claims_.size(); }

 private:
  struct Claim {
    std::string identity;
    std::string endpoints[3];  // requests, events, replay
    TimeNs last_hello = 0;
    uint64_t epoch = 0;        // of the run that last said Hello; 0: not known
  };
  bool Fresh(const Claim& c, TimeNs now) const { return now - c.last_hello < lease_; }
  void Drop(const std::string& name);

  const DurationNs lease_;
  TimeNs pruned_at_ = 0;
  std::map<std::string, Claim> claims_;            // worker id -> its claim
  std::map<std::string, std::string> endpoints_;   // endpoint -> the worker id claiming it
};

}  // namespace kvfleet::router
