#include <algorithm>

#include "router/events/event_plane_impl.h"

namespace kvfleet::router {

namespace {

namespace tuning {
// The event thread wakes at least this often to run heartbeat and replay timeouts.
constexpr auto kPollInterval = std::chrono::milliseconds(5);
// Messages taken from the SUB socket per loop turn, so replies and commands are not starved.
constexpr int kMaxSubMessagesPerTurn = 4096;
// Gauges (index blocks, worker state) and views are refreshed this often.
constexpr DurationNs kGaugeInterval = 250 * kNsPerMs;
// Expired predicted entries are swept this often.
constexpr DurationNs kSweepInterval = kNsPerSec;
// Subscribers' timeouts (heartbeat, replay) are checked this often, not every turn: a turn
// can be one batch long, and the check walks every worker.
constexpr DurationNs kTickInterval = 5 * kNsPerMs;
// Replay DEALERs with no request outstanding are not polled (a fleet of them made every turn
// cost O(workers)); what they receive all the same (an answer after its timeout) is read and
// dropped this often.
constexpr DurationNs kIdleDrainInterval = kNsPerSec;
// Replies (snapshot chunks of up to 64K blocks, replayed batches) are read for at most this
// long a turn (at least one message), one worker's through before the next's, so that live
// batches are read between the chunks of a syncing fleet's snapshots.
constexpr DurationNs kReplyBudget = 10 * kNsPerMs;
// Commands (workers added or removed: sockets, series) are handled for at most this long a
// turn (at least one): a fleet registering at once must not hold back its live batches.
constexpr DurationNs kCommandBudget = 10 * kNsPerMs;
// A loop turn longer than this is logged with where its time went (rate-limited).
constexpr DurationNs kSlowTurn = 200 * kNsPerMs;
}  // namespace tuning

}  // namespace

EventPlane::Impl::Impl(const EventPlaneOptions& options, Clock* clock, prometheus::Registry* metrics)
    : options_(options), clock_(clock), index_(options.index, clock), ctx_(1) {
  KVF_CHECK(metrics != nullptr);
  for (auto& s : states_) s.store(WorkerState::kUnknown, std::memory_order_relaxed);
  auto& r = *metrics;
  f_applied_ = &prometheus::BuildCounter()
                    .Name("kvfleet_router_events_applied_total")
                    .Help("KV block events applied to the index, by type")
                    .Register(r);
  m_stored_ = &f_applied_->Add({{"type", "stored"}});
  m_removed_ = &f_applied_->Add({{"type", "removed"}});
  m_updated_ = &f_applied_->Add({{"type", "updated"}});
  m_cleared_ = &f_applied_->Add({{"type", "cleared"}});
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
  };
  m_gaps_ = counter("kvfleet_router_event_gaps_total", "Seq gaps seen in live KV event batches");
  m_replays_ = counter("kvfleet_router_event_replays_total", "Replay requests sent to workers");
  m_snapshots_ = counter("kvfleet_router_event_snapshots_total", "Snapshots requested or received from workers");
  m_epochs_ = counter("kvfleet_router_event_epoch_changes_total", "Worker restarts seen as a new event epoch");
  m_unknown_parent_ =
      counter("kvfleet_router_event_unknown_parent_total", "Stored events whose parent block the index did not hold");
  m_event_id_mismatches_ = counter("kvfleet_router_event_id_mismatches_total",
                                   "Batches whose event ids did not follow the last applied one though their seq "
                                   "did (events lost or repeated); each resyncs the worker from a snapshot");
  m_disconnects_ = counter("kvfleet_router_event_disconnects_total",
                           "Event stream connections dropped: a worker gone, or one that sent a frame over "
                           "schema/limits.h's bound");
  f_malformed_ = &prometheus::BuildCounter()
                      .Name("kvfleet_router_events_malformed_total")
                      .Help("KV event messages dropped as malformed, by reason")
                      .Register(r);
  f_blocks_ = &prometheus::BuildGauge()
                   .Name("kvfleet_router_index_blocks")
                   .Help("Blocks in the global index, by worker and tier")
                   .Register(r);
  f_state_ = &prometheus::BuildGauge()
                  .Name("kvfleet_router_worker_state")
                  .Help("1 for the event subscriber state each worker is in")
                  .Register(r);
  m_lag_ = &prometheus::BuildHistogram()
                .Name("kvfleet_router_event_lag_seconds")
                .Help("Time from a batch's creation on the worker to its application in the index")
                .Register(r)
                .Add({}, prometheus::Histogram::BucketBoundaries{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
                                                                  0.25, 0.5, 1, 2.5, 5});

