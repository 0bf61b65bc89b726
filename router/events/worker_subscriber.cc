#include "router/events/worker_subscriber.h"

#include <atomic>

namespace kvfleet::router {

namespace {
// One limit for every worker's late-batch line: a fleet-wide stall makes every worker late.
RateLimit& LateBatchLog() {
  static RateLimit limit;
  return limit;
}
}  // namespace

namespace {
std::atomic<uint64_t> g_next_request_id{1};
}  // namespace

WorkerSubscriber::WorkerSubscriber(WorkerId id, std::string name, const EventPlaneOptions& options,
                                   GlobalIndex* index, Clock* clock, Io* io, EventCounters* counters,
                                   uint32_t indexed_window)
    : id_(id),
      name_(std::move(name)),
      options_(options),
      window_(options.routing_window_size.value_or(indexed_window)),
      index_(index),
      clock_(clock),
      io_(io),
      counters_(counters) {
  stats_.id = id_;
  stats_.name = name_;
  stats_.indexed_window = window_;
}

void WorkerSubscriber::SetState(WorkerState s) {
  if (s != state_) log_->debug("worker {}: {} -> {}", name_, WorkerStateName(state_), WorkerStateName(s));
  state_ = s;
  stats_.state = s;
}

void WorkerSubscriber::Start() {
  last_heard_ = clock_->Now();
  EnterSyncing();
}

void WorkerSubscriber::EnterSyncing() {
  // The router's predictions for requests sent there stay: their blocks are not in any
  // snapshot yet (router/routing/README.md, "Predicted entries").
  index_->ForgetStored(id_);
  epoch_ = 0;
  applied_seq_ = 0;
  last_event_id_ = 0;
  snapshot_started_ = 0;
  SetState(WorkerState::kSyncing);
  Request(0, 0);
}

void WorkerSubscriber::EnterDead() {
  log_->warn("worker {}: no batch for {} ms, marking it dead", name_, options_.heartbeat_timeout / kNsPerMs);
  ++counters_->deaths;
  index_->RemoveWorker(id_);
  buffer_.clear();
  epoch_ = 0;
  live_epoch_ = 0;
  applied_seq_ = 0;
  last_event_id_ = 0;
  pending_request_ = 0;
  load_.reset();
  SetState(WorkerState::kDead);
}

void WorkerSubscriber::Drop() {
  index_->RemoveWorker(id_);
  buffer_.clear();
  pending_request_ = 0;
}

void WorkerSubscriber::Request(uint64_t epoch, uint64_t from_seq) {
  pending_request_ = g_next_request_id.fetch_add(1, std::memory_order_relaxed);
  pending_is_snapshot_ = epoch == 0;
  request_sent_ = clock_->Now();
  if (pending_is_snapshot_) {
    ++counters_->snapshots;
    ++stats_.snapshots;
  } else {
    ++counters_->replays;
    ++stats_.replays;
  }
  io_->RequestReplay(id_, epoch, from_seq, pending_request_);
}

void WorkerSubscriber::Buffer(events::DecodedBatch batch) {
  if (batch.header.epoch != live_epoch_) {
    buffer_.clear();  // invariant 2: only the newest epoch is worth keeping
    live_epoch_ = batch.header.epoch;
  }
  if (epoch_ == batch.header.epoch && batch.header.seq <= applied_seq_) {
    ++counters_->duplicates;
    return;
  }
  buffer_.emplace(batch.header.seq, std::move(batch));
  while (buffer_.size() > options_.max_buffered_batches) buffer_.erase(buffer_.begin());
  stats_.buffered_batches = buffer_.size();
}

void WorkerSubscriber::NotePulls(TimeNs now, uint64_t epoch, const PullTotals& totals) {
  auto it = pull_sources_.find(totals.source);
  if (it == pull_sources_.end()) {
    if (pull_sources_.size() >= events::config::kMaxPullSources) return;  // a worker pulls from fewer
    it = pull_sources_.emplace(totals.source, PullSource{}).first;
  }
  PullSource& s = it->second;
  PullTotals from;  // after a restart the totals count from zero
  if (s.epoch == epoch) {
    if (totals.pulls <= s.last.pulls && totals.failed <= s.last.failed) return;
    from = s.last;
  }
  const double ok = static_cast<double>(totals.pulls - std::min(totals.pulls, from.pulls));
  const double failed = static_cast<double>(totals.failed - std::min(totals.failed, from.failed));
  PullFit& fit = pull_fits_[totals.source];
  fit.Add(ok, static_cast<double>(totals.bytes - std::min(totals.bytes, from.bytes)),
          std::max(0.0, totals.seconds - from.seconds));
  fit.AddOutcomes(now, ok, failed, std::max(0.0, totals.failed_seconds - from.failed_seconds));
  if (failed > 0) last_pull_failure_ = now;
  s.last = totals;
  s.epoch = epoch;
  pull_fits_changed_ = true;
}

void WorkerSubscriber::OnBatch(events::DecodedBatch batch) {
  const TimeNs now = clock_->Now();
  const auto& h = batch.header;
  if (state_ == WorkerState::kLive && h.epoch == epoch_ && h.seq > applied_seq_ + options_.max_seq_jump) {
    // Not heard: a worker that only sends such batches goes DEAD and resyncs.
    ++counters_->seq_too_far;
    uint64_t suppressed = 0;
    if (far_seq_log_.Allow(&suppressed))
      log_->warn("worker {}: seq {} is {} ahead of {}, dropped ({} more suppressed)", name_, h.seq,
                 h.seq - applied_seq_, applied_seq_, suppressed);
    return;
  }
  last_heard_ = now;
  stats_.last_heard = now;
  for (const PullTotals& p : batch.load.pulls) NotePulls(now, h.epoch, p);
  batch.load.pulls.clear();
  load_ = WorkerLoad{batch.load, now};

  switch (state_) {
    case WorkerState::kDead:
      log_->info("worker {} is back (epoch {:016x}), syncing", name_, h.epoch);
      live_epoch_ = h.epoch;
      EnterSyncing();
      Buffer(std::move(batch));
      return;
    case WorkerState::kLive:
      if (h.epoch != epoch_) {
        log_->info("worker {}: new epoch {:016x} (was {:016x}), resyncing", name_, h.epoch, epoch_);
        ++counters_->epoch_changes;
        ++stats_.epoch_changes;
        live_epoch_ = h.epoch;
        buffer_.clear();
        EnterSyncing();
        Buffer(std::move(batch));
        return;
      }
      if (h.seq <= applied_seq_) {
        ++counters_->duplicates;
        return;
      }
      if (h.seq == applied_seq_ + 1) {
        live_epoch_ = h.epoch;
        if (!Apply(batch)) Buffer(std::move(batch));  // resyncing: it may follow the snapshot
        return;
      }
      ++counters_->gaps;
      ++stats_.gaps;
      Buffer(std::move(batch));
      SetState(WorkerState::kReplaying);
      Request(epoch_, applied_seq_ + 1);
      return;
    case WorkerState::kReplaying:
      if (h.epoch != epoch_) {
        ++counters_->epoch_changes;
        ++stats_.epoch_changes;
        live_epoch_ = h.epoch;
        buffer_.clear();
        EnterSyncing();
      }
      Buffer(std::move(batch));
      return;
    case WorkerState::kSyncing:
    case WorkerState::kUnknown:  // never a subscriber's: it starts SYNCING
      Buffer(std::move(batch));
      return;
  }
}

bool WorkerSubscriber::Apply(const events::DecodedBatch& batch) {
  const uint64_t first_id = events::FirstEventId(batch);
  if (first_id != 0 && last_event_id_ != 0 && first_id != last_event_id_ + 1) {
    // Invariant 4: events went missing (or came twice) though the seq was whole.
    ++counters_->event_id_mismatches;
    ++stats_.event_id_mismatches;
    uint64_t suppressed = 0;
    if (event_id_log_.Allow(&suppressed))
      log_->warn("worker {}: batch {} starts at event id {}, not {}; resyncing ({} more suppressed)", name_,
                 batch.header.seq, first_id, last_event_id_ + 1, suppressed);
    EnterSyncing();
    return false;
  }
  if (!batch.events.empty()) last_event_id_ = events::LastEventId(batch);  // 0: an older worker
  ops_.clear();
  for (const kv::KvEvent& e : batch.events) CollectEvent(e);
  FlushOps();
  applied_seq_ = batch.header.seq;
  stats_.applied_seq = applied_seq_;
  ++stats_.batches_applied;
  const double lag = static_cast<double>(clock_->WallNs() - batch.header.created_ns) / 1e9;
  stats_.last_lag_seconds = lag;
  counters_->last_lag_seconds = lag;
  io_->OnApplied(id_, lag);
  if (uint64_t suppressed = 0; lag > 1.0 && LateBatchLog().Allow(&suppressed)) {
    log_->warn("worker {}: batch {} applied {:.1f} s after its creation ({}, {} batches buffered, the last "
               "replay request sent {} ms ago) ({} more suppressed)", name_, batch.header.seq, lag,
               WorkerStateName(state_), buffer_.size(), (clock_->Now() - request_sent_) / kNsPerMs, suppressed);
  }
  return true;
}

void WorkerSubscriber::FlushOps() {
  index_->Apply(id_, ops_);
  ops_.clear();
}

bool WorkerSubscriber::ParentKnown(BlockHash parent) const {
  // The usual case inside a batch: the parent is the previous event's last block.
  if (!ops_.empty() && ops_.back().hash == parent && ops_.back().kind == BlockOp::kStore) return true;
  if (index_->Holds(id_, parent)) return true;
  // A branch off a chain stored earlier in this batch; the window bounds the scan.
  constexpr size_t kParentScan = 1024;
  const size_t stop = ops_.size() > kParentScan ? ops_.size() - kParentScan : 0;
  for (size_t k = ops_.size(); k > stop; --k)
    if (ops_[k - 1].hash == parent && ops_[k - 1].kind == BlockOp::kStore) return true;
  return false;
}

void WorkerSubscriber::CollectEvent(const kv::KvEvent& event) {
  if (event.window_size != window_) {
    ++counters_->other_window;
    return;
  }
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, kv::StoredEvent>) {
          if (e.parent_hash != 0 && !ParentKnown(e.parent_hash)) ++counters_->unknown_parent;
          for (const kv::StoredBlock& b : e.blocks) ops_.push_back(BlockOp{b.hash, BlockOp::kStore, b.tier, b.priority});
          counters_->applied_stored += e.blocks.size();
        } else if constexpr (std::is_same_v<T, kv::RemovedEvent>) {
          for (BlockHash h : e.hashes) ops_.push_back(BlockOp{h, BlockOp::kRemove, e.tier});
          counters_->applied_removed += e.hashes.size();
        } else if constexpr (std::is_same_v<T, kv::UpdatedEvent>) {
          if (e.tier) ops_.push_back(BlockOp{e.hash, BlockOp::kMove, *e.tier});
          if (e.priority) ops_.push_back(BlockOp{e.hash, BlockOp::kPriority, kv::Tier::kDevice, *e.priority});
          ++counters_->applied_updated;
        } else if constexpr (std::is_same_v<T, kv::ClearedEvent>) {
          FlushOps();
          index_->RemoveWorker(id_);
          ++counters_->applied_cleared;
        }
      },
      event.data);
}

