// Event codec: Contract 2's messages <-> C++ values. EventBatch (kv::KvEvent + LoadReport),
// ReplayRequest and ReplayReply (replayed batches, snapshot chunks, errors).
//
// The one encoder and decoder of every Contract 2 message, used by both sides: the worker's
// publisher encodes batches and replay answers and decodes requests; the router's event
// plane and `kvfleet events` encode requests and decode batches and answers. Decoding never
// trusts its input: every structural or semantic problem is a DataLoss / InvalidArgument
// Status, never a crash.
//
// Thread safety: free functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "schema/load_report.h"
#include "schema/kv_event.h"

namespace kvfleet::events {

namespace config {
// A worker id is a short name; 256 bytes bounds what a malformed batch can make us keep.
constexpr size_t kMaxWorkerIdBytes = 256;
// Tokens per stored block on the wire; block sizes are far smaller.
constexpr size_t kMaxTokensPerBlock = 1 << 16;
// Holders one load may carry pull totals for: a worker reports only those it pulled from since
// its previous batch, and a fleet has at most this many workers (wire::limits::kMaxGossipWorkers).
constexpr size_t kMaxPullSources = 1024;
}  // namespace config

// The worker's load, as schema Load.
using LoadReport = kvfleet::LoadReport;
static_assert(kv::kNumTiers == kLoadTiers, "schema Load is kept per kv::Tier");

struct BatchHeader {
  std::string worker_id;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  int64_t created_ns = 0;  // worker wall clock
};

// A decoded EventBatch.
struct DecodedBatch {
  BatchHeader header;
  std::vector<kv::KvEvent> events;
  LoadReport load;
  size_t block_events = 0;  // stored blocks + removed hashes + updates: the unit of "events"
};

// The bytes of one EventBatch frame.
std::string EncodeBatch(const BatchHeader& header, std::span<const kv::KvEvent> events, const LoadReport& load);

// Decodes and validates one EventBatch frame: epoch and seq non-zero, a short non-empty
// worker id, known event kinds, tiers and priorities in range, event ids all 0 (a worker
// older than eventId) or consecutive.
Result<DecodedBatch> DecodeBatch(const void* data, size_t size);

// A router's request to a worker's replay ROUTER.
struct ReplayRequest {
  uint64_t epoch = 0;       // the epoch the router knows; 0 = none (the answer is a snapshot)
  uint64_t from_seq = 0;    // the first seq the router is missing
  uint64_t request_id = 0;  // echoed in every message of the answer
};

std::string EncodeReplayRequest(const ReplayRequest& request);
Result<ReplayRequest> DecodeReplayRequest(const void* data, size_t size);

// What every message of an answer to a ReplayRequest carries.
struct ReplyHeader {
  std::string worker_id;
  uint64_t epoch = 0;       // the worker's current epoch
  uint64_t request_id = 0;  // the ReplayRequest's; 0 when it could not be read
  bool last = true;         // the answer's final message
};

// One message of a snapshot: a part of every block the worker holds.
struct SnapshotChunk {
  uint64_t consistent_seq = 0;       // reflects every batch with seq <= this, and none after
  uint64_t consistent_event_id = 0;  // every event with eventId <= this; 0 = none yet, or an older worker
  std::vector<kv::KvEvent> events;   // `stored` chains, parents before children; ids 0
};

struct ReplayError {
  std::string message;
};

// One decoded ReplayReply message.
struct ReplayReply {
  ReplyHeader header;
  std::variant<std::vector<DecodedBatch>, SnapshotChunk, ReplayError> body;
};

// The worker's answer messages. `frames` are EncodeBatch's frames (the publisher's replay
// ring), embedded as they were published. REQUIRES: each frame is EncodeBatch's.
std::string EncodeReplayBatches(const ReplyHeader& header, std::span<const std::string_view> frames);
std::string EncodeSnapshotChunk(const ReplyHeader& header, uint64_t consistent_seq, uint64_t consistent_event_id,
                                std::span<const kv::KvEvent> events);
std::string EncodeReplayError(const ReplyHeader& header, std::string_view message);

// Decodes and validates one ReplayReply message: a non-zero epoch and a short non-empty
// worker id; each batch as DecodeBatch checks it; snapshot events as a batch's events are
// checked (kinds, tiers, priorities; their ids are not: a snapshot's are 0).
Result<ReplayReply> DecodeReplayReply(const void* data, size_t size);

// The eventId of a batch's first event, and of its last; 0 when it has none or its worker
// predates eventId. A decoded batch's ids are consecutive (DecodeBatch checks).
inline uint64_t FirstEventId(const DecodedBatch& b) { return b.events.empty() ? 0 : b.events.front().id; }
inline uint64_t LastEventId(const DecodedBatch& b) { return b.events.empty() ? 0 : b.events.back().id; }

// Counts the block-level events in a list (a stored block, a removed hash, an update).
size_t BlockEventCount(std::span<const kv::KvEvent> events);

}  // namespace kvfleet::events
