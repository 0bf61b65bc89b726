#include "worker/kv/event_list.h"

#include <doctest/doctest.h>

#include <algorithm>

namespace kvfleet::kv {
namespace {

KvEvent Removed(BlockHash h) { return KvEvent{0, RemovedEvent{{h}, Tier::kDevice}}; }
BlockHash HashOf(const KvEvent& e) { return std::get<RemovedEvent>(e.data).hashes[0]; }

TEST_CASE("a full event list drops its oldest event and counts it") {
  EventList list(2);
  list.Push(Removed(1));
  list.Push(Removed(2));
  list.Push(Removed(3));
  CHECK(list.size() == 2);
  CHECK(list.dropped() == 1);
  const std::vector<KvEvent> events = list.Take();
  REQUIRE(events.size() == 2);
  CHECK(HashOf(events[0]) == 2);
  CHECK(HashOf(events[1]) == 3);
  CHECK(list.size() == 0);
  CHECK(list.Take().empty());
}

TEST_CASE("an event list that overflows for long keeps the newest max_size events in order") {
  EventList list(3);
  for (BlockHash h = 1; h <= 100; ++h) {
    list.Push(Removed(h));
    CHECK(list.size() == std::min<size_t>(h, 3));
  }
  CHECK(list.dropped() == 97);
  const std::vector<KvEvent> events = list.Take();
  REQUIRE(events.size() == 3);
  CHECK(HashOf(events[0]) == 98);
  CHECK(HashOf(events[2]) == 100);
  list.Push(Removed(101));
  REQUIRE(list.Take().size() == 1);
  CHECK(list.dropped() == 97);
}

TEST_CASE("an event list of size 0 keeps and counts nothing") {
  EventList list(0);
  list.Push(Removed(1));
  CHECK_FALSE(list.enabled());
  CHECK(list.size() == 0);
  CHECK(list.dropped() == 0);
  CHECK(list.Take().empty());
}

}  // namespace
}  // namespace kvfleet::kv
