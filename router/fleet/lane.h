// Lane: forwards requests to workers from one thread, its home, over its own DEALER per
// worker (Contract 3), and reads the workers' answers on that thread too: every sink call
// happens there. The router runs one lane per HTTP I/O thread, so one thread reads a
// request, routes it, sends it, reads the answer and writes it to the client, and no other
// router thread wakes on the request path (router/README.md, "Threads and the request path").
//
// A request that fails before its first token (worker disconnected, declared dead, refused,
// overloaded or stopping or serving another model or no longer the adapter, a final Delta with finish error or
// cancelled, first-token timeout) is retried once on the worker `reroute` picks; after its
// first token the sink gets an error. A worker that said Bye gets no new requests but keeps
// those it has (LaneFleet::Serving): it drains them, as a worker does on SIGTERM, and those it
// cancels at the end of its grace fail over as above. Every request ends with its final Delta
// or one error: none is dropped. The router's own in-flight counts per worker are kept
// in the fleet (LaneFleet::CountInflight), summed over every lane.
//
// Request lifecycle (all on the home thread):
//   1. Submit(): Generate goes out on this lane's DEALER for the chosen worker.
//   2. The DEALER's ZMQ_FD wakes the home loop; deltas go to the sink, in order.
//   3. The final delta (finish reason set) or an error ends it; Cancel() ends it early and
//      tells the worker. Each tick (FleetOptions::tick) checks timeouts, worker failures the
//      fleet saw, and picks up workers that joined or left.
//
// A split request (ForwardRequest::prefill) runs as one flight in two stages: the prefill
// stage sends the prompt as a one-token Generate to the prefill worker and drops its answer;
// its end sends the request to the decode worker with a PullHint naming the worker that
// computed the prompt. A prefill stage that fails is retried once on another prefill worker
// (its own attempts); with none left, the decode worker gets the request without a pull and
// computes the prompt itself. The sink sees the decode stage alone.
//
// LoRA control (SendLoraControl): a LoadLora or UnloadLora goes out on the same DEALER under
// a request id of its own (from the attempts' sequence, so no Delta is mistaken for its
// answer); the worker's LoraResult, its failure or the timeout ends it, once, on the home
// thread. It is never retried elsewhere: the caller chose the worker.
//
// Thread safety: thread-compatible, owned by its home thread: every call, and the
// destruction, on the home thread (or after it stopped running the loop). Sinks may call
// Cancel() from inside OnDelta.
//
// Invariants:
//   1. A request id (attempt) maps to exactly one flight, and a flight has at most one
//      attempt in flight; its in-flight counts are counted once, on that attempt's worker.
//   2. A sink gets no call after its terminal call (final delta or OnError) or after
//      Cancel() returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "router/fleet/fleet.h"

namespace zmq {
class socket_t;
}

namespace kvfleet::router {

// The thread a Lane lives on: an HTTP I/O thread (router/http adapts http::IoThread) or a
// PollLoop (poll_loop.h).
class LaneLoop {
 public:
  virtual ~LaneLoop() = default;
  // Runs `fn` on the loop's thread. Any thread.
  virtual void Post(std::function<void()> fn) = 0;
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  // Calls `on_readable` on the loop's thread each time `fd` is readable (level: an fd
  // left readable is reported again), until the watch is destroyed. Loop thread only.
  virtual std::unique_ptr<Watch> WatchReadable(int fd, std::function<void()> on_readable) = 0;
};

// What a lane needs of its fleet; the Fleet implements it. Thread-safe.
class LaneFleet {
 public:
  virtual ~LaneFleet() = default;
  struct WorkerEndpoint {
    WorkerId id = 0;
    std::string requests_endpoint;
  };
  // Changes whenever a worker joins, leaves or changes endpoints.
  virtual uint64_t Generation() const = 0;
  // Workers that are known and not removed.
  virtual std::vector<WorkerEndpoint> Endpoints() const = 0;
  // A DEALER with the fleet's socket options and CURVE, not yet connected.
  virtual std::unique_ptr<zmq::socket_t> NewDealer() = 0;
  virtual bool Routable(WorkerId worker) const = 0;
  // Whether requests already sent to the worker may still be answered there: it is routable,
  // or it said Bye and drains them (a worker shutting down finishes its in-flight requests
  // within its grace, or cancels them). False once it is disconnected, DEAD, refused or removed.
  virtual bool Serving(WorkerId worker) const = 0;
  // How often the worker failed (disconnected, said bye, declared dead, removed): a change
  // since a request was sent means that request is lost there. *why: the last reason.
  virtual uint64_t Failures(WorkerId worker, std::string* why) const = 0;
  // Adds to this router's in-flight counts of `worker`.
  virtual void CountInflight(WorkerId worker, const OwnLoadDelta& delta) = 0;
  virtual void CountRetry() = 0;
  virtual std::string WorkerName(WorkerId worker) const = 0;
  // Fleet::Stop() was called: new requests fail, those in flight end.
  virtual bool Stopping() const = 0;
  virtual const FleetOptions& options() const = 0;
  virtual const Clock* clock() const = 0;
};

class Lane {
 public:
  // Both must outlive the lane. REQUIRES: on `loop`'s thread.
  Lane(LaneFleet* fleet, LaneLoop* loop);
  ~Lane();  // ends what is in flight (sinks get Unavailable) and closes the DEALERs
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // A handle for Submit, unique in this lane.
  uint64_t NewHandle() { return next_handle_++; }
  // Sends `request` under `handle` (unique in this lane: NewHandle(), or Fleet::NewHandle()
  // for a lane whose handles all come from there). The sink may be called before this
  // returns (a worker that cannot be reached: retry or error at once).
  void Submit(uint64_t handle, ForwardRequest request);
  // Ends a request early and cancels it on its worker; the sink gets no further call.
  // Unknown or finished handles are ignored.
  void Cancel(uint64_t handle);