  const auto& curve = options_.curve;
  if (!curve.client_keypair_file.empty() || !curve.server_public_key_file.empty()) {
    auto keys = LoadCurveKeyPair(curve.client_keypair_file);
    auto server = LoadCurvePublicKey(curve.server_public_key_file);
    KVF_CHECK(keys.ok() && server.ok()) << "event plane CURVE keys: " << keys.status().ToString() << " / "
                                        << server.status().ToString();
    client_keys_ = *keys;
    server_public_ = *server;
    curve_ = true;
  }
  status_ = OpenSub();
  if (!status_.ok()) log_->error("event plane: {}", status_.message());
  thread_ = std::thread([this] { Run(); });
}

Status EventPlane::Impl::OpenSub() {
  auto max = SetMaxSockets(ctx_, options_.max_workers + config::kEventSocketHeadroom);
  if (!max.ok()) return max.status();
  try {
    // The event thread runs at the background priority; so do the threads that feed it.
    StartZmqThreadsAtLowerPriority(ctx_);
    sub_ = zmq::socket_t(ctx_, zmq::socket_type::sub);
    sub_.set(zmq::sockopt::rcvhwm, options_.sub_rcvhwm);
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxEventMessageBytes);
    if (curve_) KVF_RETURN_IF_ERROR(MakeCurveClient(sub_, client_keys_, server_public_));
    sub_.set(zmq::sockopt::subscribe, "kv.");
    KVF_ASSIGN_OR_RETURN(sub_monitor_, SocketMonitor::Start(ctx_, sub_, ZMQ_EVENT_DISCONNECTED));
  } catch (const zmq::error_t& e) {
    return ResourceExhausted(std::string("cannot make the SUB socket: ") + e.what());
  }
  return Status::Ok();
}

EventPlane::Impl::~Impl() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void EventPlane::Impl::Enqueue(Command c, bool wait) {
  std::unique_lock lock(cmd_mu_);
  cmds_.push_back(std::move(c));
  const uint64_t ticket = ++cmds_queued_;
  if (wait) cmd_cv_.wait(lock, [&] { return cmds_done_ >= ticket || stop_.load(); });
}

void EventPlane::Impl::RequestReplay(WorkerId worker, uint64_t epoch, uint64_t from_seq, uint64_t request_id) {
  auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  const std::string payload = events::EncodeReplayRequest({epoch, from_seq, request_id});
  // A full pipe drops the request; the replay timeout asks again.
  (void)it->second->dealer.send(zmq::buffer(payload), zmq::send_flags::dontwait);
}

void EventPlane::Impl::Malformed(const char* reason, const std::string& detail) {
  f_malformed_->Add({{"reason", reason}}).Increment();
  uint64_t suppressed = 0;
  if (malformed_log_.Allow(&suppressed))
    log_->warn("dropped a malformed KV event message ({}): {} ({} more suppressed)", reason, detail, suppressed);
}