void WorkerSubscriber::ApplySnapshotEvents(const std::vector<kv::KvEvent>& events) {
  // Snapshot events are `stored` chains, parents first (Contract 2): their blocks go to the
  // index as one batch, with no parent checks (a chain's parent may be far back in the chunk).
  ops_.clear();
  for (const kv::KvEvent& e : events) {
    const auto* stored = std::get_if<kv::StoredEvent>(&e.data);
    if (stored == nullptr) {
      CollectEvent(e);  // not what a snapshot carries, but harmless: applied the general way
      continue;
    }
    if (e.window_size != window_) {
      ++counters_->other_window;
      continue;
    }
    for (const kv::StoredBlock& b : stored->blocks) {
      ops_.push_back(BlockOp{b.hash, BlockOp::kStore, b.tier, b.priority});
    }
    counters_->applied_stored += stored->blocks.size();
  }
  FlushOps();
}

void WorkerSubscriber::DrainBuffer() {
  if (live_epoch_ != 0 && live_epoch_ != epoch_) {
    // The worker restarted while we synced to its previous life; the buffer holds the new one.
    ++counters_->epoch_changes;
    ++stats_.epoch_changes;
    EnterSyncing();
    return;
  }
  while (!buffer_.empty()) {
    auto it = buffer_.begin();
    if (it->second.header.epoch != epoch_ || it->first <= applied_seq_) {
      buffer_.erase(it);
      continue;
    }
    if (it->first != applied_seq_ + 1) break;
    if (!Apply(it->second)) return;  // resyncing; the buffer waits for the snapshot
    buffer_.erase(it);
  }
  stats_.buffered_batches = buffer_.size();
  if (buffer_.empty()) {
    pending_request_ = 0;
    SetState(WorkerState::kLive);
    return;
  }
  ++counters_->gaps;
  ++stats_.gaps;
  SetState(WorkerState::kReplaying);
  Request(epoch_, applied_seq_ + 1);
}

