#include "worker/kv/event_buffer.h"

#include <doctest/doctest.h>

#include "tests/worker/kv/kv_test_util.h"

namespace kvfleet::kv {
namespace {

KvEvent Removed(BlockHash h) { return KvEvent{0, RemovedEvent{{h}, Tier::kDevice}}; }

TEST_CASE("a full event buffer drops its oldest event and counts it") {
  EventBuffer buf(2);
  buf.Push(Removed(1));
  buf.Push(Removed(2));
  buf.Push(Removed(3));
  CHECK(buf.size() == 2);
  CHECK(buf.dropped() == 1);
  testing::RecordingSink sink;
  CHECK(buf.Flush(&sink) == 2);
  REQUIRE(sink.events.size() == 2);
  CHECK(std::get<RemovedEvent>(sink.events[0].data).hashes[0] == 2);
  CHECK(std::get<RemovedEvent>(sink.events[1].data).hashes[0] == 3);
  CHECK(buf.size() == 0);
}

TEST_CASE("an event buffer of size 0 keeps and counts nothing") {
  EventBuffer buf(0);
  buf.Push(Removed(1));
  CHECK_FALSE(buf.enabled());
  CHECK(buf.size() == 0);
  CHECK(buf.dropped() == 0);
}

}  // namespace
}  // namespace kvfleet::kv
