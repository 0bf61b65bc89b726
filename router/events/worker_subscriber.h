// WorkerSubscriber: Contract 2's per-worker state machine on the router, without sockets.
// EventPlane feeds it live batches and replay replies and lets it ask for replays through
// an Io; it folds what it accepts into the GlobalIndex.
//
//   start ──▶ SYNCING ──snapshot complete, buffer drained──▶ LIVE
//   LIVE ──seq gap──▶ REPLAYING ──batches──▶ LIVE   (or a snapshot: the range was gone)
//   LIVE/REPLAYING ──batch with a new epoch──▶ clear blocks, SYNCING
//   any ──nothing heard for heartbeat_timeout──▶ DEAD (blocks dropped)
//   DEAD ──a batch──▶ SYNCING
//
// Invariants:
//   1. In LIVE, the index holds exactly what the worker held after batch applied_seq of
//      epoch (events of other windows excepted).
//   2. Buffered batches all have seq > applied_seq and belong to the newest epoch heard.
//   3. At most one replay/snapshot request is outstanding (pending_request_ != 0), and only
//      replies carrying its id are used.
//   4. last_event_id is the eventId of the last event applied (or the snapshot's
//      consistentEventId), 0 when unknown; the next batch with events must start at
//      last_event_id + 1. One that does not lost or repeated events behind a seq that looked
//      whole: it is counted and the worker resyncs from a snapshot.
//
// Thread safety: thread-compatible; owned by the event plane's event thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "router/core/pull_fit.h"
#include "router/events/event_plane.h"
#include "router/index/global_index.h"
#include "schema/event_codec.h"

namespace kvfleet::router {

// Counters shared by every subscriber of a plane; EventPlane exports them as metrics.
struct EventCounters {
  uint64_t applied_stored = 0, applied_removed = 0, applied_updated = 0, applied_cleared = 0;
  uint64_t gaps = 0, replays = 0, snapshots = 0, epoch_changes = 0, unknown_parent = 0;
  uint64_t duplicates = 0, seq_too_far = 0, other_window = 0, bad_replies = 0, deaths = 0;
  uint64_t event_id_mismatches = 0;
  double last_lag_seconds = 0;
};

class WorkerSubscriber {
 public:
  class Io {
   public:
    virtual ~Io() = default;
    // Send ReplayRequest{epoch, from_seq, request_id} to the worker's replay ROUTER.
    virtual void RequestReplay(WorkerId worker, uint64_t epoch, uint64_t from_seq, uint64_t request_id) = 0;
    // A batch was applied; lag = router wall clock - batch creation (for the histogram).
    virtual void OnApplied(WorkerId worker, double lag_seconds) = 0;
  };

  // REQUIRES: index, clock, io and counters outlive the subscriber. Events of windowSize
  // indexed_window are indexed, unless options.routing_window_size overrides it.
  WorkerSubscriber(WorkerId id, std::string name, const EventPlaneOptions& options, GlobalIndex* index,
                   Clock* clock, Io* io, EventCounters* counters, uint32_t indexed_window = 0);

  // Enters SYNCING and asks for a snapshot.
  void Start();
  // A batch from the SUB socket (already decoded and checked against the topic).
  void OnBatch(events::DecodedBatch batch);
  // A reply from the replay DEALER (already decoded and validated: DecodeReplayReply).
  // Replies that do not carry the outstanding request's id are ignored.
  void OnReplayReply(const events::ReplayReply& reply);
  // Heartbeat and replay timeouts. Call often (every few ms). `batches_waiting`: batches sit
  // unread in the plane's socket (it was busy, applying a snapshot say), so the silence may be
  // the reader's rather than the worker's: no death verdict until they are read.
  // `reply_waiting`: this worker's reply sits unread in its replay socket (the plane reads
  // other workers' snapshots first), so the outstanding request has not timed out.
  void OnTick(bool batches_waiting = false, bool reply_waiting = false);
  // Drops the worker's blocks from the index (RemoveWorker).
  void Drop();

