// Event codec: kv::KvEvent and load reports <-> schema/events.capnp (Contract 2).
//
// Shared by the worker's publisher (encode) and the router's event plane (decode), so the
// two sides cannot disagree on the mapping. Decoding never trusts its input: every
// structural or semantic problem is a DataLoss / InvalidArgument Status, never a crash.
//
// Thread safety: free functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "schema/events.capnp.h"
#include "schema/load_report.h"
#include "schema/kv_event.h"

namespace kvfleet::events {

namespace config {
// A worker id is a short name; 256 bytes bounds what a malformed batch can make us keep.
constexpr size_t kMaxWorkerIdBytes = 256;
// Tokens per stored block on the wire; block sizes are far smaller.
constexpr size_t kMaxTokensPerBlock = 1 << 16;
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

void BuildKvEvent(const kv::KvEvent& event, schema::KvEvent::Builder out);
Status ParseKvEvent(schema::KvEvent::Reader in, kv::KvEvent* out);
void BuildLoad(const LoadReport& load, schema::Load::Builder out);
LoadReport ParseLoad(schema::Load::Reader in);

// The bytes of one EventBatch frame.
std::string EncodeBatch(const BatchHeader& header, std::span<const kv::KvEvent> events, const LoadReport& load);

// Decodes and validates one EventBatch frame: epoch and seq non-zero, a short non-empty
// worker id, known event kinds, tiers and priorities in range, event ids all 0 (a worker
// older than eventId) or consecutive.
Result<DecodedBatch> DecodeBatch(const void* data, size_t size);
// The same from an already-decoded reader (ReplayReply carries batches inline).
Result<DecodedBatch> ParseBatch(schema::EventBatch::Reader in);

// The eventId of a batch's first event, and of its last; 0 when it has none or its worker
// predates eventId. A decoded batch's ids are consecutive (DecodeBatch checks).
inline uint64_t FirstEventId(const DecodedBatch& b) { return b.events.empty() ? 0 : b.events.front().id; }
inline uint64_t LastEventId(const DecodedBatch& b) { return b.events.empty() ? 0 : b.events.back().id; }

// Counts the block-level events in a list (a stored block, a removed hash, an update).
size_t BlockEventCount(std::span<const kv::KvEvent> events);

}  // namespace kvfleet::events
