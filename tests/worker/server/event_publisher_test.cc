#include "worker/server/event_publisher.h"

#include <chrono>
#include <optional>
#include <thread>

#include <doctest/doctest.h>
#include <prometheus/registry.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "tests/router/events/scripted_kv_source.h"

namespace kvfleet::events {
namespace {

using testing::PublishStep;
using testing::ScriptedKvSource;
using testing::ServeSnapshots;

// Generous bound for a message that should arrive at once; only failing tests wait it out.
constexpr auto kPatience = std::chrono::seconds(5);

EventPublisherOptions LoopbackOptions(const std::string& id) {
  EventPublisherOptions o;
  o.worker_id = id;
  o.events_endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.epoch = 0xE0E0;
  return o;
}

struct Subscriber {
  zmq::context_t ctx{1};
  zmq::socket_t sub{ctx, zmq::socket_type::sub};
  zmq::socket_t dealer{ctx, zmq::socket_type::dealer};
  uint64_t epoch = 0;  // every reply carries the publisher's
  explicit Subscriber(const EventPublisher& p) : epoch(p.epoch()) {
    sub.set(zmq::sockopt::subscribe, "kv.");
    sub.connect(p.events_endpoint());
    dealer.connect(p.replay_endpoint());
  }
  std::optional<DecodedBatch> NextBatch() {
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, kPatience) == 0) return std::nullopt;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(sub, std::back_inserter(parts));
    REQUIRE(parts.size() == 2);
    auto b = DecodeBatch(parts[1].data(), parts[1].size());
    REQUIRE(b.ok());
    CHECK(parts[0].to_string() == "kv." + b->header.worker_id);
    return std::move(*b);
  }
  // Skips heartbeats until a batch with events arrives.
  std::optional<DecodedBatch> NextEventBatch() {
    for (int i = 0; i < 100; ++i) {
      auto b = NextBatch();
      if (!b || !b->events.empty()) return b;
    }
    return std::nullopt;
  }
  void Request(uint64_t epoch, uint64_t from, uint64_t id) {
    dealer.send(zmq::buffer(EncodeReplayRequest({epoch, from, id})));
  }
  // Receives one reply, calling `service` (the engine's between-steps hook) while waiting.
  std::optional<ReplayReply> Reply(const std::function<void()>& service = {}) {
    const auto deadline = std::chrono::steady_clock::now() + kPatience;
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    while (std::chrono::steady_clock::now() < deadline) {
      if (service) service();
      if (zmq::poll(&item, 1, std::chrono::milliseconds(5)) == 0) continue;
      zmq::message_t m;
      (void)dealer.recv(m);
      auto d = DecodeReplayReply(m.data(), m.size());
      REQUIRE(d.ok());
      CHECK(d->header.epoch == epoch);
      return std::move(*d);
    }
    return std::nullopt;
  }
};

TEST_CASE("each published step becomes one batch with the worker's epoch and the next seq") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w1"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  EventPublisher& p = **pub;
  Subscriber s(p);
  ScriptedKvSource kv(1);
  REQUIRE(s.NextBatch());  // a heartbeat: the subscription is live
  uint64_t last = p.last_seq();
  LoadReport load;
  load.active_requests = 3;
  for (int step = 0; step < 5; ++step) {
    kv.Step(10);
    PublishStep(p, kv, load);
    auto b = s.NextEventBatch();
    REQUIRE(b);
    CHECK(b->header.epoch == 0xE0E0);
    CHECK(b->header.seq > last);
    CHECK(b->block_events >= 10);
    CHECK(b->load.active_requests == 3);
    last = b->header.seq;
  }
  PublishStep(p, kv, load);  // no events: no batch, no seq
  CHECK(p.last_seq() == last);
}

