// KvPulls: the worker loop's part of KV transfer between workers (Contract 4,
// schema/README.md), on the engine thread, between steps.
//
// Receiver: a Generate whose PullHint names another worker holding more of its prompt than
// this one. Start() registers the prompt's hinted blocks with the KV cache manager
// (BeginImport: blocks for what is missing are allocated now, to be stored at
// config::kPulledPriority), asks the holder for the missing
// chain through the TransferService, and holds the request in the engine's queue (Engine::Hold):
// the pull overlaps its wait. When the pull ends, Poll() checks each block's tokens against
// the prompt, writes the verified leading run into the allocated blocks (the backend's
// WriteKvBlocks), stores it (stored events: every router learns of the second holder) and
// unholds the request. The stored chain stays referenced for the request (and those that
// waited for the same pull) until its own KV sequence holds it, at its admission: a busy
// worker's queue would otherwise evict the pulled blocks, stored below the default priority,
// before the request that came for them runs (they are released at once instead when the
// cache is short: a step preempts a running request, or a request waiting ahead of them does
// not fit). The bytes of a pull over TCP are written as they arrive, a frame at a
// time (WriteArrival), overlapping the rest of the transfer; only a pull that ends ok stores
// them. Whatever the pull did not bring (the holder evicted it, died, was late,
// sent a bad checksum or refused) the request computes: a transfer never fails a request.
//
// Holder: Poll() answers the pulls that arrived: the layout and namespace must match this
// worker's, then the leading run it still holds is pinned and streamed (ServeStreams): each
// Poll reads at most a frame of it into a reused buffer for the service to send, and the run
// is unpinned once its last frame has left or the transfer ended early. A pull for blocks
// this worker is still computing (a request here, running or queued, has more of the chain in its prompt than
// this worker holds: a prefix routed here a moment ago) waits for them: it is answered once they are stored, or at half its
// deadline with what is held then, so the receiver has the other half for the transfer. The
// router sends such pulls on purpose (router/routing/README.md, "Pulling a prefix being computed").
//
// Same host (options.host_id, a cuda backend): a pull offering this host's id gets the
// leading run's device slots and the pools' IPC handles instead of bytes. The holder keeps
// the run pinned until the receiver's release (or its deadline and a grace); the receiver
// copies device to device, then releases. A holder it cannot map (another IPC namespace,
// the same process) is asked for bytes from then on.
//
// NCCL (a backend::KvNccl, --transfer-nccl): where CUDA IPC is not possible (a pull without a
// host id, or another host's), a pull offering NCCL gets the leading device run by NCCL
// send/recv (kv_pulls_nccl.cc). The holder answers with the pair's communicator (a new one
// when the receiver names none or another), keeps the run pinned, and sends it once its
// answer has left; the receiver receives the whole run into the blocks it allocated, in the
// order the answers came, and imports the verified leading run when the receive ends. A
// failed or late transfer costs that pull's prefix (`pull_fallbacks{reason="nccl_failed"}`),
// never the request, and the pair's next pull sets up a new communicator.
//
// Thread safety: thread-compatible; the engine thread calls every method.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "schema/load_report.h"
#include "schema/requests.h"
#include "schema/transfer_codec.h"
#include "worker/backend/backend.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/server/serve_streams.h"
#include "worker/transfer/transfer_service.h"

namespace kvfleet::server::config {
// The first pull between two workers sets up their NCCL communicator (measured 0.5 to 0.65 s
// on one H200 host): its transfer may take this long from its answer even past the pull's
// deadline, so a short deadline cannot keep a pair from ever meeting. Later pulls reuse it.
constexpr DurationNs kNcclSetupTimeout = 3 * kNsPerSec;
// A pair's communicator holds device memory on both GPUs (NCCL's buffers, per channel) and
// costs about 0.55 s to set up again. A worker lets go of one that has moved nothing for this
// long, and keeps at most kMaxNcclPeers (the least recently used goes first): a fleet's
// workers pull from a few holders at a time, not from every worker they ever met.
constexpr DurationNs kNcclPeerIdle = 120 * kNsPerSec;
constexpr size_t kMaxNcclPeers = 16;
// A request that pulls its prefix was sent here for this worker's load, not its cache: the
// pulled blocks are the fleet's second copy (losing them costs another pull, not a recompute),
// and the rest of its blocks hang under them (a radix tree evicts children first). So the
// receiver stores all of its blocks (the pulled prefix, its own prompt and what it generates)
// one below the default priority, where its own retention says nothing: they make room before
// blocks of the same age that requests came here for, until a later request reuses them, which
// raises them as any reuse does. Pulls tripled a mock fleet's evictions at the default priority
// (tests/bench/results/2026-11-30-transfer-in-flight.txt). Below --offload-min-priority's default
// (35), they are dropped rather than offloaded to a host tier; 34 offloads them too.
constexpr uint8_t kPulledPriority = kv::kDefaultPriority - 1;
}  // namespace kvfleet::server::config