void EventPlane::Impl::Add(const Command& c) {
  if (auto it = workers_.find(c.id); it != workers_.end()) {
    if (it->second->name == c.name && it->second->endpoints.events == c.endpoints.events &&
        it->second->endpoints.replay == c.endpoints.replay && it->second->indexed_window == c.indexed_window)
      return;  // idempotent
    Remove(c.id);
  }
  auto e = std::make_unique<Entry>();
  e->id = c.id;
  e->name = c.name;
  e->endpoints = c.endpoints;
  e->indexed_window = c.indexed_window;
  retry_.erase(c.id);
  if (Status st = OpenSockets(*e, c); !st.ok()) {
    e->dealer.close();
    retry_[c.id] = c;
    uint64_t suppressed = 0;
    if (socket_errors_log_.Allow(&suppressed))
      log_->error("worker {}: {}; trying again in a second ({} more suppressed)", c.name, st.message(), suppressed);
    return;
  }
  ++replay_sockets_;
  for (int t = 0; t < kv::kNumTiers; ++t)
    e->blocks_gauge[t] = &f_blocks_->Add({{"worker", c.name}, {"tier", kv::TierName(static_cast<kv::Tier>(t))}});
  for (int s = 0; s < kEventStreamStates; ++s)
    e->state_gauge[s] = &f_state_->Add({{"worker", c.name}, {"state", WorkerStateName(static_cast<WorkerState>(s))}});
  e->sub = std::make_unique<WorkerSubscriber>(c.id, c.name, options_, &index_, clock_, this, &counters_,
                                              c.indexed_window);
  by_topic_["kv." + c.name] = c.id;
  Entry& ref = *e;
  workers_[c.id] = std::move(e);
  const uint32_t window = ref.sub->stats().indexed_window;
  log_->info("subscribing to worker {} ({}, replay {}), indexing the events of its {} pool", c.name,
             c.endpoints.events, c.endpoints.replay,
             window == 0 ? std::string("full-attention") : "window-" + std::to_string(window));
  ref.sub->Start();
  RefreshView(ref);
}

Status EventPlane::Impl::OpenSockets(Entry& e, const Command& c) {
  try {
    e.dealer = zmq::socket_t(ctx_, zmq::socket_type::dealer);
    e.dealer.set(zmq::sockopt::linger, 0);
    e.dealer.set(zmq::sockopt::rcvhwm, 0);  // snapshot chunks must not be dropped
    e.dealer.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxEventMessageBytes);
    if (curve_) KVF_RETURN_IF_ERROR(MakeCurveClient(e.dealer, client_keys_, server_public_));
    e.dealer.connect(c.endpoints.replay);
    sub_.connect(c.endpoints.events);
  } catch (const zmq::error_t& err) {
    return ResourceExhausted("cannot connect to " + c.endpoints.events + " / " + c.endpoints.replay + ": " +
                             err.what());
  }
  return Status::Ok();
}

void EventPlane::Impl::RetryAdds(TimeNs now) {
  if (retry_.empty() || now - last_retry_ < kNsPerSec) return;
  last_retry_ = now;
  std::vector<Command> again;
  for (auto& [id, c] : retry_) again.push_back(c);
  for (const Command& c : again) Add(c);
}

void EventPlane::Impl::Remove(WorkerId id) {
  retry_.erase(id);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  Entry& e = *it->second;
  try {
    sub_.disconnect(e.endpoints.events);
  } catch (const zmq::error_t&) {
  }
  e.sub->Drop();
  // Series and topics are per name: a worker of the same name under another id keeps them.
  bool name_shared = false;
  for (const auto& [other, entry] : workers_) name_shared = name_shared || (other != id && entry->name == e.name);
  if (!name_shared) {
    for (auto* g : e.blocks_gauge) f_blocks_->Remove(g);
    for (auto* g : e.state_gauge) f_state_->Remove(g);
  }
  if (auto topic = by_topic_.find("kv." + e.name); topic != by_topic_.end() && topic->second == id) {
    by_topic_.erase(topic);
  }
  --replay_sockets_;
  workers_.erase(it);
  std::lock_guard lock(view_mu_);
  views_.erase(id);
  loads_[id].reset();
  pull_fits_.erase(id);
  SetState(id, WorkerState::kUnknown);
}

