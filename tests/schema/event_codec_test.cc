#include "schema/event_codec.h"

#include <cstring>
#include <iterator>
#include <vector>

#include <capnp/common.h>
#include <doctest/doctest.h>

#include "schema/wire.h"

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
  load.prefill_tokens_per_second = 18500;
  load.predicted_wait_us = 1'250'000;
  const std::string frame = EncodeBatch({"w1", 9, 4, 123}, events, load);
  auto batch = DecodeBatch(frame.data(), frame.size());
  REQUIRE(batch.ok());
  CHECK(batch->header.worker_id == "w1");
  CHECK(batch->header.epoch == 9);
  CHECK(batch->header.seq == 4);
  CHECK(batch->header.created_ns == 123);
  CHECK(batch->load.active_requests == 3);
  CHECK(batch->load.free_blocks[1] == 6);
  CHECK(batch->load.prefill_tokens_per_second == 18500);
  CHECK(batch->load.predicted_wait_us == 1'250'000);
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

TEST_CASE("a Load without predictedWaitUs (a worker older than the field) reads as no wait") {
  // The Load of schema/README.md's example batch, as a worker from before the field wrote it:
  // the capnp data section of 4 words (two u32 counts, two u64 counts, two f32 rates).
  uint64_t data[4] = {};
  const uint32_t counts[2] = {3, 1};      // activeRequests, queuedRequests
  const uint64_t tokens[2] = {2048, 40};  // activePrefillTokens, activeDecodeBlocks
  const float rates[2] = {18500, 2400};   // prefillTokensPerSecond, decodeTokensPerSecond
  std::memcpy(&data[0], counts, sizeof(counts));
  std::memcpy(&data[1], tokens, sizeof(tokens));
  std::memcpy(&data[3], rates, sizeof(rates));
  // Segment table (one segment of 7 words); the root: a struct pointer to 4 data words and
  // 2 pointers (the block lists, null).
  std::vector<uint64_t> w = {uint64_t{7} << 32, (uint64_t{4} << 32) | (uint64_t{2} << 48)};
  w.insert(w.end(), std::begin(data), std::end(data));
  w.insert(w.end(), {0, 0});
  auto msg = wire::Decode<schema::Load>(w.data(), w.size() * sizeof(uint64_t));
  REQUIRE(msg.ok());
  LoadReport load = ParseLoad((*msg)->Root<schema::Load>());
  CHECK(load.active_requests == 3);
  CHECK(load.queued_requests == 1);
  CHECK(load.active_prefill_tokens == 2048);
  CHECK(load.decode_tokens_per_second == 2400);
  CHECK(load.predicted_wait_us == 0);
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
