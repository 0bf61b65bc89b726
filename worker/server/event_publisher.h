// EventPublisher: the worker's side of Contract 2. It seals the KV events of each engine
// step into one EventBatch {epoch, seq} and publishes it on a ZMQ PUB socket (topic
// `kv.<worker_id>`) from its own thread. It answers routers' replay requests on a ROUTER
// socket from a ring of recent batches, or with a snapshot of the KV manager stamped with
// the seq it is consistent with.
//
// The worker loop (worker_loop.h) feeds it on the engine thread; events flow one way,
// moved from the KV manager into a sealed batch:
//
//   outputs = engine.Step();
//   publisher.Publish(kv.TakeEvents(), load, kv.events_dropped());  // this step's batch
//   ...
//   if (publisher.snapshot_wanted())                                 // between steps
//     publisher.PublishSnapshot(kv.TakeEvents(), kv.events_dropped(), kv.Snapshot());
//
// Neither call blocks on the network: batches go to the publisher thread through a
// bounded queue, and a full queue drops the batch (counted) instead of waiting.
//
// Sequence rules (schema/README.md has the full contract):
//   1. `epoch` is random and non-zero, fixed for the publisher's life.
//   2. Every batch (heartbeats included) takes the next seq; the first is 1.
//   3. Lost events never pass silently: when the KV manager's event list dropped events,
//      or the publisher's own queue was full, the publisher skips a seq. Routers see a gap,
//      ask for a replay, and since a skipped seq is never in the ring, get a snapshot.
//   4. A snapshot stamped `consistentSeq = S` reflects every batch <= S and none after.
//      PublishSnapshot seals the events given with it first, so S is the batch just sealed.
//   5. A heartbeat (no events, the last load) goes out when nothing was published for
//      heartbeat_interval.
//   6. Every event the KV manager made gets the next event id as it is sealed, from 1 within
//      the epoch, lost ones included (TensorRT-LLM's event_id): a batch's ids are consecutive,
//      and ids skip only where a seq is skipped too. A snapshot carries the last id given out
//      (consistentEventId), as it carries the last seq.
//
// Threads: the engine thread (Publish, PublishSnapshot) and the publisher thread
// (sockets, encoding, ring). Thread safety: the engine calls are engine-thread-only;
// everything else is internal.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "schema/kv_event.h"
#include "schema/event_codec.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::events {

namespace config {
// Contract 2 promises a heartbeat at least every 250 ms; 200 ms leaves room for a busy
// publisher thread.
constexpr DurationNs kDefaultHeartbeatInterval = 200 * kNsPerMs;
// Contract 2's default ring: 10,000 batches (about 40 minutes of idle heartbeats, or
// seconds of a busy engine).
constexpr size_t kDefaultRingBatches = 10'000;
// Stored blocks per snapshot message: 64 Ki blocks is ~1.5 MB, small enough not to
// monopolise the socket, large enough that 1 M blocks take 16 messages.
constexpr size_t kSnapshotBlocksPerMessage = 64 * 1024;
// Batches per replay message.
constexpr size_t kReplayBatchesPerMessage = 256;
}  // namespace config

struct EventPublisherCurve {
  std::string server_keypair_file;     // empty = plaintext
  std::string authorized_keys_file;    // empty = any client with the server key may connect
};

struct EventPublisherOptions {
  std::string worker_id;                              // REQUIRED: the topic is kv.<worker_id>
  std::string events_endpoint = "tcp://*:5557";       // PUB bind
  std::string replay_endpoint = "tcp://*:5558";       // replay ROUTER bind
  uint64_t epoch = 0;                                 // 0 = random (production); tests may fix it
  DurationNs heartbeat_interval = config::kDefaultHeartbeatInterval;
  size_t ring_batches = config::kDefaultRingBatches;  // batches kept for replay
  size_t max_queued_batches = 10'000;                 // engine -> publisher thread queue
  int pub_sndhwm = 100'000;                           // PUB send high-water mark (messages)
  int replay_sndhwm = 10'000;                         // replay ROUTER send high-water mark
  size_t snapshot_blocks_per_message = config::kSnapshotBlocksPerMessage;
  EventPublisherCurve curve;
};

class EventPublisher {
 public:
  // Binds both sockets and starts the publisher thread. REQUIRES: clock and metrics
  // (when non-null) outlive the publisher.
  static Result<std::unique_ptr<EventPublisher>> Make(const EventPublisherOptions& options, Clock* clock,
                                                      prometheus::Registry* metrics);
  ~EventPublisher();  // stops the thread; unsent batches are lost
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // Engine thread, once per step: seals `events` (if any) as the next batch with `load`,
  // and records `load` for heartbeats. `kv_events_dropped` is the KV manager's running
  // count of events it dropped (KvCacheManager::events_dropped()); a rise skips a seq
  // (rule 3).
  void Publish(std::vector<kv::KvEvent> events, const LoadReport& load, uint64_t kv_events_dropped);
  // Engine thread, between steps: whether a router asked for a snapshot. Cheap.
  bool snapshot_wanted() const { return snapshot_wanted_.load(std::memory_order_acquire); }
  // Engine thread: seals `events` as the next batch, then hands `snapshot` to the publisher
  // thread, stamped with that batch's seq, for every router that asked.
  // REQUIRES: `events` are all the KV manager's events not yet published, and `snapshot`
  // (KvCacheManager::Snapshot()) was taken with no cache change after them (rule 4).
  void PublishSnapshot(std::vector<kv::KvEvent> events, uint64_t kv_events_dropped,
                       std::vector<kv::KvEvent> snapshot);

  uint64_t epoch() const { return epoch_; }
  // The seq of the last batch sealed (0 before the first).
  uint64_t last_seq() const;
  // The endpoints actually bound (resolves port 0 / wildcard binds), for tests and Hello.
  const std::string& events_endpoint() const { return bound_events_; }
  const std::string& replay_endpoint() const { return bound_replay_; }

  // Counters (also exported as metrics).
  uint64_t batches_published() const { return published_.load(std::memory_order_relaxed); }
  uint64_t events_dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t replay_requests() const { return replay_requests_.load(std::memory_order_relaxed); }
  uint64_t snapshots_sent() const { return snapshots_sent_.load(std::memory_order_relaxed); }

 private:
  class Impl;
  EventPublisher(const EventPublisherOptions& options, Clock* clock);

  // Under mu_: a rise in the KV manager's dropped count becomes a skipped seq (rule 3).
  void NoteKvDropsLocked(uint64_t kv_events_dropped);
  // Under mu_: seals `events` (if any) as the next batch, or drops them (counted, a hole)
  // when the queue is full.
  void SealLocked(std::vector<kv::KvEvent>&& events, TimeNs wall_now);

  const EventPublisherOptions options_;
  Clock* const clock_;
  uint64_t epoch_ = 0;
  std::string bound_events_, bound_replay_;

  // Engine thread only.
  uint64_t kv_dropped_seen_ = 0;

  std::unique_ptr<Impl> impl_;
  std::atomic<bool> snapshot_wanted_{false};
  std::atomic<uint64_t> published_{0}, dropped_{0}, replay_requests_{0}, snapshots_sent_{0};
};

}  // namespace kvfleet::events