void EventPlane::Impl::HandleCommand(Command& c) {
  switch (c.kind) {
    case Command::kAdd: Add(c); break;
    case Command::kRemove: Remove(c.id); break;
    case Command::kNoop: break;
  }
}

size_t EventPlane::Impl::HandleCommands(TimeNs until) {
  size_t handled = 0;
  while (true) {
    Command c;
    {
      std::lock_guard lock(cmd_mu_);
      if (cmds_.empty() || (handled > 0 && clock_->Now() >= until)) break;
      c = std::move(cmds_.front());
      cmds_.pop_front();
    }
    HandleCommand(c);
    ++handled;
    std::lock_guard lock(cmd_mu_);
    ++cmds_done_;  // commands run in order: Enqueue's ticket k is done once k have run
  }
  if (handled > 0) cmd_cv_.notify_all();
  return handled;
}

void EventPlane::Impl::Deliver(WorkerId id, events::DecodedBatch batch) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  it->second->sub->OnBatch(std::move(batch));
  touched_.insert(id);
}

void EventPlane::Impl::ReceiveSub() {
  for (int n = 0; n < tuning::kMaxSubMessagesPerTurn; ++n) {
    std::vector<zmq::message_t> parts;
    auto got = zmq::recv_multipart(sub_, std::back_inserter(parts), zmq::recv_flags::dontwait);
    if (!got) return;
    if (parts.size() != 2) {
      Malformed("frames", std::to_string(parts.size()) + " frames");
      continue;
    }
    auto topic = by_topic_.find(parts[0].to_string());
    if (topic == by_topic_.end()) {
      Malformed("topic", "unknown topic " + parts[0].to_string().substr(0, 64));
      continue;
    }
    auto batch = events::DecodeBatch(parts[1].data(), parts[1].size());
    if (!batch.ok()) {
      Malformed("decode", batch.status().ToString());
      continue;
    }
    turn_.oldest_batch_ns = std::max(turn_.oldest_batch_ns, clock_->WallNs() - batch->header.created_ns);
    ++turn_.batches;
    const Entry& e = *workers_.at(topic->second);
    if (batch->header.worker_id != e.name) {
      Malformed("topic", "batch of " + batch->header.worker_id.substr(0, 64) + " under topic kv." + e.name);
      continue;
    }
    if (options_.fault_injector) {
      deliveries_.clear();
      options_.fault_injector->Process(e.id, std::move(*batch), clock_->Now(), &deliveries_);
      for (auto& [id, b] : deliveries_) Deliver(id, std::move(b));
    } else {
      Deliver(e.id, std::move(*batch));
    }
  }
}

bool EventPlane::Impl::ReceiveReplies(Entry& e, TimeNs until) {
  for (bool first = true; first || clock_->Now() < until; first = false) {
    zmq::message_t m;
    if (!e.dealer.recv(m, zmq::recv_flags::dontwait)) {
      e.reply_waiting = false;
      return true;
    }
    auto reply = events::DecodeReplayReply(m.data(), m.size());
    if (!reply.ok()) {
      Malformed("replay", reply.status().ToString());
      continue;
    }
    e.sub->OnReplayReply(*reply);
    touched_.insert(e.id);
  }
  e.reply_waiting = true;  // stopped at `until`: more is waiting
  return false;
}

void EventPlane::Impl::RefreshView(const Entry& e) {
  View v;
  v.state = e.sub->state();
  v.stats = e.sub->stats();
  v.stats.state = v.state;
  v.stats.epoch = e.sub->epoch();
  v.stats.applied_seq = e.sub->applied_seq();
  v.stats.last_event_id = e.sub->last_event_id();
  v.stats.buffered_batches = e.sub->buffered();
  v.stats.index_blocks = {index_.BlockCount(e.id, kv::Tier::kDevice), index_.BlockCount(e.id, kv::Tier::kHost)};
  std::lock_guard lock(view_mu_);
  SetState(e.id, v.state);
  loads_[e.id] = e.sub->load();
  if (e.sub->TakePullFitsChanged()) pull_fits_[e.id] = e.sub->pull_fits();
  if (e.sub->last_pull_failure() > last_pull_failure_.load(std::memory_order_relaxed)) {
    last_pull_failure_.store(e.sub->last_pull_failure(), std::memory_order_relaxed);
  }
  views_[e.id] = std::move(v);
}

