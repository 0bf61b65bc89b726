// TransferService: a worker's end of Contract 4 (schema/README.md), KV blocks pulled from
// another worker instead of recomputed. One service plays both parts:
//   - holder: a ROUTER socket other workers' pulls arrive on. The engine thread takes them
//     (TakePulls), pins the leading run of the chain it still holds and streams it: it reads
//     a frame's worth of blocks at a time (BlocksPerFrame) into a reused buffer and hands it
//     to ServeFrame, which gives the buffer back (TakeSpentFrames) once the frame is encoded,
//     and reports the run's end (TakeReleases, Released::stream): then the engine unpins. Or
//     it says why not (Refuse). The service checksums and checks each frame's blocks, encodes
//     the frame, sends it and, after the last, a `done`.
//   - receiver: StartPull sends a PullRequest on a DEALER to the holder (one per endpoint,
//     kept); the I/O thread checks every block as it arrives (index, hash, tokens, sizes,
//     checksum) and enforces the deadline. It hands each frame's checked blocks to the engine
//     thread as they arrive (TakeArrivals), views over the received frame. Each StartPull ends
//     in exactly one PullResult (TakeResults): ok, counting the verified leading run the
//     arrivals carried, or why not (the arrivals are then only leftovers).
//   - same host (a request with a host_id): the holder may answer with ServeDevice instead, a
//     DeviceRun of IPC handles and slots; it keeps the run pinned until the receiver's
//     ReleasePull reaches it or the deadline plus kDeviceHoldGrace passes (TakeReleases says
//     when the engine may unpin). The receiver's PullResult then carries `device`.
//   - NCCL (a request offering it, where the device path is not possible): the holder may
//     answer with ServeNccl, an NcclRun naming the pair's communicator; TakeReleases says
//     whether the frame left (the engine then sends the run by NCCL) or not (unpin now). The
//     receiver's PullResult carries `nccl`; it receives the run in the order the answers came,
//     and forgets the communicator of any answer it cannot receive (`nccl_abandoned`).
// The service checks the wire; the engine thread still compares each block's tokens with its
// own prompt before importing it (a hash collision costs a miss, never a wrong answer).
//
// One I/O thread, owned by the service, owns every socket. The engine thread's calls only
// queue work for it or take what it queued (a mutex around plain queues, never held across a
// ZeroMQ call); `on_ready` or WaitForWork tell the engine thread there is something to take.
//
// Thread safety: thread-safe. Every public method may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "schema/transfer_codec.h"

