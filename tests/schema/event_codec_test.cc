#include "schema/event_codec.h"

#include "common/block_hash.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
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
  load.resident_loras = {LoraId("a"), LoraId("b")};
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
  CHECK(batch->load.resident_loras == load.resident_loras);
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

TEST_CASE("event ids and lora ids survive encoding; a batch's ids are consecutive or all 0") {
  std::vector<kv::KvEvent> events;
  events.push_back({0, kv::StoredEvent{0, {{21, {}, kv::Tier::kDevice, 100, LoraId("sql-adapter")}}}, 7});
  events.push_back({0, kv::RemovedEvent{{21}, kv::Tier::kDevice}, 8});
  events.push_back({0, kv::UpdatedEvent{22, std::nullopt, 35}, 9});
  const std::string frame = EncodeBatch({"w1", 9, 4, 0}, events, {});
  auto batch = DecodeBatch(frame.data(), frame.size());
  REQUIRE(batch.ok());
  REQUIRE(batch->events.size() == 3);
  CHECK(FirstEventId(*batch) == 7);
  CHECK(LastEventId(*batch) == 9);
  CHECK(batch->events[1].id == 8);
  const auto& stored = std::get<kv::StoredEvent>(batch->events[0].data);
  CHECK(stored.blocks[0].lora_id == LoraId("sql-adapter"));
  CHECK(stored.blocks[0].lora_id != 0);

  // Ids that skip, repeat or run backwards inside one batch, or mix 0 with ids, are refused.
  for (std::vector<uint64_t> ids : {std::vector<uint64_t>{7, 9, 10}, {7, 7, 8}, {9, 8, 7}, {0, 1, 2}, {7, 8, 0}}) {
    for (size_t i = 0; i < 3; ++i) events[i].id = ids[i];
    const std::string bad = EncodeBatch({"w1", 9, 4, 0}, events, {});
    auto r = DecodeBatch(bad.data(), bad.size());
    INFO(ids[0] << "," << ids[1] << "," << ids[2]);
    REQUIRE(!r.ok());
    CHECK(r.status().ToString().find("event ids") != std::string::npos);
  }
  for (auto& e : events) e.id = 0;  // an older worker's batch
  const std::string old = EncodeBatch({"w1", 9, 4, 0}, events, {});
  auto r = DecodeBatch(old.data(), old.size());
  REQUIRE(r.ok());
  CHECK(FirstEventId(*r) == 0);
  CHECK(LastEventId(*r) == 0);
}

TEST_CASE("LoraId is XXH3-64 of the adapter's name, 0 for the base model and never 0 for an adapter") {
  CHECK(LoraId("") == 0);
  CHECK(LoraId("sql-adapter") != 0);
  CHECK(LoraId("sql-adapter") != LoraId("sql-adapter2"));
  // Not the Contract 1 seed: the name alone, whatever the model or salt.
  CHECK(LoraId("sql-adapter") != HashSeed({"", "sql-adapter", ""}));
}

// schema/event_vectors.txt: vector name -> frame bytes.
std::map<std::string, std::string> LoadEventVectors() {
  std::ifstream in(std::string(KVFLEET_SOURCE_DIR) + "/schema/event_vectors.txt");
  REQUIRE(in.good());
  std::map<std::string, std::string> out;
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("vector ", 0) == 0) name = line.substr(7);
    if (line.rfind("frame ", 0) != 0) continue;
    std::string bytes;
    for (size_t i = 6; i + 1 < line.size(); i += 2) bytes.push_back(static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16)));
    out[name] = bytes;
  }
  return out;
}

// The example batch of schema/README.md, field by field; `ids` is whether its events carry ids.
void CheckExampleBatch(const std::string& frame, bool ids) {
  // Frames are copied into word-aligned memory, as ZMQ's receive buffers are.
  std::vector<capnp::word> words(frame.size() / sizeof(capnp::word));
  std::memcpy(words.data(), frame.data(), frame.size());
  auto b = DecodeBatch(words.data(), frame.size());
  REQUIRE(b.ok());
  CHECK(b->header.worker_id == "w0");
  CHECK(b->header.epoch == 0x1f2e3d4c5b6a7988ULL);
  CHECK(b->header.seq == 42);
  CHECK(b->header.created_ns == 1795000000123456789LL);
  REQUIRE(b->events.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(b->events[i].window_size == 0);
    CHECK(b->events[i].id == (ids ? 1041 + i : 0));
  }
  const auto& stored = std::get<kv::StoredEvent>(b->events[0].data);
  CHECK(stored.parent_hash == 0x9c1d5e2f3a4b6c7dULL);
  REQUIRE(stored.blocks.size() == 2);
  CHECK(stored.blocks[0].hash == 0x51aa0c3e7b9d2f41ULL);
  CHECK(stored.blocks[0].priority == 100);
  CHECK(stored.blocks[1].hash == 0x0b7f4e2a6c8d1935ULL);
  CHECK(stored.blocks[1].priority == 35);
  for (const auto& block : stored.blocks) {
    CHECK(block.tier == kv::Tier::kDevice);
    CHECK(block.tokens.empty());
    CHECK(block.lora_id == 0);
  }
  const auto& removed = std::get<kv::RemovedEvent>(b->events[1].data);
  CHECK(removed.hashes == std::vector<BlockHash>{0x77e01f2d3c4b5a69ULL});
  CHECK(removed.tier == kv::Tier::kDevice);
  const auto& updated = std::get<kv::UpdatedEvent>(b->events[2].data);
  CHECK(updated.hash == 0x3c42a1b2c3d4e5f6ULL);
  CHECK(updated.tier == kv::Tier::kHost);
  CHECK(!updated.priority.has_value());
  CHECK(b->load.active_requests == 3);
  CHECK(b->load.queued_requests == 1);
  CHECK(b->load.active_prefill_tokens == 2048);
  CHECK(b->load.active_decode_blocks == 40);
  CHECK(b->load.free_blocks == std::array<uint64_t, kLoadTiers>{812, 4096});
  CHECK(b->load.total_blocks == std::array<uint64_t, kLoadTiers>{2048, 4096});
  CHECK(b->load.prefill_tokens_per_second == 18500);
  CHECK(b->load.decode_tokens_per_second == 2400);
  CHECK(b->load.predicted_wait_us == (ids ? 110702u : 0u));  // the older worker predates it too
}

TEST_CASE("the spec's example frames decode, and an older worker's frame reads as event id 0 and lora id 0") {
  const auto vectors = LoadEventVectors();
  REQUIRE(vectors.size() == 2);
  REQUIRE(vectors.count("example batch") == 1);
  CheckExampleBatch(vectors.at("example batch"), true);
  const std::string old = "the example batch from a worker older than eventId and loraId (events.capnp @72d9858)";
  REQUIRE(vectors.count(old) == 1);
  CheckExampleBatch(vectors.at(old), false);
  // Our encoder writes what the reference encoder wrote: the same batch decodes the same.
  auto ref = DecodeBatch(vectors.at("example batch").data(), vectors.at("example batch").size());
  REQUIRE(ref.ok());
  CheckExampleBatch(EncodeBatch(ref->header, ref->events, ref->load), true);
}

}  // namespace
}  // namespace kvfleet::events
