// Feeds arbitrary bytes to everything a router does with a frame from the network: the
// EventBatch decoder (live batches), the ReplayReply decoder, and a subscriber state
// machine that applies whatever decodes. Nothing may crash, hang or leak.
#include <cstddef>
#include <cstdint>

#include "router/events/worker_subscriber.h"
#include "schema/event_codec.h"

namespace {

using namespace kvfleet;

struct NullIo : router::WorkerSubscriber::Io {
  uint64_t last_request = 0;
  void RequestReplay(router::WorkerId, uint64_t, uint64_t, uint64_t id) override { last_request = id; }
  void OnApplied(router::WorkerId, double) override {}
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ManualClock clock;
  static router::EventPlaneOptions options;
  // One index for the whole run (it is large to build); each input starts from it empty.
  static router::GlobalIndex index({}, &clock);
  static uint64_t runs = 0;
  NullIo io;
  router::EventCounters counters;
  router::WorkerSubscriber sub(1, "w", options, &index, &clock, &io, &counters);
  sub.Start();

  auto batch = events::DecodeBatch(data, size);
  if (batch.ok()) {
    auto copy = *batch;
    sub.OnBatch(std::move(*batch));
    copy.header.seq += 1;
    sub.OnBatch(std::move(copy));
  }
  auto reply = events::DecodeReplayReply(data, size);
  if (reply.ok()) {
    // Make it answer the outstanding request, so the subscriber really applies it.
    reply->header.request_id = io.last_request;
    sub.OnReplayReply(*reply);
  }
  auto request = events::DecodeReplayRequest(data, size);
  if (request.ok()) (void)request->from_seq;
  if (++runs % 64 == 0) index.CheckInvariants();
  sub.Drop();
  if (index.EntryCount() != 0) __builtin_trap();  // Drop must leave nothing of the worker behind
  return 0;
}