namespace kvfleet::transfer {

namespace config {
// A holder keeps a device run pinned this long past the request's deadline when no release
// arrives: the receiver copies nothing after its deadline, and its clock started earlier.
constexpr DurationNs kDeviceHoldGrace = kNsPerSec;
// The blocks a `blocks` frame packs: up to 16 MiB of them, or one larger block alone (up to
// what a receiver takes). Every copy of a pull's bytes (the encode's segments, the frame,
// libzmq's receive buffer, the decode) is a buffer of about a frame; glibc's malloc serves
// those under its largest mmap threshold (32 MiB) from memory it kept from the last frame,
// and maps buffers above it fresh, each byte then costing a page fault at each copy
// (tests/bench/results/2026-12-01-nvidia-h200-kv-transfer-tcp-frames.txt).
constexpr uint64_t kFrameTargetBytes = uint64_t{16} << 20;
// A streamed run's frames the engine may have handed to ServeFrame and not had back: the next
// frame is read while one is encoded, and a slow receiver holds at most this many of the
// engine's buffers (its frames queued in ZeroMQ aside).
constexpr uint32_t kFramesAhead = 2;
// A pull's `blocks` frames checked and waiting for the engine thread
// (TakeArrivals): past this many, the I/O thread reads no more replies from holders until the
// engine takes them, so a receiver busy with long steps holds at most these frames (and
// ZeroMQ's queue) of a pull's bytes, not the whole run.
constexpr size_t kArrivalsAhead = 4;
}  // namespace config

// How many blocks of `layout` a streamed frame carries: as many as fit
// config::kFrameTargetBytes, at least one.
uint32_t BlocksPerFrame(const Layout& layout);

struct TransferOptions {
  // Where the holder's ROUTER binds, e.g. "tcp://0.0.0.0:5559"; port 0 picks one.
  std::string bind = "tcp://127.0.0.1:0";
  // The endpoint other workers are told to pull from (empty: the bound one).
  std::string advertise;
  // CURVE (common/curve_keys.h). With a key pair the ROUTER is a CURVE server that admits only
  // clients whose public key (Z85) is in `authorized_keys` (a ZAP handler), and this
  // service's pulls present the same key pair to holders that give a server key.
  std::optional<CurveKeyPair> keypair;
  std::set<std::string> authorized_keys;  // REQUIRED non-empty with a key pair
  // A bind other hosts can reach without CURVE is refused unless this is set.
  bool insecure = false;
  // A pull whose request has deadline_ms 0 gets this.
  DurationNs default_deadline = 2 * kNsPerSec;
  // Pulls in flight, each side: a holder refuses more with `busy`; StartPull fails more at
  // once (PullOutcome::kBusy).
  size_t max_inflight_pulls = 64;
  // > 0: a pull completes no earlier than its start + the chain's modelled bytes
  // (blocks × Layout::BytesPerBlock) / this, the mock backend's stand-in for a link.
  double simulated_bandwidth_bytes_per_s = 0;
  // Called on the I/O thread whenever TakePulls, TakeResults or TakeReleases has something
  // new (the worker loop's wake-up, e.g. RequestServer::Wake). Must not block.
  std::function<void()> on_ready;
  // Tests only: the holder flips one byte of each served block's first pool after
  // checksumming it.
  bool test_corrupt_served_data = false;
};

// A pull another worker sent this holder, for the engine thread.
struct IncomingPull {
  uint64_t peer_token = 0;  // names the connection it came on; give it back to ServeFrame, Refuse etc.
  // Names the receiver for as long as its connection lasts (its routing id, printable). A
  // peer token is recycled a second after the connection's last pull; this is not, so it
  // keys what a pair keeps between pulls (an NCCL communicator).
  std::string peer;
  PullRequest request;
  TimeNs deadline = 0;      // this service's clock: arrival + request.deadline_ms
};

enum class PullOutcome : uint8_t {
  kOk,           // the verified leading run (maybe shorter than asked, maybe empty): arrived, device or nccl
  kRefused,      // the holder refused: PullResult::refusal
  kDeadline,     // no `done` before the deadline (a holder gone or slow looks the same)
  kBadChecksum,  // a block's bytes differ from their checksum: nothing is imported
  kMalformed,    // a frame that did not decode, a block out of order or not the one asked for
  kCancelled,    // CancelPull
  kBusy,         // max_inflight_pulls already in flight here; nothing was sent
  kInvalid,      // the request or the holder's key was unusable; nothing was sent
};
inline constexpr size_t kNumPullOutcomes = 8;
std::string_view PullOutcomeName(PullOutcome outcome);

struct PullResult {
  uint64_t transfer_id = 0;
  PullOutcome outcome = PullOutcome::kOk;
  std::optional<RefusalReason> refusal;  // with kRefused
  Status status;                         // OK with kOk, otherwise the reason in words
  // kOk with `blocks` frames: how many blocks arrived (each checked by CheckBlock): the run is
  // the pull's Arrivals' blocks 0..streamed_blocks-1. 0 otherwise.
  uint32_t streamed_blocks = 0;
  // kOk only, when the holder answered `device`: the run, checked by
  // CheckDeviceRun, still pinned in the holder's device pools. Copy it before `deadline`,
  // then ReleasePull(transfer_id).
  std::optional<DeviceRun> device;
  // kOk only, when the holder answered `nccl`: the run, checked by
  // CheckNcclRun, which the holder sends by NCCL now; receive all of it, in answer order.
  std::optional<NcclRun> nccl;
  // An `nccl` answer from `source` that will not be received: a faulty one (this pull's
  // kMalformed), or one that came after its pull ended (a result of its own, kCancelled, for
  // a transfer id already reported, not counted in the stats). The holder sends that run on
  // the pair's communicator all the same: the receiver must not use the communicator again.
  bool nccl_abandoned = false;
  uint64_t bytes = 0;                    // the run's blocks × the layout's bytes per block
  DurationNs elapsed = 0;                // from StartPull to completion, on the service's clock
  TimeNs deadline = 0;                   // the pull's deadline, on the service's clock (0: not sent)
  std::string source;                    // the holder's endpoint
};

// A pull's blocks of one `blocks` frame, checked (CheckBlock) as they arrived: the
// run's blocks first..first+n-1, in order and with no gap across a pull's arrivals. The views'
// bytes are the received frame's own, which `frame` keeps (no copy was made): the engine
// copies them where they go and drops this.
struct Arrival {
  uint64_t transfer_id = 0;
  uint32_t first = 0;
  std::vector<BlockView> blocks;
  std::shared_ptr<const void> frame;
};

// One frame of a run the engine streams (ServeFrame): the run's blocks first..first+n-1.
struct FrameChunk {
  uint32_t first = 0;                        // the run's index of its first block
  std::vector<BlockHash> hashes;             // [n]
  std::vector<std::vector<TokenId>> tokens;  // [n]: block_size tokens each
  // The blocks' bytes, pool after pool, each pool's n blocks back to back as ReadKvBlocks
  // writes them: pool p from n × (the bytes per block of the pools before p). At least
  // n × layout.BytesPerBlock() bytes (a reused buffer may be longer); empty for dtype none.
  std::vector<std::byte> bytes;
  bool last = false;  // the run ends here: `done` follows (n may be 0: the run is cut short)
};

// A FrameChunk's bytes, back from the service once its frame is encoded (TakeSpentFrames):
// the engine reads a later frame into them.
struct SpentFrame {
  uint64_t peer_token = 0;
  uint64_t transfer_id = 0;
  std::vector<std::byte> bytes;
};

// A run a holder may unpin now (TakeReleases): a device run, an nccl answer, or a stream.
struct Released {
  uint64_t peer_token = 0;
  uint64_t transfer_id = 0;
  // false: the receiver's release frame arrived. true: it did not come by the request's
  // deadline + config::kDeviceHoldGrace, the run was never sent (stale, invalid, no room),
  // or the service stopped.
  bool expired = false;
  // A ServeNccl's answer: expired false means its frame left and the engine sends the run by
  // NCCL now (and unpins when the send ends); true, the frame was not sent: unpin now.
  bool nccl = false;
  // A streamed run's end (ServeFrame): expired false when its last frame and `done` left;
  // true when it was cut short: stale at its first frame, the receiver gone, its deadline
  // passed, a frame breaking Contract 4, or the service stopped.
  bool stream = false;
};

// Pulls this service made from one holder.
struct SourceStats {
  uint64_t ok = 0;
  uint64_t device = 0;  // of ok: answered with the holder's device blocks (same host)
  std::array<uint64_t, kNumPullOutcomes> by_outcome{};  // kOk included
  uint64_t blocks = 0;                                  // imported from ok pulls
  uint64_t bytes = 0;
  double seconds = 0;  // summed elapsed of ok pulls (device answers: the handles, not the copy)
  // Device answers copied by the receiver (RecordDeviceCopy): bytes and seconds of the copies.
  uint64_t device_copy_bytes = 0;
  double device_copy_seconds = 0;
  uint64_t nccl = 0;  // of ok: answered `nccl` (the run follows by NCCL send/recv)
  // NCCL answers received by the receiver (RecordNcclCopy): bytes and seconds of the receives.
  uint64_t nccl_copy_bytes = 0;
  double nccl_copy_seconds = 0;
};

struct TransferStats {
  std::map<std::string, SourceStats> pulls;  // receiver side, by the holder's endpoint
  // Holder side.
  uint64_t served = 0;                                      // pulls answered with blocks and done
  uint64_t served_blocks = 0;
  uint64_t served_frames = 0;                               // `blocks` frames sent
  uint64_t served_bytes = 0;
  std::array<uint64_t, kNumRefusalReasons> refused{};       // refusals sent, by reason
  uint64_t dropped_frames = 0;  // frames with no readable transfer id: nothing to answer
  uint64_t unauthorized_clients = 0;  // CURVE handshakes the ZAP handler refused
  uint64_t late_frames = 0;     // receiver side: replies for no pull in flight (past deadline)
  // Answers (a stream's first ServeFrame, ServeDevice, ServeNccl, Refuse) for a pull no longer
  // open, or past its deadline: not sent.
  uint64_t stale_serves = 0;
  // Streams ended before their `done`: the receiver gone, the deadline passed, a frame breaking
  // Contract 4, or Stop.
  uint64_t cut_serves = 0;
  // Holder side, the device path.
  uint64_t served_device = 0;    // `device` frames sent
  uint64_t device_releases = 0;  // held runs their receiver released (Released::expired false)
  uint64_t device_expired = 0;   // runs reported Released with expired true
  uint64_t stray_releases = 0;   // release frames for no run held for that peer: dropped
  // Holder side, NCCL.
  uint64_t served_nccl = 0;      // `nccl` frames sent
  // Receiver side: `nccl` answers that came after their pull ended (nccl_abandoned).
  uint64_t late_nccl = 0;
};

// The time a pull of `bytes` takes at `bytes_per_s` (0 when the rate is 0).
DurationNs ModelledTransferTime(uint64_t bytes, double bytes_per_s);

class TransferService {
 public:
  // Binds the ROUTER and starts the I/O thread. `clock` times deadlines and results.
  static Result<std::unique_ptr<TransferService>> Start(TransferOptions options, const Clock* clock);
  ~TransferService();  // Stop()s
  TransferService(const TransferService&) = delete;
  TransferService& operator=(const TransferService&) = delete;

