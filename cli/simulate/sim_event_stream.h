// SimEventStream: one simulated worker's side of Contract 2 without the sockets: it seals
// KV events into EventBatch frames {epoch, seq, event ids}, keeps the last frames in a ring,
// and answers a router's ReplayRequest the way worker/server/event_publisher.h does (the
// ring's batches when they are all there, else a snapshot stamped with the last seq).
//
// Rules it keeps (schema/README.md, Contract 2):
//   1. epoch is non-zero and fixed; seq starts at 1 and rises by 1 per batch, heartbeats
//      included; nothing is ever skipped (the simulator drops no events).
//   2. Each event gets the next event id as it is sealed, from 1.
//   3. A snapshot is taken between batches, so it reflects every batch up to last_seq() and
//      none after: consistentSeq = last_seq(), consistentEventId = last_event_id().
//
// Thread safety: thread-compatible; owned by the simulator shard that owns its worker.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/clock.h"
#include "schema/event_codec.h"

namespace kvfleet::sim {

class SimKvCache;

namespace config {
// Stored blocks per snapshot message, as the real publisher cuts them.
constexpr size_t kSnapshotBlocksPerMessage = 64 * 1024;
// Batches per replay message, as the real publisher sends them.
constexpr size_t kReplayBatchesPerMessage = 256;
}  // namespace config

class SimEventStream {
 public:
  // REQUIRES: epoch != 0, ring_batches > 0.
  SimEventStream(std::string worker_id, uint64_t epoch, size_t ring_batches);

  // Seals `events` (none: a heartbeat) as the next batch and returns its frame, kept in the
  // ring for replays until it falls out.
  const std::string& Seal(std::vector<kv::KvEvent> events, const LoadReport& load, TimeNs wall_ns);

  // The messages answering one ReplayRequest frame, in order: the ring's batches, a
  // snapshot of `cache` (in chunks), or an error for a frame that does not decode.
  // `snapshot` is set when the answer is a snapshot.
  std::vector<std::string> Answer(const void* data, size_t size, const SimKvCache& cache, bool* snapshot) const;

  const std::string& topic() const { return topic_; }
  uint64_t epoch() const { return epoch_; }
  uint64_t last_seq() const { return seq_; }
  uint64_t last_event_id() const { return event_id_; }

 private:
  struct RingEntry {
    uint64_t seq = 0;
    std::string frame;  // as published: a replay embeds it unchanged
  };
  events::ReplyHeader Header(uint64_t request_id, bool last) const;
  std::vector<std::string> Replay(uint64_t request_id, uint64_t from) const;
  std::vector<std::string> Snapshot(uint64_t request_id, const SimKvCache& cache) const;

  const std::string worker_id_;
  const std::string topic_;
  const uint64_t epoch_;
  const size_t ring_batches_;
  uint64_t seq_ = 0;
  uint64_t event_id_ = 0;
  std::deque<RingEntry> ring_;
};

}  // namespace kvfleet::sim
