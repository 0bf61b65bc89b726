#include "worker/server/event_publisher.h"

#include <algorithm>
#include <random>
#include <variant>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/curve_keys.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "common/zmq_threads.h"
#include "schema/limits.h"

namespace kvfleet::events {

namespace {

struct SealedBatch {
  uint64_t seq = 0;
  int64_t created_ns = 0;
  std::vector<kv::KvEvent> events;
  LoadReport load;
};

struct Requester {
  std::string identity;
  uint64_t request_id = 0;
};

struct SnapshotJob {
  uint64_t seq = 0;
  uint64_t event_id = 0;  // consistentEventId: the last event id given out
  std::vector<kv::KvEvent> events;
  std::vector<Requester> requesters;
};

using Item = std::variant<SealedBatch, SnapshotJob>;

struct RingEntry {
  uint64_t seq;
  std::string frame;  // as published: a replay embeds it unchanged
};

uint64_t RandomEpoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return e;
}

std::string LastEndpoint(zmq::socket_t& s) { return s.get(zmq::sockopt::last_endpoint); }

}  // namespace

class EventPublisher::Impl {
 public:
  Impl(EventPublisher* owner) : owner_(owner), ctx_(1) {}

  EventPublisher* owner_;
  zmq::context_t ctx_;
  std::unique_ptr<ZapAuthenticator> zap_;
  zmq::socket_t pub_, replay_, wake_pull_;
  zmq::socket_t wake_push_;  // engine thread; made on first use
  std::string wake_endpoint_;
  std::string topic_;
  std::shared_ptr<spdlog::logger> log_ = Logger("events");
  RateLimit bad_request_log_;

  // Guarded by mu_.
  std::mutex mu_;
  std::deque<Item> queue_;
  uint64_t next_seq_ = 1;
  uint64_t next_event_id_ = 1;  // rule 6
  uint64_t last_hole_ = 0;  // the highest seq that was skipped (never published)
  LoadReport last_load_;
  std::vector<Requester> snapshot_requests_;

  // Publisher thread only.
  std::deque<RingEntry> ring_;
  TimeNs last_publish_ = 0;

  std::atomic<bool> stop_{false};
  std::thread thread_;

  prometheus::Counter* m_published_ = nullptr;
  prometheus::Counter* m_dropped_ = nullptr;
  prometheus::Counter* m_replays_ = nullptr;

  void Wake() {
    if (!wake_push_) {
      wake_push_ = zmq::socket_t(ctx_, zmq::socket_type::push);
      wake_push_.set(zmq::sockopt::sndhwm, 1);
      wake_push_.connect(wake_endpoint_);
    }
    // A full pipe means a wake-up is already pending.
    (void)wake_push_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);
  }

  void CountDropped(uint64_t n) {
    owner_->dropped_.fetch_add(n, std::memory_order_relaxed);
    if (m_dropped_) m_dropped_->Increment(static_cast<double>(n));
  }

  // Every reply message's header, for the request `request_id`.
  ReplyHeader Header(uint64_t request_id, bool last) const {
    return ReplyHeader{owner_->options_.worker_id, owner_->epoch_, request_id, last};
  }

  void Run();
  void Publish(SealedBatch& batch);
  void HandleReplayRequests();
  void HandleReplayRequest(const std::string& identity, const zmq::message_t& request);
  // Sends the ring's batches from `from` on. REQUIRES: `from` is in the ring.
  void SendReplay(const std::string& identity, uint64_t request_id, uint64_t from);
  void SendSnapshot(const SnapshotJob& job);
  void SendReply(const std::string& identity, const std::string& message);
};

EventPublisher::EventPublisher(const EventPublisherOptions& options, Clock* clock)
    : options_(options), clock_(clock), impl_(std::make_unique<Impl>(this)) {}