  // The endpoint to advertise (options.advertise, else the bound one with its port).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& bound_endpoint() const { return bound_endpoint_; }

  // Holder side. Takes the pulls received so far, oldest first.
  std::vector<IncomingPull> TakePulls();
  // Streams the leading run of the chain this holder has, frame by frame: the engine reads
  // each frame's blocks (in order, chunk.first counting on from the last chunk's; at most
  // BlocksPerFrame a frame) and hands them here; checksums are computed here. chunk.last ends
  // the run and `done` follows, counting the blocks sent. The first chunk (first 0) opens
  // the stream and exactly one Released{stream=true} follows it, once the run may be unpinned
  // (REQUIRES: the engine keeps its blocks pinned until then). Every chunk's bytes come back
  // through TakeSpentFrames, sent or not; a chunk after its stream ended is only given back.
  // A chunk failing CheckBlock is not sent: the first refuses the pull malformed, a later one
  // ends the run with the blocks sent so far; both logged.
  void ServeFrame(uint64_t peer_token, uint64_t transfer_id, FrameChunk chunk);
  // Takes the streamed frames' buffers given back since the last call.
  std::vector<SpentFrame> TakeSpentFrames();
  void Refuse(uint64_t peer_token, uint64_t transfer_id, RefusalReason reason, std::string message);
  // Same host: answers with one `device` frame. REQUIRES: the engine has pinned `run`'s blocks;
  // it unpins them when TakeReleases reports (peer_token, transfer_id), which happens exactly
  // once for every ServeDevice: after the receiver's release, or expired at the request's
  // deadline + config::kDeviceHoldGrace, or at once (expired) when nothing was sent: the
  // pull no longer open or past its deadline (stale_serves), the request without a host id or
  // a run failing CheckDeviceRun (refused malformed, logged), the peer's queue full or gone.
  void ServeDevice(uint64_t peer_token, uint64_t transfer_id, DeviceRun run);
  // Takes the device runs that may be unpinned since the last call, the ServeNccl answers
  // sent or not (Released::nccl) and the streams that ended (Released::stream).
  std::vector<Released> TakeReleases();
  // Answers with one `nccl` frame. REQUIRES: the engine has pinned `run`'s blocks. Exactly one
  // Released{nccl=true} follows, in the order the frames leave: expired=false once the frame
  // is sent (the engine then sends the run on the communicator, in that order); expired=true
  // when it was not: the pull no longer open or past its deadline (stale_serves), a request
  // that offered no NCCL or a run failing CheckNcclRun (refused malformed, logged), the peer's
  // queue full or gone, or the service stopped.
  void ServeNccl(uint64_t peer_token, uint64_t transfer_id, NcclRun run);