TEST_CASE("an idle worker sends heartbeats with its last load at least every 250 ms") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w2"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  Subscriber s(**pub);
  ScriptedKvSource kv(2);
  LoadReport load;
  load.free_blocks = {7, 9};
  PublishStep(**pub, kv, load);
  auto first = s.NextBatch();
  auto second = s.NextBatch();
  auto third = s.NextBatch();
  REQUIRE((first && second && third));
  CHECK(third->events.empty());
  CHECK(third->header.seq == second->header.seq + 1);  // heartbeats take seqs too
  CHECK(third->load.free_blocks[1] == 9);
  const double gap_ms = static_cast<double>(third->header.created_ns - second->header.created_ns) / 1e6;
  CHECK(gap_ms < 250);
}

TEST_CASE("a replay request inside the ring gets the batches from fromSeq on") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w3"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  EventPublisher& p = **pub;
  Subscriber s(p);
  ScriptedKvSource kv(3);
  REQUIRE(s.NextBatch());
  std::vector<uint64_t> seqs;
  for (int i = 0; i < 4; ++i) {
    kv.Step(5);
    PublishStep(p, kv);
    auto b = s.NextEventBatch();
    REQUIRE(b);
    seqs.push_back(b->header.seq);
  }
  s.Request(p.epoch(), seqs[1], 42);
  auto reply = s.Reply();
  REQUIRE(reply);
  CHECK(reply->header.request_id == 42);
  CHECK(reply->header.last);
  const auto* batches = std::get_if<std::vector<DecodedBatch>>(&reply->body);
  REQUIRE(batches != nullptr);
  REQUIRE(batches->size() >= 3);
  CHECK((*batches)[0].header.seq == seqs[1]);
  for (size_t i = 1; i < batches->size(); ++i) CHECK((*batches)[i].header.seq == (*batches)[i - 1].header.seq + 1);
  CHECK(p.replay_requests() == 1);
}

TEST_CASE("an unknown epoch gets a snapshot consistent with the last sealed seq") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w4"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  EventPublisher& p = **pub;
  Subscriber s(p);
  ScriptedKvSource kv(4);
  for (int i = 0; i < 20; ++i) {
    kv.Step(50);
    PublishStep(p, kv);
  }
  kv.Step(7);  // not taken yet: the snapshot must seal it first
  s.Request(0, 0, 9);
  std::vector<BlockHash> device;
  uint64_t consistent = 0;
  while (true) {
    auto reply = s.Reply([&] { ServeSnapshots(p, kv); });
    REQUIRE(reply);
    const auto* snap = std::get_if<SnapshotChunk>(&reply->body);
    REQUIRE(snap != nullptr);
    CHECK(reply->header.request_id == 9);
    consistent = snap->consistent_seq;
    for (const kv::KvEvent& e : snap->events) {
      const auto* stored = std::get_if<kv::StoredEvent>(&e.data);
      REQUIRE(stored != nullptr);
      if (e.window_size != 0) continue;
      for (const kv::StoredBlock& b : stored->blocks)
        if (b.tier == kv::Tier::kDevice) device.push_back(b.hash);
    }
    if (reply->header.last) break;
  }
  CHECK(consistent == p.last_seq());
  std::sort(device.begin(), device.end());
  CHECK(device == kv.Blocks(kv::Tier::kDevice));
  CHECK(p.snapshots_sent() == 1);
}

TEST_CASE("events the KV manager dropped leave a seq hole, so a replay across it becomes a snapshot") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w5"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  EventPublisher& p = **pub;
  Subscriber s(p);
  ScriptedKvSource kv(5);
  REQUIRE(s.NextBatch());
  kv.Step(5);
  PublishStep(p, kv);
  auto before = s.NextEventBatch();
  REQUIRE(before);
  kv.DropNextEvents(true);
  kv.Step(5);
  kv.DropNextEvents(false);
  kv.Step(5);
  PublishStep(p, kv);
  auto after = s.NextEventBatch();
  REQUIRE(after);
  CHECK(after->header.seq >= before->header.seq + 2);  // one seq skipped at least
  CHECK(p.events_dropped() >= 1);
  s.Request(p.epoch(), before->header.seq + 1, 11);
  auto reply = s.Reply([&] { ServeSnapshots(p, kv); });
  REQUIRE(reply);
  CHECK(std::holds_alternative<SnapshotChunk>(reply->body));
}