Result<std::unique_ptr<EventPublisher>> EventPublisher::Make(const EventPublisherOptions& options, Clock* clock,
                                                             prometheus::Registry* metrics) {
  if (options.worker_id.empty() || options.worker_id.size() > config::kMaxWorkerIdBytes)
    return InvalidArgument("event publisher: worker_id must be 1..256 bytes");
  if (options.heartbeat_interval <= 0 || options.heartbeat_interval > 250 * kNsPerMs)
    return InvalidArgument("event publisher: heartbeat_interval must be in (0, 250 ms] (Contract 2)");
  if (options.ring_batches == 0 || options.max_queued_batches == 0 || options.snapshot_blocks_per_message == 0)
    return InvalidArgument("event publisher: ring_batches, max_queued_batches and snapshot_blocks_per_message must be > 0");
  std::unique_ptr<EventPublisher> p(new EventPublisher(options, clock));
  Impl& impl = *p->impl_;
  p->epoch_ = options.epoch ? options.epoch : RandomEpoch();
  impl.topic_ = "kv." + options.worker_id;
  // The publisher thread runs at the background priority; so do the threads that send for it.
  StartZmqThreadsAtLowerPriority(impl.ctx_);
  try {
    impl.pub_ = zmq::socket_t(impl.ctx_, zmq::socket_type::pub);
    impl.replay_ = zmq::socket_t(impl.ctx_, zmq::socket_type::router);
    impl.pub_.set(zmq::sockopt::sndhwm, options.pub_sndhwm);
    impl.pub_.set(zmq::sockopt::linger, 0);
    impl.replay_.set(zmq::sockopt::sndhwm, options.replay_sndhwm);
    impl.replay_.set(zmq::sockopt::linger, 0);
    impl.pub_.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxSubscriptionBytes);
    impl.replay_.set(zmq::sockopt::maxmsgsize, wire::limits::kMaxReplayRequestBytes);
    if (!options.curve.server_keypair_file.empty()) {
      KVF_ASSIGN_OR_RETURN(auto keys, LoadCurveKeyPair(options.curve.server_keypair_file));
      if (!options.curve.authorized_keys_file.empty()) {
        KVF_ASSIGN_OR_RETURN(auto authorized, LoadAuthorizedKeys(options.curve.authorized_keys_file));
        impl.zap_ = std::make_unique<ZapAuthenticator>(&impl.ctx_, std::move(authorized));
        KVF_RETURN_IF_ERROR(impl.zap_->status());
      }
      KVF_RETURN_IF_ERROR(MakeCurveServer(impl.pub_, keys));
      KVF_RETURN_IF_ERROR(MakeCurveServer(impl.replay_, keys));
    }
    impl.pub_.bind(options.events_endpoint);
    impl.replay_.bind(options.replay_endpoint);
    p->bound_events_ = LastEndpoint(impl.pub_);
    p->bound_replay_ = LastEndpoint(impl.replay_);
    static std::atomic<uint64_t> next_id{0};
    impl.wake_endpoint_ = "inproc://kvfleet-publisher-wake-" + std::to_string(next_id++);
    impl.wake_pull_ = zmq::socket_t(impl.ctx_, zmq::socket_type::pull);
    impl.wake_pull_.bind(impl.wake_endpoint_);
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("event publisher: ") + e.what());
  }
  if (metrics) {
    impl.m_published_ = &prometheus::BuildCounter()
                             .Name("kvfleet_worker_events_published_total")
                             .Help("KV event batches published (heartbeats included)")
                             .Register(*metrics)
                             .Add({});
    impl.m_dropped_ = &prometheus::BuildCounter()
                           .Name("kvfleet_worker_events_dropped_total")
                           .Help("KV block events lost before publication (KV buffer or publisher queue full)")
                           .Register(*metrics)
                           .Add({});
    impl.m_replays_ = &prometheus::BuildCounter()
                           .Name("kvfleet_worker_events_replay_requests_total")
                           .Help("Replay requests received from routers")
                           .Register(*metrics)
                           .Add({});
  }
  impl.last_publish_ = clock->Now();
  impl.thread_ = std::thread([&impl] { impl.Run(); });
  impl.log_->info("publishing KV events of {} on {} (replay {}), epoch {:016x}", options.worker_id,
                  p->bound_events_, p->bound_replay_, p->epoch_);
  return p;
}

EventPublisher::~EventPublisher() {
  impl_->stop_.store(true);
  if (impl_->thread_.joinable()) impl_->thread_.join();
}

uint64_t EventPublisher::last_seq() const {
  std::lock_guard lock(impl_->mu_);
  return impl_->next_seq_ - 1;
}

void EventPublisher::NoteKvDropsLocked(uint64_t kv_events_dropped) {
  if (kv_events_dropped <= kv_dropped_seen_) return;
  impl_->CountDropped(kv_events_dropped - kv_dropped_seen_);
  // Rule 6: the lost events were the oldest, made before those still to be sealed.
  impl_->next_event_id_ += kv_events_dropped - kv_dropped_seen_;
  kv_dropped_seen_ = kv_events_dropped;
  impl_->last_hole_ = impl_->next_seq_++;  // rule 3
}

void EventPublisher::SealLocked(std::vector<kv::KvEvent>&& events, TimeNs wall_now) {
  Impl& impl = *impl_;
  if (events.empty()) return;
  const uint64_t seq = impl.next_seq_++;
  for (kv::KvEvent& e : events) e.id = impl.next_event_id_++;  // rule 6, lost or not
  if (impl.queue_.size() >= options_.max_queued_batches) {
    // Rule 3: the loss becomes a hole that routers see as a gap.
    impl.last_hole_ = seq;
    impl.CountDropped(BlockEventCount(events));
    return;
  }
  SealedBatch b;
  b.seq = seq;
  b.created_ns = wall_now;
  b.events = std::move(events);
  b.load = impl.last_load_;
  impl.queue_.emplace_back(std::move(b));
}