namespace kvfleet::server {

struct KvPullsOptions {
  std::string model;                     // the served model: the hash namespace's
  std::string own_endpoint;              // this worker's transfer endpoint: a hint naming it is no pull
  // The longest a pull may take; a hint's own deadline is capped by it, and a hint without
  // one gets it. A pull not done by then is computed instead.
  DurationNs deadline = 10 * kNsPerSec;
  // This host's identity (ThisHostId()); empty: no device copies. A cuda worker offers it in
  // its pulls and answers a pull offering the same one with its device blocks (CUDA IPC)
  // instead of their bytes.
  std::string host_id;
  // NCCL communicators kept (config::kNcclPeerIdle, config::kMaxNcclPeers).
  DurationNs nccl_peer_idle = config::kNcclPeerIdle;
  size_t max_nccl_peers = config::kMaxNcclPeers;
};

// The host's boot id (/proc/sys/kernel/random/boot_id): two workers showing the same one
// run on one host. Empty when it cannot be read.
std::string ThisHostId();

// What a worker's pulls and serves came to, for /metrics.
struct KvPullStats {
  uint64_t started = 0;
  uint64_t imported_blocks = 0;   // blocks pulled, checked and stored
  uint64_t skipped = 0;           // hints for blocks this worker already held, or none usable
  uint64_t waited = 0;            // requests that waited for a pull another request started
  uint64_t token_mismatches = 0;  // pulled blocks whose tokens were not the prompt's (a hash collision)
  uint64_t write_failures = 0;    // the backend could not write a pulled run
  std::map<std::string, uint64_t> fallbacks;  // pulls that brought less than asked, by outcome
  uint64_t served_requests = 0;   // pulls this worker answered with blocks
  uint64_t refused_requests = 0;  // pulls it refused (not held, layout, namespace)
  uint64_t device_pulls = 0;      // pulls answered with device blocks, copied here (CUDA IPC)
  uint64_t device_served = 0;     // pulls this worker answered with its device blocks
  uint64_t device_held = 0;       // of those, still pinned for their receivers now
  uint64_t nccl_pulls = 0;        // pulls whose run was received here by NCCL
  uint64_t nccl_served = 0;       // pulls this worker answered by NCCL
  uint64_t nccl_send_failures = 0;  // of those, runs whose send failed or timed out
  uint64_t nccl_held = 0;         // runs pinned now for an NCCL answer (sending or to send)
  uint64_t bytes_held = 0;        // runs pinned now for a bytes answer (read and sent a frame at a time)
  uint64_t nccl_peers = 0;        // peers this worker keeps a communicator with now
  uint64_t nccl_peers_forgotten = 0;  // communicators let go: idle, or past kMaxNcclPeers
  uint64_t kept_blocks = 0;       // pulled blocks kept now for requests not admitted yet
  uint64_t in_flight = 0;         // pulls started here and not ended now
  uint64_t held_requests = 0;     // requests held now for those pulls (their own, or waiting on another's)
  // Pulls held for blocks this worker was computing, by how the wait ended: the blocks were
  // stored (or their sequence ended), or half the pull's deadline passed first.
  uint64_t serve_waits_stored = 0;
  uint64_t serve_waits_cut = 0;
};

class KvPulls {
 public:
  // `service` may be null: no pulls, and pulls from others are never seen. The pointers
  // outlive this object.
  // `nccl` may be null too: no NCCL transfers.
  KvPulls(const KvPullsOptions& options, transfer::TransferService* service, kv::KvCacheManager* kv,
          backend::ModelBackend* backend, engine::Engine* engine, backend::KvNccl* nccl = nullptr);

  // This worker's block layout, as a PullRequest carries it; nullopt when its backend or KV
  // setup cannot move blocks (and unsupported() says why).
  const std::optional<transfer::Layout>& layout() const { return layout_; }
  const std::string& unsupported() const { return unsupported_; }
  // Whether pulls with workers on this host copy device blocks (options.host_id, a cuda backend).
  bool device() const { return device_; }
  const std::string& host_id() const { return options_.host_id; }
  // Whether pulls offer, and answers may use, NCCL (a KvNccl, and blocks that can move).
  bool nccl() const { return nccl_ != nullptr && layout_.has_value(); }