void WorkerSubscriber::OnReplayReply(const events::ReplayReply& reply) {
  if (state_ == WorkerState::kDead || pending_request_ == 0 || reply.header.request_id != pending_request_) return;
  last_heard_ = clock_->Now();
  stats_.last_heard = last_heard_;
  request_sent_ = last_heard_;  // the timeout measures silence, not the length of a big snapshot
  if (const auto* error = std::get_if<events::ReplayError>(&reply.body)) {
    ++counters_->bad_replies;
    log_->warn("worker {}: replay error: {}", name_, error->message);
    return;  // OnTick asks again after replay_timeout
  }
  if (const auto* batches = std::get_if<std::vector<events::DecodedBatch>>(&reply.body)) {
    if (state_ != WorkerState::kReplaying || reply.header.epoch != epoch_) {
      ++counters_->bad_replies;
      return;
    }
    ApplyReplay(*batches, reply.header.last);
    return;
  }
  ApplySnapshot(reply.header, std::get<events::SnapshotChunk>(reply.body));
}

void WorkerSubscriber::ApplyReplay(const std::vector<events::DecodedBatch>& batches, bool last) {
  for (const events::DecodedBatch& b : batches) {
    if (b.header.epoch != epoch_ || b.header.seq != applied_seq_ + 1) continue;
    if (!Apply(b)) return;  // resyncing: later replies to this request are ignored
  }
  if (last) DrainBuffer();
}