  size_t inflight() const { return flights_.size(); }
  // DEALERs this lane holds: one per worker it reaches.
  size_t dealers() const;

  // What became of one LoRA control: the worker's LoraResult, or Unavailable (the worker is
  // not live, or failed before answering) or DeadlineExceeded (no answer within the timeout).
  using LoraDone = std::function<void(Result<WorkerLoraResult>)>;
  // Sends LoadLora (`kind` kLoadLora, lora.path set) or UnloadLora to `worker`; `done` is
  // called exactly once, on the home thread, possibly before this returns. REQUIRES: kind is
  // kLoadLora or kUnloadLora.
  void SendLoraControl(WorkerId worker, ToWorkerMessage::Kind kind, const LoraControl& lora, DurationNs timeout,
                       LoraDone done);
  size_t pending_controls() const { return controls_.size(); }

 private:
  struct Flight {
    ForwardRequest request;
    WorkerId worker = 0;
    uint64_t attempt_id = 0;  // 0: no attempt in flight
    uint64_t failures_at_send = 0;
    std::vector<WorkerId> tried;
    bool first_token = false;
    bool prefilling = false;             // in a split request's prefill stage
    std::vector<WorkerId> prefill_tried;  // that stage's attempts
    uint32_t finished = 0;        // sequences (of sampling.n) whose last delta came
    uint32_t prefill_tokens = 0;  // counted as queued prefill until the first token
    uint32_t whole_prompt = 0;    // likewise
    TimeNs deadline = 0;
    TimeNs first_token_deadline = 0;
    TimeNs sent = 0;  // the attempt's send
  };
  struct Control {
    WorkerId worker = 0;
    TimeNs deadline = 0;
    uint64_t failures_at_send = 0;
    LoraDone done;
  };
  struct Peer {
    std::unique_ptr<zmq::socket_t> dealer;
    std::unique_ptr<LaneLoop::Watch> watch;
    std::string endpoint;
    bool drain_posted = false;
  };

  void Sync();
  void Connect(WorkerId id, const std::string& endpoint);
  void StartAttempt(uint64_t handle, WorkerId worker);
  void Release(Flight& f);
  void SendCancel(const Flight& f);
  void FailOver(uint64_t handle, const Status& why);
  // A split request's prefill stage: done on f.worker (the decode stage starts), or failed.
  void PrefillDone(uint64_t handle);
  void PrefillFailed(uint64_t handle, const Status& why);
  void End(uint64_t handle, WorkerId worker, const Status& why);
  void Drain(WorkerId id);
  void AfterSend(WorkerId id);
  void OnDelta(const WorkerDelta& d);
  void OnWorkerError(const WorkerError& e);
  void OnLoraResult(const WorkerLoraResult& r);
  // Ends a control with `result`: forgotten first, so `done` may send another.
  void EndControl(uint64_t id, Result<WorkerLoraResult> result);
  void TickControls(TimeNs now);
  // A final Delta with finish error or cancelled: the worker gave up on the request.
  void WorkerEnded(uint64_t handle, const WorkerDelta& d);
  void Tick();

  LaneFleet* fleet_;
  LaneLoop* loop_;
  const FleetOptions& options_;
  uint64_t generation_ = ~uint64_t{0};
  // A DEALER could not be made (the socket limit): Sync tries again from missing_retry_at_.
  bool missing_ = false;
  TimeNs missing_retry_at_ = 0;
  std::vector<Peer> peers_;                          // by worker id
  std::unordered_map<uint64_t, Flight> flights_;     // by handle
  std::unordered_map<uint64_t, uint64_t> attempts_;  // attempt id -> handle
  std::unordered_map<uint64_t, Control> controls_;   // LoRA control request id -> control
  uint64_t next_handle_ = 1;
  uint64_t next_attempt_ = 1;
  int timer_fd_ = -1;
  std::unique_ptr<LaneLoop::Watch> timer_watch_;
  std::shared_ptr<bool> alive_;  // false once destroyed: posted drains check it
};

}  // namespace kvfleet::router