void EventPublisher::Publish(std::vector<kv::KvEvent> events, const LoadReport& load, uint64_t kv_events_dropped) {
  const TimeNs wall = clock_->WallNs();
  const bool sealing = !events.empty();
  {
    std::lock_guard lock(impl_->mu_);
    NoteKvDropsLocked(kv_events_dropped);
    impl_->last_load_ = load;
    SealLocked(std::move(events), wall);
  }
  if (sealing) impl_->Wake();
}

void EventPublisher::PublishSnapshot(std::vector<kv::KvEvent> events, uint64_t kv_events_dropped,
                                     std::vector<kv::KvEvent> snapshot) {
  const TimeNs wall = clock_->WallNs();
  SnapshotJob job;
  job.events = std::move(snapshot);
  {
    std::lock_guard lock(impl_->mu_);
    NoteKvDropsLocked(kv_events_dropped);
    SealLocked(std::move(events), wall);  // rule 4: the snapshot is consistent with the batch just sealed
    job.seq = impl_->next_seq_ - 1;
    job.event_id = impl_->next_event_id_ - 1;
    job.requesters.swap(impl_->snapshot_requests_);
    snapshot_wanted_.store(false, std::memory_order_release);
    impl_->queue_.emplace_back(std::move(job));  // never dropped: routers wait for it
  }
  impl_->Wake();
}

void EventPublisher::Impl::Run() {
  // Events may leave a little later; the request socket's thread sending a first token must not.
  LowerThisThreadPriority();
  const EventPublisherOptions& options = owner_->options_;
  Clock* clock = owner_->clock_;
  zmq::pollitem_t items[] = {{wake_pull_.handle(), 0, ZMQ_POLLIN, 0}, {replay_.handle(), 0, ZMQ_POLLIN, 0}};
  // Poll at least this often so the destructor's stop flag is seen promptly.
  constexpr DurationNs kMaxPoll = 20 * kNsPerMs;
  std::deque<Item> work;
  while (!stop_.load(std::memory_order_relaxed)) {
    const TimeNs now = clock->Now();
    const DurationNs until_heartbeat = std::max<DurationNs>(0, last_publish_ + options.heartbeat_interval - now);
    const auto timeout = std::chrono::milliseconds(std::min(until_heartbeat, kMaxPoll) / kNsPerMs);
    zmq::poll(items, 2, timeout);
    if (items[0].revents & ZMQ_POLLIN) {
      zmq::message_t m;
      while (wake_pull_.recv(m, zmq::recv_flags::dontwait)) {
      }
    }
    if (items[1].revents & ZMQ_POLLIN) HandleReplayRequests();
    {
      std::lock_guard lock(mu_);
      work.swap(queue_);
      if (work.empty() && clock->Now() - last_publish_ >= options.heartbeat_interval) {
        SealedBatch hb;  // rule 5
        hb.seq = next_seq_++;
        hb.created_ns = clock->WallNs();
        hb.load = last_load_;
        work.emplace_back(std::move(hb));
      }
    }
    for (Item& item : work) {
      if (auto* b = std::get_if<SealedBatch>(&item)) {
        Publish(*b);
      } else {
        SendSnapshot(std::get<SnapshotJob>(item));
      }
    }
    work.clear();
  }
}

void EventPublisher::Impl::Publish(SealedBatch& batch) {
  const EventPublisherOptions& options = owner_->options_;
  std::string frame =
      EncodeBatch({options.worker_id, owner_->epoch_, batch.seq, batch.created_ns}, batch.events, batch.load);
  // PUB never blocks: past the high-water mark ZMQ drops, and the router replays.
  (void)pub_.send(zmq::buffer(topic_), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)pub_.send(zmq::buffer(frame), zmq::send_flags::dontwait);
  ring_.push_back(RingEntry{batch.seq, std::move(frame)});
  while (ring_.size() > options.ring_batches) ring_.pop_front();
  last_publish_ = owner_->clock_->Now();
  owner_->published_.fetch_add(1, std::memory_order_relaxed);
  if (m_published_) m_published_->Increment();
}

void EventPublisher::Impl::SendReply(const std::string& identity, const std::string& message) {
  // One copy, into ZMQ's message (snapshot chunks are megabytes). Handing ZMQ the string
  // itself would have it freed on ZMQ's I/O thread, which TSan cannot follow.
  zmq::message_t payload(message.data(), message.size());
  (void)replay_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)replay_.send(payload, zmq::send_flags::dontwait);
}