void EventPlane::Impl::ExportCounters() {
  auto push = [](prometheus::Counter* c, uint64_t now, uint64_t& seen) {
    if (now > seen) c->Increment(static_cast<double>(now - seen));
    seen = now;
  };
  push(m_stored_, counters_.applied_stored, exported_.applied_stored);
  push(m_removed_, counters_.applied_removed, exported_.applied_removed);
  push(m_updated_, counters_.applied_updated, exported_.applied_updated);
  push(m_cleared_, counters_.applied_cleared, exported_.applied_cleared);
  push(m_gaps_, counters_.gaps, exported_.gaps);
  push(m_replays_, counters_.replays, exported_.replays);
  push(m_snapshots_, counters_.snapshots, exported_.snapshots);
  push(m_epochs_, counters_.epoch_changes, exported_.epoch_changes);
  push(m_unknown_parent_, counters_.unknown_parent, exported_.unknown_parent);
  push(m_event_id_mismatches_, counters_.event_id_mismatches, exported_.event_id_mismatches);
  if (counters_.seq_too_far > exported_.seq_too_far) {
    f_malformed_->Add({{"reason", "seq_too_far"}}).Increment(static_cast<double>(counters_.seq_too_far - exported_.seq_too_far));
    exported_.seq_too_far = counters_.seq_too_far;
  }
  if (counters_.bad_replies > exported_.bad_replies) {
    f_malformed_->Add({{"reason", "replay"}}).Increment(static_cast<double>(counters_.bad_replies - exported_.bad_replies));
    exported_.bad_replies = counters_.bad_replies;
  }
}

void EventPlane::Impl::Periodic(TimeNs now, bool force) {
  // Batches still queued after a long turn (a big snapshot applied) are read before any
  // worker is called silent: its heartbeat may be among them.
  bool waiting = false;
  if (sub_) {
    zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(0));
    waiting = (item.revents & ZMQ_POLLIN) != 0;
  }
  if (force || now - last_tick_ >= tuning::kTickInterval) {
    last_tick_ = now;
    for (auto& [id, e] : workers_) {
      const WorkerState before = e->sub->state();
      e->sub->OnTick(waiting, e->reply_waiting);
      if (e->sub->state() != before) touched_.insert(id);
    }
  }
  if (now - last_idle_drain_ >= tuning::kIdleDrainInterval) {
    last_idle_drain_ = now;
    for (auto& [id, e] : workers_) {
      if (e->sub->awaiting_reply()) continue;
      // Answers to no outstanding request (it timed out, or the worker went DEAD): dropped
      // unread, as the subscriber would drop them.
      zmq::message_t m;
      while (e->dealer.recv(m, zmq::recv_flags::dontwait)) {}
      e->reply_waiting = false;
    }
  }
  if (options_.fault_injector) {
    deliveries_.clear();
    options_.fault_injector->Release(now, false, &deliveries_);
    for (auto& [id, b] : deliveries_) Deliver(id, std::move(b));
  }
  ExportCounters();
  RetryAdds(now);
  if (sub_monitor_) sub_monitor_->Drain([&](uint16_t, std::string_view address) {
    m_disconnects_->Increment();
    log_->info("event stream from {} dropped", address);
  });
  if (now - last_sweep_ >= tuning::kSweepInterval) {
    index_.SweepExpired();
    last_sweep_ = now;
  }
  if (force || now - last_gauges_ >= tuning::kGaugeInterval) {
    last_gauges_ = now;
    for (auto& [id, e] : workers_) {
      for (int t = 0; t < kv::kNumTiers; ++t)
        e->blocks_gauge[t]->Set(static_cast<double>(index_.BlockCount(id, static_cast<kv::Tier>(t))));
      for (int s = 0; s < kEventStreamStates; ++s) e->state_gauge[s]->Set(static_cast<int>(e->sub->state()) == s ? 1 : 0);
      RefreshView(*e);
    }
    touched_.clear();
  }
  for (WorkerId id : touched_)
    if (auto it = workers_.find(id); it != workers_.end()) RefreshView(*it->second);
  touched_.clear();
}