void WorkerSubscriber::ApplySnapshot(const events::ReplyHeader& header, const events::SnapshotChunk& chunk) {
  if (snapshot_started_ != pending_request_) {
    // First chunk: the snapshot replaces whatever the events had said (predictions stay).
    index_->ForgetStored(id_);
    snapshot_started_ = pending_request_;
    epoch_ = header.epoch;
    if (state_ == WorkerState::kReplaying) {
      // The range was gone; count it as a snapshot too.
      ++counters_->snapshots;
      ++stats_.snapshots;
    }
    SetState(WorkerState::kSyncing);
  }
  ApplySnapshotEvents(chunk.events);
  if (!header.last) return;
  applied_seq_ = chunk.consistent_seq;
  last_event_id_ = chunk.consistent_event_id;
  stats_.applied_seq = applied_seq_;
  stats_.epoch = epoch_;
  if (live_epoch_ == 0) live_epoch_ = epoch_;
  DrainBuffer();
}

void WorkerSubscriber::OnTick(bool batches_waiting, bool reply_waiting) {
  const TimeNs now = clock_->Now();
  if (state_ == WorkerState::kDead) return;
  if (now - last_heard_ > options_.heartbeat_timeout && !batches_waiting) {
    EnterDead();
    return;
  }
  const DurationNs timeout = pending_is_snapshot_ ? options_.snapshot_timeout : options_.replay_timeout;
  if (reply_waiting) request_sent_ = now;  // answered; the timeout measures the worker's silence
  if (pending_request_ != 0 && now - request_sent_ > timeout) {
    log_->info("worker {}: replay request timed out, asking again", name_);
    if (state_ == WorkerState::kReplaying && !pending_is_snapshot_) {
      Request(epoch_, applied_seq_ + 1);
    } else {
      EnterSyncing();
    }
  }
  stats_.epoch = epoch_;
}

}  // namespace kvfleet::router