  // Whether Start wants to see a request that came with `hint`: a hint, or pulls in flight
  // that it may wait for.
  bool Wants(const PullHint& hint) const { return service_ != nullptr && (!hint.source.empty() || !pending_.empty()); }
  // Request `id` (just added to the engine) came with `hint`: pulls what this worker lacks
  // of the hinted prefix, holding the request meanwhile. A request whose prompt contains a
  // chain being pulled now waits for that pull instead of computing the chain again. Nothing
  // happens when neither applies.
  void Start(engine::RequestId id, const engine::GenerateRequest& request, const PullHint& hint);
  // Serves pulls that arrived (reading at most a frame of each bytes answer); imports pulls
  // that ended and unholds their requests.
  void Poll();
  // Whether a Poll now would read a frame of a bytes answer: the worker loop should not idle.
  bool reading() const { return streams_.has_value() && streams_->ready(); }
  // The bytes answers being streamed (null: this worker's blocks cannot move).
  const ServeStreams* streams() const { return streams_ ? &*streams_ : nullptr; }
  // Pulls in flight.
  size_t pending() const { return pending_.size(); }
  // Pulls from others waiting here for blocks this worker is computing.
  size_t waiting() const { return waiting_.size(); }
  const KvPullStats& stats() const { return stats_; }
  // What this worker's pulls took, by holder (Contract 2's Load.pulls): the totals of every
  // holder whose totals changed since the last call. A pull counts once it has imported
  // blocks, with the time from its start to then: what its request waited for the prefix
  // (the holder's answer, the transfer, an NCCL receive or device copy, and the import,
  // which waits for this worker's step in progress).
  std::vector<PullTotals> TakeChangedPullTotals();

 private:
  struct Pending {
    engine::RequestId request = 0;
    kv::ImportPlan plan;
    std::vector<TokenId> tokens;  // the prompt's hinted blocks
    uint64_t seed = 0;            // their hash namespace (Contract 1)
    std::vector<engine::RequestId> waiters;  // later requests holding for this pull
    std::string source;           // the holder's transfer endpoint (PullResult::source)
    TimeNs started = 0;           // on the service's clock
    // Receiving by NCCL: the run's blocks and its verified leading run.
    uint32_t nccl_received = 0;
    uint32_t nccl_good = 0;
    // Receiving bytes (streamed, WriteArrival): blocks arrived, the leading run of them whose
    // tokens are the prompt's written into plan's blocks, and whether writing has stopped (a
    // token mismatch, a gap, or a failed write: write_failed).
    uint32_t arrived = 0;
    uint32_t written = 0;
    bool stopped = false;
    bool write_failed = false;
  };
  // Holder: a run pinned for an NCCL answer, sent once the answer has left.
  struct NcclHeld {
    std::vector<kv::ExportedBlock> run;
    backend::KvNccl::Transfer transfer;  // blocks, peer, comm and unique id; id and timeout at Submit
    TimeNs deadline = 0;                 // the pull's, on the service's clock
  };
  // Holds `id` for a pull in flight whose first pulled block its prompt has, if any.
  bool WaitForPull(engine::RequestId id, const engine::GenerateRequest& request);
  // Answers `pull` (`waited`: it waited in waiting_ since an earlier Poll), or, once its layout
  // and namespace are checked, puts it in waiting_ (WaitForBlocks).
  void Serve(const transfer::IncomingPull& pull, bool waited);
  // Whether `pull` (of this worker's layout and model) waits in waiting_ for blocks of its chain
  // this worker is computing: true while a request here has more of the chain than is held
  // (ComputingRun), until half the pull's deadline.
  bool WaitForBlocks(const transfer::IncomingPull& pull, bool waiting);
  // The longest leading run of `r`'s chain that a request here has in its prompt: a live KV
  // sequence's (KvCacheManager::LiveRun), or one queued and not yet admitted.
  uint32_t ComputingRun(const transfer::PullRequest& r) const;
  // Serve's same-host path: pins the leading run on the device and sends its slots; false
  // when there is none to send that way (the bytes path answers).
  bool ServeDevice(const transfer::IncomingPull& pull);
  // Pins the leading run of `r`'s chain that lies in the device pools; empty when none does.
  std::vector<kv::ExportedBlock> PinDeviceRun(const transfer::PullRequest& r);
  // kv_pulls_nccl.cc. Serve's NCCL path: pins the leading device run and answers with the
  // pair's communicator; false when there is none to send that way.
  bool ServeNccl(const transfer::IncomingPull& pull);
  // Holder: the answer `r` left (send the run now) or did not (unpin).
  void NcclAnswered(const transfer::Released& r);
  // Receiver: posts the receive of an `nccl` answer; false when it cannot (the pull ends now).
  bool ReceiveNccl(Pending& p, const transfer::PullResult& result);
  // Both: NCCL transfers that ended.
  void PollNccl();
  // Both: `peer` (a receiver's name, or a holder's endpoint) moved a run now.
  void TouchNcclPeer(const std::string& peer);
  // Both: forgets the communicators of peers idle past options_.nccl_peer_idle, or past the
  // options_.max_nccl_peers most recently used, that no pull in flight uses.
  void ForgetIdleNcclPeers();
  bool NcclPeerBusy(const std::string& peer) const;
  // Holder: `t`'s communicator is no longer the one its receiver is known to keep.
  void Unanswer(const backend::KvNccl::Transfer& t);
  // Receiver: writes a streamed pull's arrived blocks into the blocks its import allocated,
  // as far as their tokens are the prompt's (one WriteKvBlocksFrom per pool).
  void WriteArrival(const transfer::Arrival& a);
  // The verified leading run of an ok device or nccl result: blocks whose tokens are the prompt's.
  uint32_t CountGood(const Pending& p, const transfer::PullResult& result, size_t received);
  void Finish(Pending& p, transfer::PullResult& result);
  // Ends pull `p` with `good` blocks imported: stores them, counts (and logs at debug, with the
  // transfer's `status`) a fallback `why` when fewer than wanted, unholds its requests.
  void Complete(Pending& p, uint32_t good, const std::string& why, const Status& status);
  // Releases the kept imports none of whose requests awaits admission any more; every one
  // when `all`.
  void ReleaseKept(bool all);
  // Finish's same-host path: copies the verified leading run `good` from the holder's device
  // blocks; returns how many were written.
  uint32_t CopyFromDevice(Pending& p, const transfer::PullResult& result, uint32_t good);