  WorkerId id() const { return id_; }
  const std::string& name() const { return name_; }
  WorkerState state() const { return state_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t applied_seq() const { return applied_seq_; }
  // Whether a replay or snapshot request is outstanding: its answer is awaited.
  bool awaiting_reply() const { return pending_request_ != 0; }
  uint64_t last_event_id() const { return last_event_id_; }
  size_t buffered() const { return buffer_.size(); }
  TimeNs last_heard() const { return last_heard_; }
  const std::optional<WorkerLoad>& load() const { return load_; }
  // What the worker's pulls took, by holder endpoint (Load.pulls, router/core/pull_fit.h).
  // The load() a batch leaves carries no pull totals: they are folded in here.
  const std::map<std::string, PullFit, std::less<>>& pull_fits() const { return pull_fits_; }
  // Whether pull_fits() changed since the last call.
  bool TakePullFitsChanged() { return std::exchange(pull_fits_changed_, false); }
  // When a batch last reported one of the worker's pulls failed (0: never).
  TimeNs last_pull_failure() const { return last_pull_failure_; }
  // Per-worker counts for /fleet.
  const WorkerEventStats& stats() const { return stats_; }

 private:
  void EnterSyncing();
  void EnterDead();
  void Request(uint64_t epoch, uint64_t from_seq);
  void Buffer(events::DecodedBatch batch);
  // Folds the batch into the index. False, with nothing applied, when its event ids do not
  // follow on (invariant 4): the subscriber is then SYNCING.
  bool Apply(const events::DecodedBatch& batch);
  // Adds the event's block changes to ops_ (a `cleared` flushes ops_ and drops the
  // worker's blocks at once, so later events of the batch land after it).
  void CollectEvent(const kv::KvEvent& event);
  // Whether `parent` is indexed for this worker or stored earlier in ops_.
  bool ParentKnown(BlockHash parent) const;
  // Applies ops_ to the index as one batch and clears it.
  void FlushOps();
  // Applies a replay's batches in seq order. REQUIRES: REPLAYING, the reply of epoch_.
  void ApplyReplay(const std::vector<events::DecodedBatch>& batches, bool last);
  // Applies one snapshot chunk; the first replaces the worker's blocks, the last brings the
  // subscriber to the seq and event id it is consistent with.
  void ApplySnapshot(const events::ReplyHeader& header, const events::SnapshotChunk& chunk);
  // Applies a snapshot chunk's events to the index as one batch.
  void ApplySnapshotEvents(const std::vector<kv::KvEvent>& events);
  // Applies buffered batches that follow applied_seq; LIVE when none is missing, else
  // REPLAYING from the first missing seq.
  void DrainBuffer();
  void SetState(WorkerState s);
  // Folds one holder's pull totals from a batch of `epoch`, heard at `now`, into its fit: the
  // increment since the totals last seen, or the whole totals after a restart (another
  // epoch). Totals no greater than those seen (a duplicate or reordered batch) add nothing.
  void NotePulls(TimeNs now, uint64_t epoch, const PullTotals& totals);

  const WorkerId id_;
  const std::string name_;
  const EventPlaneOptions& options_;
  const uint32_t window_;  // windowSize of the events indexed
  GlobalIndex* const index_;
  Clock* const clock_;
  Io* const io_;
  EventCounters* const counters_;
  std::shared_ptr<spdlog::logger> log_ = Logger("events");

  WorkerState state_ = WorkerState::kSyncing;
  uint64_t epoch_ = 0;        // the epoch applied_seq belongs to; 0 = none yet
  uint64_t applied_seq_ = 0;
  uint64_t last_event_id_ = 0;  // invariant 4; 0 = unknown
  uint64_t live_epoch_ = 0;   // epoch of the newest live batch heard
  std::map<uint64_t, events::DecodedBatch> buffer_;  // seq -> batch, all of live_epoch_
  uint64_t pending_request_ = 0;  // outstanding request id; 0 = none
  bool pending_is_snapshot_ = false;
  TimeNs request_sent_ = 0;
  uint64_t snapshot_started_ = 0;  // request id whose snapshot chunks are being applied
  TimeNs last_heard_ = 0;
  std::optional<WorkerLoad> load_;
  WorkerEventStats stats_;
  RateLimit far_seq_log_, event_id_log_;
  std::vector<BlockOp> ops_;  // the batch being collected; reused
  struct PullSource {
    PullTotals last;
    uint64_t epoch = 0;
  };
  std::map<std::string, PullSource, std::less<>> pull_sources_;  // by holder endpoint
  std::map<std::string, PullFit, std::less<>> pull_fits_;
  bool pull_fits_changed_ = false;
  TimeNs last_pull_failure_ = 0;
};

}  // namespace kvfleet::router