void EventPlane::Impl::Run() {
  // Index freshness can wait a few microseconds; an HTTP thread writing a first token cannot.
  LowerThisThreadPriority();
  std::vector<zmq::pollitem_t> items;
  std::vector<Entry*> item_entries;
  while (!stop_.load(std::memory_order_relaxed)) {
    items.clear();
    item_entries.clear();
    items.push_back({sub_.handle(), sub_ ? 0 : -1, static_cast<short>(sub_ ? ZMQ_POLLIN : 0), 0});
    for (auto& [id, e] : workers_) {
      if (!e->sub->awaiting_reply()) continue;
      items.push_back({e->dealer.handle(), 0, ZMQ_POLLIN, 0});
      item_entries.push_back(e.get());
    }
    zmq::poll(items.data(), items.size(), tuning::kPollInterval);
    turn_ = Turn{};
    const TimeNs t0 = clock_->Now();
    if (items[0].revents & ZMQ_POLLIN) ReceiveSub();
    const TimeNs t1 = clock_->Now();
    // One worker's replies at a time, in worker order from where the last turn stopped: a
    // snapshot is read through (over several turns if need be) before the next is begun, so
    // a syncing fleet goes live worker by worker.
    const size_t awaiting = item_entries.size();
    for (size_t i = 0; i < awaiting; ++i)
      if (items[i + 1].revents & ZMQ_POLLIN) item_entries[i]->reply_waiting = true;
    std::sort(item_entries.begin(), item_entries.end(), [](const Entry* a, const Entry* b) { return a->id < b->id; });
    const TimeNs replies_until = t1 + tuning::kReplyBudget;
    auto next = std::find_if(item_entries.begin(), item_entries.end(),
                             [&](const Entry* e) { return e->id >= reply_cursor_; });
    for (size_t k = 0; k < awaiting && clock_->Now() < replies_until; ++k, ++next) {
      if (next == item_entries.end()) next = item_entries.begin();
      Entry& e = **next;
      if (!e.reply_waiting) continue;
      const bool drained = ReceiveReplies(e, replies_until);
      reply_cursor_ = drained ? e.id + 1 : e.id;
    }
    const TimeNs t2 = clock_->Now();

    const size_t handled = HandleCommands(clock_->Now() + tuning::kCommandBudget);
    const TimeNs t3 = clock_->Now();
    Periodic(t3, handled > 0);
    const TimeNs t4 = clock_->Now();
    if (uint64_t suppressed = 0; t4 - t0 > tuning::kSlowTurn && slow_turn_log_.Allow(&suppressed)) {
      log_->warn("event thread: a {} ms turn (events {} ms: {} batches, the oldest {} ms old on receipt; "
                 "replies {} ms; {} commands {} ms; periodic {} ms; {} workers) ({} more suppressed)",
                 (t4 - t0) / kNsPerMs, (t1 - t0) / kNsPerMs, turn_.batches, turn_.oldest_batch_ns / kNsPerMs,
                 (t2 - t1) / kNsPerMs, handled, (t3 - t2) / kNsPerMs, (t4 - t3) / kNsPerMs, workers_.size(),
                 suppressed);
    }
  }
  std::lock_guard lock(cmd_mu_);
  cmds_done_ = cmds_queued_;
  cmd_cv_.notify_all();
}
}  // namespace kvfleet::router