  KvPullsOptions options_;
  transfer::TransferService* service_;
  kv::KvCacheManager* kv_;
  backend::ModelBackend* backend_;
  engine::Engine* engine_;
  std::optional<transfer::Layout> layout_;
  std::string unsupported_;
  std::map<uint64_t, Pending> pending_;  // by transfer id
  // Receiver: pulls stored for requests not yet admitted; each keeps its chain referenced.
  struct Kept {
    kv::ImportPlan plan;
    std::vector<engine::RequestId> requests;  // the pull's request and those that waited for it
  };
  std::vector<Kept> kept_;
  std::vector<transfer::IncomingPull> waiting_;  // holder: pulls waiting for blocks being computed
  std::optional<ServeStreams> streams_;  // holder: bytes answers, with a layout
  bool device_ = false;                  // the backend exports and copies device blocks
  // Holder: runs pinned for receivers copying them, by (peer token, transfer id).
  std::map<std::pair<uint64_t, uint64_t>, std::vector<kv::ExportedBlock>> held_;
  std::set<std::string> no_device_sources_;  // holders whose device blocks could not be mapped here
  backend::KvNccl* nccl_ = nullptr;
  // Holder: NCCL answers by (peer token, transfer id), pinned until their send ends.
  std::map<std::pair<uint64_t, uint64_t>, NcclHeld> nccl_held_;
  std::map<std::string, uint64_t> answered_comm_;  // holder: per receiver, the last communicator answered
  std::map<std::string, TimeNs> nccl_peer_used_;  // both: peers with a communicator, by last use
  TimeNs next_nccl_sweep_ = 0;
  uint64_t next_comm_ = 0;                      // holder: communicator numbers, from a random start
  uint64_t next_nccl_id_ = 1;                   // KvNccl transfer ids
  // KvNccl transfers in flight: a receive's pull (transfer id), a send's NCCL answer.
  std::map<uint64_t, uint64_t> nccl_receiving_;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> nccl_sending_;
  KvPullStats stats_;
  std::map<std::string, PullTotals> totals_;  // by holder: its pulls, those that failed apart (Load.pulls)
  std::set<std::string> changed_totals_;      // holders whose totals changed since TakeChangedPullTotals
};

}  // namespace kvfleet::server
