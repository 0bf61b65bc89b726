// Registration: the worker's Hello to a router (Contract 3), re-sent periodically so a
// router that restarts finds the fleet again, and a Bye on clean shutdown so routers stop
// sending at once.
//
// A DEALER socket connects to the router's registration ROUTER; ZMQ reconnects by
// itself, so a router that is down when the worker starts is found when it comes up.
// Its routing id is the worker's id and this run's epoch (RegistrationRoutingId): unique to
// the process, so a run that is still going (its Bye lingering in the socket) and the run
// that replaced it are two connections to the router, never one id that the router's
// handover would give to the later connection while the earlier one stays open and unread.
//
// Thread safety: thread-safe. One background thread owns the socket.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "schema/registration.h"

namespace kvfleet::server {

// The Hello and Bye frames are schema/registration.h's EncodeHello / EncodeBye.

// "<worker id>#<epoch as 16 hex digits>": the registration socket's routing id. A router
// without CURVE takes the id before the '#' as the peer (router/fleet/membership.h).
std::string RegistrationRoutingId(const std::string& name, uint64_t epoch);

struct RegistrationOptions {
  std::string router_endpoint;  // tcp://host:5555
  // CURVE: this worker's key pair and the router's public key (Z85), both set or both empty.
  // The router admits the Hello only if it lists this key (router/fleet/discovery.h).
  CurveKeyPair keys;
  std::string router_public_key;
  DurationNs interval = 2 * kNsPerSec;  // Hello period: a restarted router knows the fleet within it
};

class Registration {
 public:
  // Connects and sends the first Hello at once.
  static Result<std::unique_ptr<Registration>> Start(zmq::context_t& context, const RegistrationOptions& options,
                                                     const WorkerHello& info);
  ~Registration();  // Stop(false)
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // Replaces the Hello (the adapters served changed, say); sends it at once when `now`,
  // else with the next periodic one.
  void Update(const WorkerHello& info, bool now = true);

  // Stops the Hellos; sends a Bye first when `say_bye`. Idempotent.
  void Stop(bool say_bye);

 private:
  Registration(zmq::context_t& context, const RegistrationOptions& options, const WorkerHello& info);
  void Loop();

  const RegistrationOptions options_;
  std::string hello_;      // GUARDED_BY(mu_)
  const std::string bye_;
  zmq::socket_t socket_;  // the background thread's alone
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;     // GUARDED_BY(mu_)
  bool say_bye_ = false;  // GUARDED_BY(mu_)
  bool resend_ = false;   // GUARDED_BY(mu_): Update() changed the Hello
};

}  // namespace kvfleet::server
