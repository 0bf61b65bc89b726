// SimWorker: one simulated kvfleet worker, as a router sees it over Contracts 2 and 3,
// with no engine behind it:
//   - registration: a DEALER to the router's registration ROUTER sends a Hello at once and
//     every hello_interval (like worker/server/registration.h), and a Bye on BeginLeave();
//   - events: a PUB socket publishing SimKvCache's stored/removed events at events_per_s,
//     one batch per batch_interval that changed the cache, a heartbeat after
//     heartbeat_interval of silence; a replay ROUTER answering replays and snapshots
//     (SimEventStream);
//   - requests: a ROUTER that answers each Generate with `tokens` one-token Deltas,
//     token_delay apart (no more than the request's max_tokens), a Cancel with a cancelled
//     Delta, a Describe with its Hello, LoRA controls with a refusal; its in-flight
//     requests show in the load report every batch carries.
//   - departure, as a real worker's SIGTERM: BeginLeave() sends the Bye and stops the
//     Hellos; new Generates are refused (shuttingDown) while the ones in flight finish
//     (events and heartbeats go on); Gone() says when the sockets may close.
//
// The simulator's shard drives it from one thread: it polls replay_handle() and
// requests_handle(), calls OnReplay / OnRequests when they are readable, and RunDue when a
// timer is due.
//
// Thread safety: thread-compatible; owned by one simulator shard.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>

#include <zmq.hpp>

#include "cli/simulate/sim_event_stream.h"
#include "cli/simulate/sim_kv_cache.h"
#include "common/clock.h"
#include "common/status.h"
#include "schema/registration.h"

namespace kvfleet::sim {

struct SimWorkerOptions {
  std::string name;             // REQUIRED: the worker id (topic kv.<name>)
  std::string model = "sim";    // the model it serves (its Hello's and its hashes')
  std::string router_endpoint;  // REQUIRED: the router's registration endpoint
  std::string host = "127.0.0.1";
  uint16_t requests_port = 0;   // ports it binds on `host`; 0: any free port
  uint16_t events_port = 0;
  uint16_t replay_port = 0;
  uint32_t block_size = 32;     // Contract 1's B, as its Hello announces
  uint32_t max_context = 8192;  // tokens
  SimKvCacheOptions cache;      // cache.model is set to `model`
  double initial_fill = 1.0;    // fraction of the cache full at start (routers learn it by snapshot)
  double events_per_s = 100;    // block events (a stored block, a removed hash) per second
  DurationNs batch_interval = 50 * kNsPerMs;      // an engine step: one batch each when the cache changed
  DurationNs heartbeat_interval = 200 * kNsPerMs;  // Contract 2: at least every 250 ms
  DurationNs hello_interval = 2 * kNsPerSec;       // as a real worker re-sends its Hello
  uint32_t tokens = 8;                             // tokens per answer, at most the request's max_tokens
  DurationNs token_delay = 10 * kNsPerMs;          // between tokens, and before the first
  DurationNs shutdown_grace = 5 * kNsPerSec;       // a leaving worker's in-flight requests may take this long
  size_t ring_batches = 1000;                      // batches kept for replay
  float prefill_tokens_per_second = 20000;         // reported in the load
  uint64_t seed = 1;                               // its cache's workload and epoch
};

// What a shard's workers did; the shard's own, summed by the simulator.
struct SimCounters {
  uint64_t batches = 0;       // with events
  uint64_t heartbeats = 0;
  uint64_t block_events = 0;
  uint64_t replays = 0;       // replay requests answered with batches
  uint64_t snapshots = 0;     // replay requests answered with a snapshot
  uint64_t generates = 0;
  uint64_t completed = 0;     // Generates answered to their last token
  uint64_t cancels = 0;
  uint64_t refused = 0;       // Generates refused while leaving (shuttingDown)
  uint64_t tokens = 0;
  uint64_t malformed = 0;     // frames that did not decode
};

// How the registration DEALER is made: the one place its security (CURVE client keys and
// the router's server key) belongs.
struct RegistrationSocketOptions {
  std::string router_endpoint;  // tcp://host:5555
};
// A DEALER connected to the router's registration ROUTER. Its linger lets a Bye leave
// before the socket closes.
zmq::socket_t MakeRegistrationSocket(zmq::context_t& context, const RegistrationSocketOptions& options);

class SimWorker {
 public:
  // Binds its sockets (Unavailable when a port is taken), fills its cache and sends its
  // first Hello. REQUIRES: `counters` outlives the worker.
  static Result<std::unique_ptr<SimWorker>> Start(zmq::context_t& context, const SimWorkerOptions& options,
                                                  TimeNs now, SimCounters* counters);
  ~SimWorker() = default;  // closes its sockets (without a Bye unless BeginLeave came first)
  SimWorker(const SimWorker&) = delete;
  SimWorker& operator=(const SimWorker&) = delete;

  // A clean departure begins: a Bye to the router, no more Hellos, new requests refused.
  void BeginLeave(TimeNs now);
  bool leaving() const { return leave_by_ != 0; }
  // Leaving, with nothing in flight or past the shutdown grace: its sockets may close.
  bool Gone(TimeNs now) const { return leaving() && (streams_.empty() || now >= leave_by_); }

  // Sockets to poll for input, in this order: replay, requests.
  void* replay_handle() { return replay_.handle(); }
  void* requests_handle() { return requests_.handle(); }
  // Answers one replay request waiting on the replay socket (the shard paces them).
  void OnReplay();
  // Takes the requests waiting on the requests socket.
  void OnRequests(TimeNs now);
  // Runs what is due at `now` (a batch or heartbeat, a Hello, tokens); returns when the
  // next thing is due.
  TimeNs RunDue(TimeNs now, TimeNs wall_ns);

  const std::string& name() const { return options_.name; }
  // Its Hello, as its registration and a Describe send it.
  WorkerHello Hello() const;
  const SimKvCache& cache() const { return cache_; }
  const SimEventStream& stream() const { return stream_; }
  size_t in_flight() const { return streams_.size(); }

 private:
  // One Generate being answered.
  struct Answer {
    std::string identity;  // the router connection's
    uint64_t request_id = 0;
    uint32_t sequences = 1;      // sampling.n
    uint32_t total = 0;          // tokens to send
    uint32_t max_tokens = 0;
    uint32_t sent = 0;
    uint32_t prompt_tokens = 0;
    TimeNs arrival = 0;
    TimeNs due = 0;              // the next token's time
    uint64_t first_token_us = 0;
  };

  SimWorker(zmq::context_t& context, const SimWorkerOptions& options, SimCounters* counters);
  Status Bind(TimeNs now);
  LoadReport Load() const;
  void Step(TimeNs now, TimeNs wall_ns);
  void HandleRequest(const std::string& identity, const zmq::message_t& frame, TimeNs now);
  void SendTokens(TimeNs now);
  void SendTo(const std::string& identity, const std::string& frame);

  const SimWorkerOptions options_;
  SimCounters* const counters_;
  std::mt19937_64 rng_;
  SimKvCache cache_;
  SimEventStream stream_;
  std::string requests_endpoint_, events_endpoint_, replay_endpoint_;  // as bound
  std::string hello_frame_;
  zmq::socket_t pub_, replay_, requests_, registration_;
  std::deque<Answer> streams_;  // by due time: every token waits the same token_delay
  double event_budget_ = 0;     // block events owed to events_per_s
  TimeNs next_step_ = 0, last_step_ = 0, last_publish_ = 0, next_hello_ = 0;
  TimeNs leave_by_ = 0;  // 0: not leaving
};

}  // namespace kvfleet::sim
