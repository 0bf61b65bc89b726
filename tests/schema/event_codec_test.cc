#include "schema/event_codec.h"

#include <cstring>
#include <vector>

#include <capnp/common.h>
#include <doctest/doctest.h>

namespace kvfleet::events {
namespace {

TEST_CASE("a batch survives encoding and decoding") {
  std::vector<kv::KvEvent> events;
  events.push_back({0, kv::StoredEvent{7, {{11, {1, 2, 3}, kv::Tier::kDevice, 35}, {12, {}, kv::Tier::kHost, 100}}}});
  events.push_back({0, kv::RemovedEvent{{11, 13}, kv::Tier::kHost}});
  events.push_back({512, kv::UpdatedEvent{12, kv::Tier::kDevice, std::nullopt}});
  events.push_back({0, kv::ClearedEvent{}});
  LoadReport load;
  load.active_requests = 3;
  load.free_blocks = {5, 6};
  const std::string frame = EncodeBatch({"w1", 9, 4, 123}, events, load);
  auto batch = DecodeBatch(frame.data(), frame.size());
  REQUIRE(batch.ok());
  CHECK(batch->header.worker_id == "w1");
  CHECK(batch->header.epoch == 9);
  CHECK(batch->header.seq == 4);
  CHECK(batch->header.created_ns == 123);
  CHECK(batch->load.active_requests == 3);
  CHECK(batch->load.free_blocks[1] == 6);
  CHECK(batch->block_events == 2 + 2 + 1 + 1);
  REQUIRE(batch->events.size() == 4);
  const auto& stored = std::get<kv::StoredEvent>(batch->events[0].data);
  CHECK(stored.parent_hash == 7);
  REQUIRE(stored.blocks.size() == 2);
  CHECK(stored.blocks[0].tokens == std::vector<TokenId>{1, 2, 3});
  CHECK(stored.blocks[1].tier == kv::Tier::kHost);
  CHECK(stored.blocks[1].priority == 100);
  CHECK(std::get<kv::RemovedEvent>(batch->events[1].data).hashes == std::vector<BlockHash>{11, 13});
  CHECK(batch->events[2].window_size == 512);
  CHECK(std::get<kv::UpdatedEvent>(batch->events[2].data).tier == kv::Tier::kDevice);
  CHECK(std::holds_alternative<kv::ClearedEvent>(batch->events[3].data));
}

TEST_CASE("truncated frames and lists of empty structs are refused, not expanded") {
  const std::string frame = EncodeBatch({"w1", 9, 4, 0}, {}, {});
  for (size_t cut = 8; cut < frame.size(); cut += 8) CHECK(!DecodeBatch(frame.data(), cut).ok());

  // An EventBatch whose `events` claims a million zero-sized entries in one tag word.
  auto struct_ptr = [](int32_t offset, uint16_t data, uint16_t ptrs) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2)) | (uint64_t{data} << 32) |
           (uint64_t{ptrs} << 48);
  };
  auto list_ptr = [](int32_t offset, uint64_t size_tag, uint64_t count) {
    return 1 | (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2)) | (size_tag << 32) | (count << 35);
  };
  std::vector<uint64_t> w = {
      0,                           // segment table: 1 segment, size set below
      struct_ptr(0, 3, 3),         // root: EventBatch, 3 data words, 3 pointers
      1, 1, 0,                     // epoch, seq, createdNs
      list_ptr(2, 2, 2),           // workerId: Text "w" (2 bytes) at word 8
      list_ptr(2, 7, 0),           // events: inline-composite list of 0 element words, tag at word 9
      0,                           // load: null
      'w',                         // "w\0"
      struct_ptr(1'000'000, 0, 0)  // tag: a million elements of 0 data words, 0 pointers
  };
  w[0] = static_cast<uint64_t>(w.size() - 1) << 32;
  auto batch = DecodeBatch(w.data(), w.size() * sizeof(uint64_t));
  REQUIRE(!batch.ok());
  CHECK(batch.status().ToString().find("empty") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::events
