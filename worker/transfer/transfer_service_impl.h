// TransferService::Impl: the state behind transfer_service.h, shared by its sources:
// transfer_service.cc (start, stop, the engine thread's calls, the I/O loop), holder.cc (the
// ROUTER: pulls in, refusals out), serving.cc (blocks out, streamed),
// puller.cc (the DEALERs: pulls out, blocks in), device_path.cc (same host: device runs held
// and released, on both sides) and nccl_path.cc (NCCL answers, on both sides).
//
// Thread safety: fields marked GUARDED_BY(mu) are shared with the engine thread; everything
// else belongs to the I/O thread once Start() returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "common/log.h"
#include "worker/transfer/transfer_service.h"

namespace kvfleet::transfer {

namespace config {
// The I/O thread's longest sleep: it notices a deadline or Stop() at least this often even
// if a wake-up were lost.
constexpr long kIdlePollMs = 100;
// Its sleep while a pull waits on the clock (a deadline, a modelled delay) or a frame waits
// for room in a peer's queue: short, so a ManualClock moved by a test is seen soon.
constexpr long kBusyPollMs = 5;
// A holder forgets a pull the engine thread has not answered this long after its deadline.
constexpr DurationNs kOpenPullGrace = kNsPerSec;
// Frames queued per peer on the ROUTER (ZMQ_SNDHWM), and per holder on a DEALER (ZMQ_RCVHWM):
// with frames up to 64 MiB, a slow receiver holds at most ~1 GiB of a holder's memory in
// ZeroMQ; the rest waits as blocks until the peer's queue has room.
constexpr int kFrameHwm = 16;
// On Stop, how long queued refusals and frames may take to leave.
constexpr int kCloseLingerMs = 200;
}  // namespace config

// Sends [identity][frame] on a ROUTER without waiting. False when the peer's queue is full
// (try later; `frame` is kept); a peer that is gone (EHOSTUNREACH with ZMQ_ROUTER_MANDATORY)
// is reported as `gone`. Once sent, `frame` is moved into the message ZeroMQ sends (no copy of
// a blocks frame's tens of MiB) and left empty. (holder.cc)
bool SendTo(zmq::socket_t& router, const std::string& identity, std::string& frame, bool* gone);

inline Status CancelledStatus(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status DeadlineStatus(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }

struct RefuseCommand {
  uint64_t peer_token;
  uint64_t transfer_id;
  RefusalReason reason;
  std::string message;
};
struct PullCommand {
  std::string endpoint;
  std::string server_key;
  PullRequest request;  // transfer_id and deadline_ms set
  TimeNs start;
};
struct CancelCommand {
  uint64_t transfer_id;
};
struct ServeDeviceCommand {
  uint64_t peer_token;
  uint64_t transfer_id;
  DeviceRun run;
};
struct ReleaseCommand {
  uint64_t transfer_id;
};
struct ServeNcclCommand {
  uint64_t peer_token;
  uint64_t transfer_id;
  NcclRun run;
};
struct ServeFrameCommand {
  uint64_t peer_token;
  uint64_t transfer_id;
  FrameChunk chunk;
};
using Command = std::variant<RefuseCommand, PullCommand, CancelCommand, ServeDeviceCommand, ReleaseCommand,
                             ServeNcclCommand, ServeFrameCommand>;

struct TransferService::Impl {
  Impl(TransferOptions opts, const Clock* c);

  // --- transfer_service.cc ---
  // From the engine thread: for the I/O thread. Once the I/O thread has finished, a
  // ServeDeviceCommand is reported released at once and any other command dropped.
  void Queue(Command command);
  void IoLoop();
  void RunCommands();
  void Notify();  // wakes WaitForWork and calls on_ready
  void PushResult(PullResult result);  // for the engine thread

  // Commands queued too late for the I/O thread (Stop): a run it was to hold or stream is
  // reported released, a frame's bytes given back; the rest dropped. REQUIRES: mu held.
  void DropCommand(Command& command);

  // --- holder.cc: the ROUTER ---
  void DrainRouter();
  void HandleRequest(std::vector<zmq::message_t>& parts);
  void DoRefuse(RefuseCommand& cmd);
  // The open pull an answer (a stream's first chunk, ServeDevice, ServeNccl) is for, taken
  // out of open_pulls; nullopt, counted in stale_serves, when it is no longer open or past its
  // deadline (the receiver has given up: its clock started earlier than ours).
  struct OpenPull;
  std::optional<OpenPull> TakeOpenPull(uint64_t peer_token, uint64_t transfer_id);
  // Sends a refusal to `identity` now (dropped if its queue is full) and counts it.
  void SendRefusal(const std::string& identity, uint64_t transfer_id, RefusalReason reason, const std::string& message);
  void SweepOpenPulls(TimeNs now);
  void RefuseAllOpen(RefusalReason reason, const std::string& message);

  // --- serving.cc: blocks out ---
  struct Serving;
  void DoServeFrame(ServeFrameCommand& cmd);
  // Sends what fits of the frames being served; true when some frame still waits for room.
  // Cuts the serves past their deadline.
  bool PumpServing();
  // What NextFrame found for a serve.
  enum class Next : uint8_t {
    kFrame,     // s.pending holds the next frame
    kWaiting,   // a stream waits for the engine's next chunk
    kFinished,  // `done` has left
    kCut,       // the serve was cut (and reported): drop it
  };
  // Encodes `s`'s next frame into s.pending: its next chunk (the buffer given back), or `done`.
  Next NextFrame(Serving& s);
  // Ends `s` before its `done` (`why` logged): its chunks given back, the stream reported
  // released (expired). REQUIRES: mu not held.
  void CutServing(Serving& s, const char* why);
  // Gives `bytes` of stream (peer_token, transfer_id) back to the engine. REQUIRES: mu held.
  void GiveBack(uint64_t peer_token, uint64_t transfer_id, std::vector<std::byte> bytes);
  // Stopping: every serve not finished is cut.
  void CutAllServing();

  // --- device_path.cc: same host ---
  // Holder: sends a device run and holds it until released.
  void DoServeDevice(ServeDeviceCommand& cmd);
  // Holder: a release frame from `identity`.
  void HandleRelease(const std::string& identity, uint64_t transfer_id);
  // Holder: held runs past their hold; returns whether any is still held.
  bool SweepHeld(TimeNs now);
  // Holder, stopping: every held run released (expired).
  void ReleaseAllHeld();
  // Queues `Released` for the engine thread and counts it. REQUIRES: mu not held.
  void ReportReleased(uint64_t peer_token, uint64_t transfer_id, bool expired);
  // Receiver: a device answer to pull `id` (from HandleReply).
  void HandleDeviceRun(uint64_t id, DeviceRun run);
  void DoRelease(uint64_t transfer_id);
  // Receiver: sends a release frame for `transfer_id` on the DEALER of `source_key`.
  void SendRelease(const std::string& source_key, uint64_t transfer_id);
  // Receiver: forgets leases past their hold.
  void ExpireLeases(TimeNs now);

  // --- nccl_path.cc ---
  // Holder: sends an nccl frame and reports whether it left (Released::nccl).
  void DoServeNccl(ServeNcclCommand& cmd);
  // Receiver: an nccl answer to pull `id` (from HandleReply).
  void HandleNcclRun(uint64_t id, NcclRun run);
  // Receiver: an nccl answer from `source_key` for no pull in flight: the communicator is
  // spent (PullResult::nccl_abandoned).
  void AbandonNccl(const std::string& source_key, uint64_t transfer_id);

  // --- puller.cc: the DEALERs ---
  void DoPull(PullCommand& cmd);
  void DoCancel(uint64_t transfer_id);
  void DrainDealer(const std::string& source_key, zmq::socket_t& dealer);
  // Takes `frame`: a streamed pull's blocks keep it (their views read it).
  void HandleReply(const std::string& source_key, zmq::message_t& frame);
  // Ends pull `id` with `outcome`: removes it and queues its result (delayed by the modelled
  // transfer time when kOk and the bandwidth is simulated).
  void FinishPull(uint64_t id, PullOutcome outcome, Status status, std::optional<RefusalReason> refusal = {});
  // Deadlines and delayed results due at `now`; returns the nearest time still waited for (0: none).
  TimeNs CheckPullTimers(TimeNs now);
  void CancelAllPulls(const std::string& why);
  // Counts a finished pull in stats. REQUIRES: mu held.
  void CountPull(const PullResult& r);

  const TransferOptions options;
  const Clock* const clock;
  zmq::context_t context{1};
  std::unique_ptr<ZapAuthenticator> zap;
  zmq::socket_t router;
  int wake_fd = -1;  // eventfd: commands queued or Stop
  std::thread io_thread;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_transfer_id{1};
  std::atomic<uint64_t> unauthorized{0};  // from the ZAP thread
  RateLimit log_limit;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::vector<Command> commands;          // GUARDED_BY(mu): engine -> I/O
  std::vector<IncomingPull> pulls_ready;  // GUARDED_BY(mu): I/O -> engine
  std::vector<PullResult> results_ready;  // GUARDED_BY(mu): I/O -> engine
  std::vector<Released> releases_ready;   // GUARDED_BY(mu): I/O -> engine
  std::vector<SpentFrame> spent_ready;    // GUARDED_BY(mu): I/O -> engine
  std::vector<Arrival> arrivals_ready;    // GUARDED_BY(mu): I/O -> engine, pulls' blocks
  bool io_done = false;                   // GUARDED_BY(mu): the I/O thread runs no more commands
  TransferStats stats;                    // GUARDED_BY(mu); unauthorized_clients read from `unauthorized`

  // Holder side, I/O thread only.
  struct OpenPull {
    PullRequest request;
    TimeNs deadline = 0;
  };
  std::unordered_map<std::string, uint64_t> token_of_identity;
  std::unordered_map<uint64_t, std::string> identity_of_token;
  uint64_t next_peer_token = 1;
  std::map<std::pair<uint64_t, uint64_t>, OpenPull> open_pulls;  // (peer token, transfer id)
  // A pull being answered with blocks, a stream of chunks (ServeFrame).
  struct Serving {
    std::string identity;
    uint64_t peer_token = 0;
    uint64_t transfer_id = 0;
    PullRequest request;
    TimeNs deadline = 0;
    std::deque<FrameChunk> chunks;   // read and not yet encoded
    bool last_seen = false;          // the last chunk arrived
    uint32_t sent = 0;               // blocks in frames so far: the next block's index
    std::string pending;             // a frame the peer's queue had no room for
    bool done_queued = false;        // `pending` is the done frame
  };
  std::deque<Serving> serving;
  TimeNs next_sweep = 0;
  // Device runs sent and still pinned, by (peer token, transfer id): until when.
  std::map<std::pair<uint64_t, uint64_t>, TimeNs> held;

  // Receiver side, I/O thread only.
  struct Source {
    std::string endpoint;
    std::unique_ptr<zmq::socket_t> dealer;
  };
  std::map<std::string, Source> sources;  // by endpoint + '\n' + server key
  struct Pull {
    PullRequest request;
    std::string source_key;
    std::string endpoint;
    TimeNs start = 0;
    TimeNs deadline = 0;
    uint32_t received = 0;            // blocks verified so far (handed over as arrivals)
    std::optional<DeviceRun> device;  // a verified device answer
    std::optional<NcclRun> nccl;      // a verified nccl answer
  };
  std::unordered_map<uint64_t, Pull> pulls;
  // Device answers handed to the engine and not yet released: which holder, and when it lets
  // the run go by itself (the deadline + kDeviceHoldGrace).
  struct Lease {
    std::string source_key;
    TimeNs expires = 0;
  };
  std::unordered_map<uint64_t, Lease> leases;
  std::vector<std::pair<TimeNs, PullResult>> delayed;  // ok results held until their modelled time
};

}  // namespace kvfleet::transfer