TEST_CASE("events get ids 1, 2, ... across batches; lost events leave an id hole with a seq hole; a snapshot "
          "carries the last id given out") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w8"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  EventPublisher& p = **pub;
  Subscriber s(p);
  ScriptedKvSource kv(8);
  REQUIRE(s.NextBatch());
  kv.Step(5);
  PublishStep(p, kv);
  auto first = s.NextEventBatch();
  REQUIRE(first);
  CHECK(FirstEventId(*first) == 1);
  CHECK(LastEventId(*first) == first->events.size());
  kv.Step(5);
  PublishStep(p, kv);
  auto second = s.NextEventBatch();
  REQUIRE(second);
  CHECK(second->header.seq == first->header.seq + 1);
  CHECK(FirstEventId(*second) == LastEventId(*first) + 1);

  kv.DropNextEvents(true);
  kv.Step(5);
  kv.DropNextEvents(false);
  const uint64_t lost = kv.events_dropped();
  REQUIRE(lost > 0);
  kv.Step(5);
  PublishStep(p, kv);
  auto third = s.NextEventBatch();
  REQUIRE(third);
  CHECK(third->header.seq == second->header.seq + 2);
  CHECK(FirstEventId(*third) == LastEventId(*second) + 1 + lost);

  kv.Step(3);  // sealed by the snapshot, as batch consistentSeq
  s.Request(0, 0, 12);
  uint64_t consistent_seq = 0, consistent_id = 0;
  while (true) {
    auto reply = s.Reply([&] { ServeSnapshots(p, kv); });
    REQUIRE(reply);
    const auto* snap = std::get_if<SnapshotChunk>(&reply->body);
    REQUIRE(snap != nullptr);
    consistent_seq = snap->consistent_seq;
    consistent_id = snap->consistent_event_id;
    for (const kv::KvEvent& e : snap->events) CHECK(e.id == 0);  // state, not stream events
    if (reply->header.last) break;
  }
  auto sealed = s.NextEventBatch();
  REQUIRE(sealed);
  CHECK(sealed->header.seq == consistent_seq);
  CHECK(FirstEventId(*sealed) == LastEventId(*third) + 1);
  CHECK(consistent_id == LastEventId(*sealed));
}

TEST_CASE("a malformed replay request gets an error reply and the publisher keeps going") {
  prometheus::Registry registry;
  auto pub = EventPublisher::Make(LoopbackOptions("w6"), SystemClock::Default(), &registry);
  REQUIRE(pub.ok());
  Subscriber s(**pub);
  s.dealer.send(zmq::str_buffer("not a capnp message at all"));
  auto reply = s.Reply();
  REQUIRE(reply);
  const auto* error = std::get_if<ReplayError>(&reply->body);
  REQUIRE(error != nullptr);
  CHECK(!error->message.empty());
  CHECK(reply->header.last);
  s.Request((*pub)->epoch(), (*pub)->last_seq() + 1, 5);  // nothing missing: empty batches
  reply = s.Reply();
  REQUIRE(reply);
  const auto* batches = std::get_if<std::vector<DecodedBatch>>(&reply->body);
  REQUIRE(batches != nullptr);
  CHECK(batches->empty());
  CHECK(reply->header.request_id == 5);
}

TEST_CASE("options outside the contract are refused") {
  prometheus::Registry registry;
  auto o = LoopbackOptions("");
  CHECK(!EventPublisher::Make(o, SystemClock::Default(), &registry).ok());
  o = LoopbackOptions("w7");
  o.heartbeat_interval = kNsPerSec;
  CHECK(!EventPublisher::Make(o, SystemClock::Default(), &registry).ok());
  o = LoopbackOptions("w7");
  o.events_endpoint = "nonsense";
  CHECK(!EventPublisher::Make(o, SystemClock::Default(), &registry).ok());
}

}  // namespace
}  // namespace kvfleet::events