  // Receiver side. Sends `request` to the holder at `source_endpoint` (a CURVE server with
  // public key `source_server_key` (Z85) when it is not empty). Chooses and returns the
  // transfer id (request.transfer_id is ignored); deadline_ms 0 means default_deadline.
  // The run's blocks come as they arrive and pass their checks (TakeArrivals), and the
  // PullResult carries their count (streamed_blocks): only a kOk result makes the arrivals a
  // run; after any other they are only the pull's leftovers.
  uint64_t StartPull(const std::string& source_endpoint, const std::string& source_server_key, PullRequest request);
  // Ends the pull with kCancelled now; frames still coming for it are dropped.
  void CancelPull(uint64_t transfer_id);
  // Takes the pulls that ended since the last call.
  std::vector<PullResult> TakeResults();
  // Takes the pulls' blocks checked since the last call, oldest first. A pull's arrivals are
  // all queued before its PullResult: taken after TakeResults, they include every block of the
  // results just taken.
  std::vector<Arrival> TakeArrivals();
  // Tells the holder that answered `transfer_id` with `device` that it may unpin the run (the
  // copy is done, or abandoned). A no-op for any other id, and for a run whose deadline +
  // config::kDeviceHoldGrace has passed (the holder let it go by itself).
  void ReleasePull(uint64_t transfer_id);
  // The receiver copied `bytes` of a device answer from `source_endpoint` in `seconds`:
  // counted in that source's stats (the pair's device-to-device bandwidth).
  void RecordDeviceCopy(const std::string& source_endpoint, uint64_t bytes, double seconds);
  // The receiver received `bytes` of an `nccl` answer from `source_endpoint` in `seconds`
  // (from posting the receives to their end, communicator set-up included).
  void RecordNcclCopy(const std::string& source_endpoint, uint64_t bytes, double seconds);

  // Waits until TakePulls, TakeResults, TakeReleases or TakeSpentFrames has something, up to
  // `timeout`.
  // Returns whether it has.
  bool WaitForWork(DurationNs timeout);

  TransferStats Stats() const;
  // Now on the service's clock: the one PullResult::deadline is on.
  TimeNs Now() const;

  // Refuses the pulls not yet served (shuttingDown), sends what is queued, reports every held
  // device run and unfinished stream released (expired) and gives back their frames, stops
  // the I/O thread and closes the sockets. A ServeDevice, or a stream's first ServeFrame,
  // after Stop is reported released at once. Device runs this receiver was answered with and
  // has not released are left to their holders' expiry. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit TransferService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
  std::string bound_endpoint_;
};

}  // namespace kvfleet::transfer