void EventPublisher::Impl::HandleReplayRequests() {
  while (true) {
    std::vector<zmq::message_t> parts;
    auto got = zmq::recv_multipart(replay_, std::back_inserter(parts), zmq::recv_flags::dontwait);
    if (!got) return;
    owner_->replay_requests_.fetch_add(1, std::memory_order_relaxed);
    if (m_replays_) m_replays_->Increment();
    if (parts.size() != 2) continue;  // [identity, request]; anything else is not ours
    HandleReplayRequest(parts[0].to_string(), parts[1]);
  }
}

void EventPublisher::Impl::HandleReplayRequest(const std::string& identity, const zmq::message_t& request) {
  auto req = DecodeReplayRequest(request.data(), request.size());
  if (!req.ok()) {
    uint64_t suppressed = 0;
    if (bad_request_log_.Allow(&suppressed))
      log_->warn("malformed replay request: {} ({} more suppressed)", req.status().ToString(), suppressed);
    SendReply(identity, EncodeReplayError(Header(0, true), req.status().ToString()));
    return;
  }
  const uint64_t from = req->from_seq;
  uint64_t last_hole = 0;
  {
    std::lock_guard lock(mu_);
    last_hole = last_hole_;
  }
  const uint64_t ring_last = ring_.empty() ? 0 : ring_.back().seq;
  const bool same_epoch = req->epoch == owner_->epoch_ && from >= 1;
  if (same_epoch && from == ring_last + 1 && from > last_hole) {
    SendReply(identity, EncodeReplayBatches(Header(req->request_id, true), {}));  // nothing missing
    return;
  }
  const bool in_ring =
      same_epoch && !ring_.empty() && from >= ring_.front().seq && from <= ring_last && from > last_hole;
  if (in_ring) {
    SendReplay(identity, req->request_id, from);
    return;
  }
  std::lock_guard lock(mu_);
  // A router that asks again before its snapshot went out gets one snapshot, under the
  // newest request id: the retries of a slow snapshot must not pile up.
  auto same = std::find_if(snapshot_requests_.begin(), snapshot_requests_.end(),
                           [&](const Requester& r) { return r.identity == identity; });
  if (same != snapshot_requests_.end()) {
    same->request_id = req->request_id;
  } else {
    snapshot_requests_.push_back(Requester{identity, req->request_id});
  }
  owner_->snapshot_wanted_.store(true, std::memory_order_release);
}

void EventPublisher::Impl::SendReplay(const std::string& identity, uint64_t request_id, uint64_t from) {
  auto it = std::lower_bound(ring_.begin(), ring_.end(), from,
                             [](const RingEntry& e, uint64_t s) { return e.seq < s; });
  std::vector<std::string_view> frames;
  while (it != ring_.end()) {
    const size_t n = std::min<size_t>(config::kReplayBatchesPerMessage, ring_.end() - it);
    frames.clear();
    for (size_t i = 0; i < n; ++i, ++it) frames.push_back(it->frame);
    SendReply(identity, EncodeReplayBatches(Header(request_id, it == ring_.end()), frames));
  }
}

void EventPublisher::Impl::SendSnapshot(const SnapshotJob& job) {
  const EventPublisherOptions& options = owner_->options_;
  // Cut the events into messages of about snapshot_blocks_per_message blocks.
  std::vector<std::pair<size_t, size_t>> chunks;  // [begin, end) event ranges
  size_t begin = 0, blocks = 0;
  for (size_t i = 0; i < job.events.size(); ++i) {
    blocks += BlockEventCount(std::span(&job.events[i], 1));
    if (blocks >= options.snapshot_blocks_per_message) {
      chunks.emplace_back(begin, i + 1);
      begin = i + 1;
      blocks = 0;
    }
  }
  if (begin < job.events.size() || chunks.empty()) chunks.emplace_back(begin, job.events.size());
  // Usually one router asks at a time; each gets the chunks stamped with its request id.
  for (const Requester& r : job.requesters) {
    for (size_t c = 0; c < chunks.size(); ++c) {
      const bool last = c + 1 == chunks.size();
      auto [b, e] = chunks[c];
      const std::string message = EncodeSnapshotChunk(Header(r.request_id, last), job.seq, job.event_id,
                                                      std::span(job.events).subspan(b, e - b));
      // Counted before the last chunk goes out, so whoever has received it sees the count.
      if (last) owner_->snapshots_sent_.fetch_add(1, std::memory_order_relaxed);
      SendReply(r.identity, message);
    }
  }
}

}  // namespace kvfleet::events
