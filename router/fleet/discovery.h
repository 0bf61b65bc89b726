// Discovery: where the fleet's workers come from besides the records it keeps. Three
// sources (router/README.md, "Configuration"):
//   - per model (StaticFleet), a static list of requests endpoints: StaticHello() makes each
//     a Hello from the router's flags, its events and replay endpoints the next two ports
//     (the worker's defaults), until the worker answers the fleet's Describe (schema/describe.h)
//     with its own (DescribedHello); a worker answering with another model is refused;
//   - per model, DNS names re-resolved periodically (a Kubernetes headless service each):
//     a DnsWatcher resolves each on its own thread and its DnsMembership turns each answer
//     into joins and leaves;
//   - Hello and Bye messages on the registration ROUTER socket: Registration reads and
//     decodes them (Contract 3), rate-limiting the log of malformed frames, and names the
//     peer each came from (router/fleet/membership.h). With RegistrationKeys the socket is
//     a CURVE server that admits only the listed worker keys; without them, it may bind
//     only a loopback address unless the operator says it is on a trusted network.
//
// Owned by the fleet (router/fleet/fleet.cc). Thread safety: DnsWatcher is thread-safe (its
// callback runs on its own thread); DnsMembership and Registration are thread-compatible,
// used on the fleet thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/log.h"
#include "common/status.h"
#include "router/fleet/fleet.h"
#include "router/fleet/membership.h"
#include "schema/requests.h"

namespace kvfleet::router {

// A Hello for a static or DNS worker of `fleet`, served at `requests` (tcp://host:port).
WorkerHello StaticHello(const std::string& requests, const StaticFleet& fleet);

// What the fleet records of a static or DNS worker that answered a Describe: the worker's
// own Hello (its id, block size, context length, pools, ports), reached at the address the
// router was given. The requests endpoint is `listed`'s, and the events, replay and HTTP
// endpoints take their ports from the answer and their host from that address: behind a
// Kubernetes Service a pod's advertised host name may not resolve where the router runs.
WorkerHello DescribedHello(const WorkerHello& listed, WorkerHello answer);

// getaddrinfo of "host:port": every IPv4/IPv6 address as tcp://addr:port, sorted, unique.
std::vector<std::string> Resolve(const std::string& host_port);

// Resolves `host_port` now and every `interval`, handing each answer to `on_answer` (an
// empty answer is logged and handed on too). Stops, and joins, when destroyed.
class DnsWatcher {
 public:
  DnsWatcher(std::string host_port, DurationNs interval, std::function<void(std::vector<std::string>)> on_answer);
  ~DnsWatcher();
  DnsWatcher(const DnsWatcher&) = delete;
  DnsWatcher& operator=(const DnsWatcher&) = delete;

 private:
  void Loop();

  const std::string host_port_;
  const DurationNs interval_;
  std::function<void(std::vector<std::string>)> on_answer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

// The endpoints the DNS name answered last: each new answer yields who joined and who left.
class DnsMembership {
 public:
  void Update(const std::vector<std::string>& answer, std::vector<std::string>* joined,
              std::vector<std::string>* left);

 private:
  std::set<std::string> known_;
};

// Who may register: the router's key pair as the CURVE server's, and the worker public keys
// admitted (common/curve_keys.h files).
struct RegistrationKeys {
  CurveKeyPair server;
  std::set<std::string> authorized;  // Z85
};

// Whether a ZeroMQ endpoint can be reached only from this host: tcp on 127.0.0.0/8,
// localhost or ::1, ipc and inproc. tcp://*, 0.0.0.0 and every other address are not.
bool LocalOnlyEndpoint(const std::string& endpoint);

// The registration ROUTER socket.
class Registration {
 public:
  // Binds `endpoint` (its bound form, e.g. with the port chosen for *, is endpoint()). With
  // `keys`, a CURVE server whose clients a ZapAuthenticator on `ctx` checks (at most one
  // per context), calling `on_refused` with each refused client's key on its own thread.
  // Without them, `endpoint` must be local-only unless `insecure`.
  Status Bind(zmq::context_t& ctx, const std::string& endpoint, const std::optional<RegistrationKeys>& keys,
              bool insecure, std::function<void(const std::string&)> on_refused = {});
  bool bound() const { return socket_ != nullptr; }
  bool authenticated() const { return zap_ != nullptr; }
  zmq::socket_t& socket() { return *socket_; }
  const std::string& endpoint() const { return endpoint_; }
  // Reads what is waiting (at most 256 messages) and hands each Hello or Bye to `on_message`
  // with the peer that sent it; malformed ones are logged (rate-limited) and skipped.
  // REQUIRES: bound().
  void Drain(const std::function<void(const ToRouterMessage&, const RegistrationPeer&)>& on_message);
  void Close() {
    socket_.reset();
    zap_.reset();
  }

 private:
  std::unique_ptr<ZapAuthenticator> zap_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::string endpoint_;
  RateLimit bad_frames_;
};

}  // namespace kvfleet::router
