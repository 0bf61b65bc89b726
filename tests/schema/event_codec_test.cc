#include "schema/event_codec.h"

#include "common/block_hash.h"
#include "tests/schema/frame_vectors.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string_view>
#include <variant>
#include <sstream>
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
  load.prefill_tokens_per_second = 18500;
  load.predicted_wait_us = 1'250'000;
  load.pulled_wait_us = 40'000;
  load.resident_loras = {LoraId("a"), LoraId("b")};
  load.pulls = {{"tcp://10.0.0.7:5700", 3, 3'000'000'000, 0.25, 2, 0.5}, {"tcp://10.0.0.8:5700", 1, 4096, 0.004}};
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
  CHECK(batch->load.pulled_wait_us == 40'000);
  CHECK(batch->load.resident_loras == load.resident_loras);
  CHECK(batch->load.pulls == load.pulls);
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

// Cap'n Proto pointers, for frames written word by word.
uint64_t StructPtr(int32_t offset, uint16_t data_words, uint16_t ptrs) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2)) | (uint64_t{data_words} << 32) |
         (uint64_t{ptrs} << 48);
}
uint64_t ListPtr(int32_t offset, uint64_t size_tag, uint64_t count) {
  return 1 | (static_cast<uint64_t>(static_cast<uint32_t>(offset) << 2)) | (size_tag << 32) | (count << 35);
}

TEST_CASE("a Load without predictedWaitUs (a worker older than the field) reads as no wait") {
  // A heartbeat of worker "w" whose Load is that of schema/README.md's example batch, as a
  // worker from before the field wrote it: a data section of 4 words (two u32 counts, two
  // u64 counts, two f32 rates).
  uint64_t data[4] = {};
  const uint32_t counts[2] = {3, 1};      // activeRequests, queuedRequests
  const uint64_t tokens[2] = {2048, 40};  // activePrefillTokens, activeDecodeBlocks
  const float rates[2] = {18500, 2400};   // prefillTokensPerSecond, decodeTokensPerSecond
  std::memcpy(&data[0], counts, sizeof(counts));
  std::memcpy(&data[1], tokens, sizeof(tokens));
  std::memcpy(&data[3], rates, sizeof(rates));
  std::vector<uint64_t> w = {
      0,                  // segment table: 1 segment, size set below
      StructPtr(0, 3, 3), // root: EventBatch, 3 data words, 3 pointers
      1, 1, 0,            // epoch, seq, createdNs
      ListPtr(2, 2, 2),   // workerId: Text "w" (2 bytes) at word 8
      0,                  // events: none (a heartbeat)
      StructPtr(1, 4, 2), // load at word 9: 4 data words, 2 pointers (the block lists)
      'w',                // "w\0"
  };
  w.insert(w.end(), std::begin(data), std::end(data));
  w.insert(w.end(), {0, 0});  // freeBlocks, totalBlocks: null
  w[0] = static_cast<uint64_t>(w.size() - 1) << 32;
  auto batch = DecodeBatch(w.data(), w.size() * sizeof(uint64_t));
  REQUIRE(batch.ok());
  const LoadReport& load = batch->load;
  CHECK(load.active_requests == 3);
  CHECK(load.queued_requests == 1);
  CHECK(load.active_prefill_tokens == 2048);
  CHECK(load.decode_tokens_per_second == 2400);
  CHECK(load.predicted_wait_us == 0);
  CHECK(load.resident_loras.empty());
  CHECK(load.pulls.empty());
}

TEST_CASE("a Load's pull totals are refused when malformed: no holder, a bad time, too many holders") {
  auto decodes = [](const LoadReport& load) {
    const std::string frame = EncodeBatch({"w1", 9, 4, 0}, {}, load);
    return DecodeBatch(frame.data(), frame.size());
  };
  LoadReport load;
  load.pulls = {{"", 1, 10, 0.1}};
  CHECK_FALSE(decodes(load).ok());
  load.pulls = {{"tcp://h:1", 1, 10, -1}};
  CHECK_FALSE(decodes(load).ok());
  load.pulls = {{"tcp://h:1", 1, 10, std::nan("")}};
  CHECK_FALSE(decodes(load).ok());
  load.pulls = {{"tcp://h:1", 1, 10, 0.1, 1, -0.5}};  // the failed pulls' time
  CHECK_FALSE(decodes(load).ok());
  load.pulls = {{"tcp://h:1", 1, 10, 0.1, 1, std::numeric_limits<double>::infinity()}};
  CHECK_FALSE(decodes(load).ok());
  load.pulls = {{std::string(300, 'x'), 1, 10, 0.1}};
  CHECK_FALSE(decodes(load).ok());
  load.pulls.assign(events::config::kMaxPullSources + 1, PullTotals{"tcp://h:1", 1, 10, 0.1});
  auto many = decodes(load);
  REQUIRE_FALSE(many.ok());
  CHECK(many.status().message().find("holders") != std::string::npos);
  load.pulls.resize(events::config::kMaxPullSources);
  CHECK(decodes(load).ok());
}

