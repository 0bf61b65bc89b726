#include "cli/simulate/sim_event_stream.h"

#include <doctest/doctest.h>

#include "cli/simulate/sim_kv_cache.h"

namespace kvfleet::sim {
namespace {

std::vector<events::ReplayReply> Ask(const SimEventStream& s, const SimKvCache& cache, events::ReplayRequest r,
                                     bool* snapshot) {
  const std::string frame = events::EncodeReplayRequest(r);
  std::vector<events::ReplayReply> out;
  for (const std::string& m : s.Answer(frame.data(), frame.size(), cache, snapshot)) {
    auto reply = events::DecodeReplayReply(m.data(), m.size());
    REQUIRE(reply.ok());
    CHECK(reply->header.request_id == r.request_id);
    out.push_back(std::move(*reply));
  }
  REQUIRE(!out.empty());
  CHECK(out.back().header.last);
  return out;
}

struct Fixture {
  Fixture() : cache(Options(), 5), stream("w0", 42, 4) {
    for (int i = 0; i < 10; ++i) {
      std::vector<kv::KvEvent> events;
      if (i % 3 != 2) cache.Request(&events);  // every third batch a heartbeat
      frames.push_back(stream.Seal(std::move(events), LoadReport{}, 1000 + i));
    }
  }
  static SimKvCacheOptions Options() {
    SimKvCacheOptions o;
    o.capacity_blocks = 1000;
    return o;
  }
  SimKvCache cache;
  SimEventStream stream;
  std::vector<std::string> frames;
};

TEST_CASE("sealed batches carry consecutive seqs and event ids from 1") {
  Fixture f;
  uint64_t next_id = 1;
  for (size_t i = 0; i < f.frames.size(); ++i) {
    auto b = events::DecodeBatch(f.frames[i].data(), f.frames[i].size());
    REQUIRE(b.ok());
    CHECK(b->header.seq == i + 1);
    CHECK(b->header.epoch == 42);
    for (const kv::KvEvent& e : b->events) CHECK(e.id == next_id++);
  }
  CHECK(f.stream.last_event_id() == next_id - 1);
}

TEST_CASE("a replay within the ring gets the batches as they were published") {
  Fixture f;
  bool snapshot = true;
  auto replies = Ask(f.stream, f.cache, {42, 8, 5}, &snapshot);
  CHECK_FALSE(snapshot);
  REQUIRE(replies.size() == 1);
  const auto& batches = std::get<std::vector<events::DecodedBatch>>(replies[0].body);
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].header.seq == 8);
  CHECK(batches[2].header.seq == 10);
}

TEST_CASE("a router that misses nothing gets an empty answer") {
  Fixture f;
  bool snapshot = true;
  auto replies = Ask(f.stream, f.cache, {42, 11, 6}, &snapshot);
  CHECK_FALSE(snapshot);
  CHECK(std::get<std::vector<events::DecodedBatch>>(replies[0].body).empty());
}

TEST_CASE("a replay out of the ring, or of another epoch, gets a snapshot stamped with the last seq") {
  Fixture f;
  for (events::ReplayRequest r : {events::ReplayRequest{42, 2, 7}, events::ReplayRequest{0, 0, 8},
                                  events::ReplayRequest{41, 9, 9}, events::ReplayRequest{42, 50, 10}}) {
    bool snapshot = false;
    auto replies = Ask(f.stream, f.cache, r, &snapshot);
    CHECK(snapshot);
    size_t blocks = 0;
    for (const auto& reply : replies) {
      const auto& chunk = std::get<events::SnapshotChunk>(reply.body);
      CHECK(chunk.consistent_seq == 10);
      CHECK(chunk.consistent_event_id == f.stream.last_event_id());
      blocks += events::BlockEventCount(chunk.events);
    }
    CHECK(blocks == f.cache.blocks());
  }
}

TEST_CASE("a request that does not decode gets an error") {
  Fixture f;
  bool snapshot = false;
  const std::string junk = "not a capnp message";
  auto answer = f.stream.Answer(junk.data(), junk.size(), f.cache, &snapshot);
  REQUIRE(answer.size() == 1);
  auto reply = events::DecodeReplayReply(answer[0].data(), answer[0].size());
  REQUIRE(reply.ok());
  CHECK(std::holds_alternative<events::ReplayError>(reply->body));
}

}  // namespace
}  // namespace kvfleet::sim