TEST_CASE("truncated frames and lists of empty structs are refused, not expanded") {
  const std::string frame = EncodeBatch({"w1", 9, 4, 0}, {}, {});
  for (size_t cut = 8; cut < frame.size(); cut += 8) CHECK(!DecodeBatch(frame.data(), cut).ok());

  // An EventBatch whose `events` claims a million zero-sized entries in one tag word.
  std::vector<uint64_t> w = {
      0,                          // segment table: 1 segment, size set below
      StructPtr(0, 3, 3),         // root: EventBatch, 3 data words, 3 pointers
      1, 1, 0,                    // epoch, seq, createdNs
      ListPtr(2, 2, 2),           // workerId: Text "w" (2 bytes) at word 8
      ListPtr(2, 7, 0),           // events: inline-composite list of 0 element words, tag at word 9
      0,                          // load: null
      'w',                        // "w\0"
      StructPtr(1'000'000, 0, 0)  // tag: a million elements of 0 data words, 0 pointers
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
std::map<std::string, std::string> LoadEventVectors() { return testing::LoadFrameVectors("schema/event_vectors.txt"); }

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
  CHECK(b->load.pulled_wait_us == kPulledWaitUnknown);         // both predate pulledWaitUs
}

TEST_CASE("the spec's example frames decode, and an older worker's frame reads as event id 0 and lora id 0") {
  const auto vectors = LoadEventVectors();
  REQUIRE(vectors.size() == 6);
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

// ---- Replay requests and answers ----

constexpr uint64_t kExampleEpoch = 0x1f2e3d4c5b6a7988ULL;

// The example batch of schema/README.md, decoded from its vector.
DecodedBatch ExampleBatch(const std::map<std::string, std::string>& vectors) {
  const std::string& frame = vectors.at("example batch");
  auto b = DecodeBatch(frame.data(), frame.size());
  REQUIRE(b.ok());
  return std::move(*b);
}

std::string Bytes(const DecodedBatch& b) { return EncodeBatch(b.header, b.events, b.load); }

TEST_CASE("a replay request encodes to the spec's frame and decodes back") {
  const auto vectors = LoadEventVectors();
  const std::string& frame = vectors.at("replay request");
  CHECK(EncodeReplayRequest({kExampleEpoch, 40, 7}) == frame);
  auto r = DecodeReplayRequest(frame.data(), frame.size());
  REQUIRE(r.ok());
  CHECK(r->epoch == kExampleEpoch);
  CHECK(r->from_seq == 40);
  CHECK(r->request_id == 7);
  CHECK(!DecodeReplayRequest("not capnp", 9).ok());
  CHECK(!DecodeReplayRequest(frame.data(), frame.size() - 8).ok());
}

TEST_CASE("replayed batches embed the published frames unchanged, as the spec's frame has them") {
  const auto vectors = LoadEventVectors();
  const DecodedBatch example = ExampleBatch(vectors);
  const std::string published = Bytes(example);
  const std::vector<std::string_view> ring = {published};
  const std::string frame = EncodeReplayBatches({"w0", kExampleEpoch, 7, true}, ring);
  CHECK(frame == vectors.at("replayed batches: the example batch, answering request 7"));
  auto reply = DecodeReplayReply(frame.data(), frame.size());
  REQUIRE(reply.ok());
  CHECK(reply->header.worker_id == "w0");
  CHECK(reply->header.epoch == kExampleEpoch);
  CHECK(reply->header.request_id == 7);
  CHECK(reply->header.last);
  const auto* batches = std::get_if<std::vector<DecodedBatch>>(&reply->body);
  REQUIRE(batches != nullptr);
  REQUIRE(batches->size() == 1);
  CheckExampleBatch(Bytes((*batches)[0]), true);
  CHECK((*batches)[0].block_events == example.block_events);

  // "Nothing missing": an empty list, not a snapshot.
  const std::string empty = EncodeReplayBatches({"w0", kExampleEpoch, 8, true}, {});
  auto none = DecodeReplayReply(empty.data(), empty.size());
  REQUIRE(none.ok());
  REQUIRE(std::holds_alternative<std::vector<DecodedBatch>>(none->body));
  CHECK(std::get<std::vector<DecodedBatch>>(none->body).empty());
}

TEST_CASE("a snapshot chunk and an error encode to the spec's frames and decode back") {
  const auto vectors = LoadEventVectors();
  std::vector<kv::KvEvent> events;
  events.push_back({0, kv::StoredEvent{0x9c1d5e2f3a4b6c7dULL,
                                       {{0x51aa0c3e7b9d2f41ULL, {}, kv::Tier::kDevice, 100},
                                        {0x0b7f4e2a6c8d1935ULL, {}, kv::Tier::kDevice, 35}}}});
  events.push_back({0, kv::StoredEvent{0, {{0x3c42a1b2c3d4e5f6ULL, {}, kv::Tier::kHost, 35}}}});
  const std::string chunk = EncodeSnapshotChunk({"w0", kExampleEpoch, 7, false}, 42, 1043, events);
  CHECK(chunk == vectors.at("a snapshot chunk, answering request 7"));
  auto reply = DecodeReplayReply(chunk.data(), chunk.size());
  REQUIRE(reply.ok());
  CHECK(!reply->header.last);
  CHECK(reply->header.request_id == 7);
  const auto* snap = std::get_if<SnapshotChunk>(&reply->body);
  REQUIRE(snap != nullptr);
  CHECK(snap->consistent_seq == 42);
  CHECK(snap->consistent_event_id == 1043);
  REQUIRE(snap->events.size() == 2);
  CHECK(EncodeBatch({"w0", 1, 1, 0}, snap->events, {}) == EncodeBatch({"w0", 1, 1, 0}, events, {}));

  const std::string message = "malformed message: 26 bytes is not a whole number of words";
  const std::string error = EncodeReplayError({"w0", kExampleEpoch, 0, true}, message);
  CHECK(error == vectors.at("a replay error"));
  auto decoded = DecodeReplayReply(error.data(), error.size());
  REQUIRE(decoded.ok());
  REQUIRE(std::holds_alternative<ReplayError>(decoded->body));
  CHECK(std::get<ReplayError>(decoded->body).message == message);
  CHECK(decoded->header.request_id == 0);
}

TEST_CASE("replays of many random batches and snapshots of many random chains survive encoding") {
  std::mt19937_64 rng(7);
  auto random_events = [&](size_t n, bool ids, uint64_t first_id) {
    std::vector<kv::KvEvent> events;
    for (size_t i = 0; i < n; ++i) {
      kv::KvEvent e;
      e.window_size = rng() % 3 == 0 ? 4096 : 0;
      e.id = ids ? first_id + i : 0;
      switch (rng() % 4) {
        case 0: {
          kv::StoredEvent s{rng(), {}};
          for (size_t b = 0, nb = 1 + rng() % 5; b < nb; ++b) {
            std::vector<TokenId> tokens(rng() % 3 == 0 ? 4 : 0);
            for (TokenId& t : tokens) t = static_cast<TokenId>(rng() % 128'000);
            s.blocks.push_back({rng(), tokens, rng() % 2 ? kv::Tier::kHost : kv::Tier::kDevice,
                                static_cast<uint8_t>(rng() % 101), rng() % 4 == 0 ? rng() | 1 : 0});
          }
          e.data = std::move(s);
          break;
        }
        case 1: e.data = kv::RemovedEvent{{rng(), rng()}, kv::Tier::kHost}; break;
        case 2: e.data = kv::UpdatedEvent{rng(), kv::Tier::kDevice, static_cast<uint8_t>(rng() % 101)}; break;
        default: e.data = kv::ClearedEvent{};
      }
      events.push_back(std::move(e));
    }
    return events;
  };
  std::vector<std::string> frames;
  uint64_t next_id = 1;
  for (uint64_t seq = 1; seq <= 300; ++seq) {
    const size_t n = rng() % 6;
    LoadReport load;
    load.active_requests = static_cast<uint32_t>(rng() % 64);
    load.free_blocks = {rng() % 4096, rng() % 4096};
    frames.push_back(EncodeBatch({"worker-0", 99, seq, static_cast<int64_t>(rng() >> 1)},
                                 random_events(n, true, next_id), load));
    next_id += n;
  }
  std::vector<std::string_view> views(frames.begin(), frames.end());
  const std::string replay = EncodeReplayBatches({"worker-0", 99, 5, false}, views);
  auto reply = DecodeReplayReply(replay.data(), replay.size());
  REQUIRE(reply.ok());
  const auto& batches = std::get<std::vector<DecodedBatch>>(reply->body);
  REQUIRE(batches.size() == frames.size());
  for (size_t i = 0; i < frames.size(); ++i) CHECK(Bytes(batches[i]) == frames[i]);

  const std::vector<kv::KvEvent> snapshot = random_events(2000, false, 0);
  const std::string chunk = EncodeSnapshotChunk({"worker-0", 99, 5, true}, 300, next_id - 1, snapshot);
  auto snap = DecodeReplayReply(chunk.data(), chunk.size());
  REQUIRE(snap.ok());
  const auto& decoded = std::get<SnapshotChunk>(snap->body);
  CHECK(decoded.consistent_event_id == next_id - 1);
  CHECK(EncodeBatch({"w", 1, 1, 0}, decoded.events, {}) == EncodeBatch({"w", 1, 1, 0}, snapshot, {}));
}

TEST_CASE("malformed replay replies are refused whole, not half applied") {
  const auto vectors = LoadEventVectors();
  const DecodedBatch example = ExampleBatch(vectors);
  auto refused = [](const std::string& frame, const std::string& why) {
    auto r = DecodeReplayReply(frame.data(), frame.size());
    INFO(why);
    REQUIRE(!r.ok());
    CHECK(r.status().ToString().find(why) != std::string::npos);
  };
  std::vector<kv::KvEvent> events = example.events;
  refused(EncodeSnapshotChunk({"w0", 0, 7, true}, 42, 0, events), "epoch 0");
  refused(EncodeSnapshotChunk({"", 1, 7, true}, 42, 0, events), "worker id");
  refused(EncodeSnapshotChunk({std::string(257, 'w'), 1, 7, true}, 42, 0, events), "worker id");
  // One bad block among good ones: the whole chunk goes.
  std::get<kv::StoredEvent>(events[0].data).blocks[1].priority = 101;
  refused(EncodeSnapshotChunk({"w0", 1, 7, true}, 42, 0, events), "priority 101");
  // A replayed batch the live path would refuse: the whole message goes.
  DecodedBatch bad = example;
  bad.events[1].id = 7;  // ids 1041, 7, 1043
  const std::string bad_frame = Bytes(bad);
  const std::string good_frame = Bytes(example);
  refused(EncodeReplayBatches({"w0", 1, 7, true}, std::vector<std::string_view>{good_frame, bad_frame}), "event ids");
  // Truncated anywhere.
  const std::string whole = EncodeReplayBatches({"w0", 1, 7, true}, std::vector<std::string_view>{good_frame});
  for (size_t cut = 8; cut < whole.size(); cut += 8) CHECK(!DecodeReplayReply(whole.data(), cut).ok());

  // A snapshot whose `events` claims a million zero-sized entries in one tag word.
  std::vector<uint64_t> w = {
      0,                          // segment table: 1 segment, size set below
      StructPtr(0, 3, 2),         // root: ReplayReply, 3 data words, 2 pointers
      1, 0x0001'0000, 7,          // epoch; last = false and union tag 1 (snapshot); requestId
      ListPtr(1, 2, 2),           // workerId: Text "w" (2 bytes) at word 7
      StructPtr(1, 2, 1),         // snapshot at word 8: 2 data words, 1 pointer
      'w',                        // "w\0"
      0, 0,                       // consistentSeq, consistentEventId
      ListPtr(0, 7, 0),           // events: inline-composite list of 0 element words, tag next
      StructPtr(1'000'000, 0, 0)  // tag: a million elements of 0 data words, 0 pointers
  };
  w[0] = static_cast<uint64_t>(w.size() - 1) << 32;
  auto r = DecodeReplayReply(w.data(), w.size() * sizeof(uint64_t));
  REQUIRE(!r.ok());
  CHECK(r.status().ToString().find("empty") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::events
