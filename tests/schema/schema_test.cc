// Every wire message encodes and decodes back to itself, and garbage never crashes
// the decoder.
#include <random>

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "schema/events.capnp.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

using namespace kvfleet;
namespace s = kvfleet::schema;

namespace {
template <typename T>
std::unique_ptr<wire::DecodedMessage> RoundTrip(capnp::MallocMessageBuilder& b) {
  std::string bytes = wire::Encode(b);
  auto r = wire::Decode<T>(bytes.data(), bytes.size());
  REQUIRE(r.ok());
  return std::move(r).value();
}
}  // namespace

TEST_CASE("an EventBatch with every event kind round-trips") {
  capnp::MallocMessageBuilder b;
  auto batch = b.initRoot<s::EventBatch>();
  batch.setWorkerId("w-1");
  batch.setEpoch(0xdeadbeefcafef00dULL);
  batch.setSeq(42);
  batch.setCreatedNs(1'700'000'000'000'000'000LL);
  auto events = batch.initEvents(5);
  events[0].setWindowSize(0);
  auto created = events[0].initCreated();
  created.setBlockSize(32);
  auto per_tier = created.initBlocksPerTier(2);
  per_tier.set(0, 4096);
  per_tier.set(1, 16384);
  events[1].setWindowSize(4096);
  auto stored = events[1].initStored();
  stored.setParentHash(7);
  auto blocks = stored.initBlocks(2);
  blocks[0].setHash(11);
  blocks[0].setPriority(100);
  blocks[0].setTier(s::Tier::DEVICE);
  auto toks = blocks[0].initTokens(3);
  toks.set(0, 1);
  toks.set(1, 2);
  toks.set(2, 128255);
  blocks[1].setHash(12);
  blocks[1].setTier(s::Tier::HOST);
  auto removed = events[2].initRemoved();
  auto hashes = removed.initHashes(1);
  hashes.set(0, 12);
  removed.setTier(s::Tier::HOST);
  auto updated = events[3].initUpdated();
  updated.setHash(11);
  updated.setHasTier(true);
  updated.setTier(s::Tier::HOST);
  events[4].setCleared();
  auto load = batch.initLoad();
  load.setActiveRequests(3);
  load.setPrefillTokensPerSecond(12345.5f);

  auto msg = RoundTrip<s::EventBatch>(b);
  auto r = msg->Root<s::EventBatch>();
  CHECK(std::string(r.getWorkerId().cStr()) == "w-1");
  CHECK(r.getEpoch() == 0xdeadbeefcafef00dULL);
  CHECK(r.getSeq() == 42);
  CHECK(r.getCreatedNs() == 1'700'000'000'000'000'000LL);
  REQUIRE(r.getEvents().size() == 5);
  CHECK(r.getEvents()[0].isCreated());
  CHECK(r.getEvents()[0].getCreated().getBlocksPerTier()[1] == 16384);
  auto rs = r.getEvents()[1];
  CHECK(rs.getWindowSize() == 4096);
  REQUIRE(rs.isStored());
  CHECK(rs.getStored().getParentHash() == 7);
  CHECK(rs.getStored().getBlocks()[0].getPriority() == 100);
  CHECK(rs.getStored().getBlocks()[0].getTokens()[2] == 128255);
  CHECK(rs.getStored().getBlocks()[1].getTier() == s::Tier::HOST);
  CHECK(r.getEvents()[2].getRemoved().getHashes()[0] == 12);
  CHECK(r.getEvents()[3].getUpdated().getHasTier());
  CHECK_FALSE(r.getEvents()[3].getUpdated().getHasPriority());
  CHECK(r.getEvents()[4].isCleared());
  CHECK(r.getLoad().getActiveRequests() == 3);
  CHECK(r.getLoad().getPrefillTokensPerSecond() == 12345.5f);
}

TEST_CASE("replay requests and both kinds of replay reply round-trip") {
  {
    capnp::MallocMessageBuilder b;
    auto q = b.initRoot<s::ReplayRequest>();
    q.setEpoch(9);
    q.setFromSeq(1000);
    auto m = RoundTrip<s::ReplayRequest>(b);
    CHECK(m->Root<s::ReplayRequest>().getFromSeq() == 1000);
  }
  {
    capnp::MallocMessageBuilder b;
    auto rep = b.initRoot<s::ReplayReply>();
    rep.setEpoch(9);
    rep.setLast(true);
    auto snap = rep.initSnapshot();
    snap.setConsistentSeq(77);
    snap.initEvents(1)[0].initStored().setParentHash(0);
    auto m = RoundTrip<s::ReplayReply>(b);
    auto r = m->Root<s::ReplayReply>();
    CHECK(r.getLast());
    REQUIRE(r.isSnapshot());
    CHECK(r.getSnapshot().getConsistentSeq() == 77);
  }
  {
    capnp::MallocMessageBuilder b;
    auto rep = b.initRoot<s::ReplayReply>();
    rep.initBatches(2)[1].setSeq(5);
    auto m = RoundTrip<s::ReplayReply>(b);
    REQUIRE(m->Root<s::ReplayReply>().isBatches());
    CHECK(m->Root<s::ReplayReply>().getBatches()[1].getSeq() == 5);
  }
}

TEST_CASE("Generate with sampling and retention round-trips, and schema defaults hold") {
  capnp::MallocMessageBuilder b;
  auto gen = b.initRoot<s::ToWorker>().initGenerate();
  gen.setRequestId(123);
  auto toks = gen.initTokens(4);
  for (uint32_t i = 0; i < 4; ++i) toks.set(i, 100 + i);
  auto ret = gen.initRetention();
  auto ranges = ret.initRanges(1);
  ranges[0].setStart(0);
  ranges[0].setEnd(1000);
  ranges[0].setHasEnd(true);
  ranges[0].setPriority(100);
  ranges[0].setDurationMs(30'000);
  ranges[0].setHasDuration(true);
  ret.setDecodePriority(10);
  ret.setHasDecodePriority(true);
  gen.setCacheSalt("tenant");
  auto m = RoundTrip<s::ToWorker>(b);
  auto r = m->Root<s::ToWorker>();
  REQUIRE(r.isGenerate());
  auto g = r.getGenerate();
  CHECK(g.getRequestId() == 123);
  CHECK(g.getTokens()[3] == 103);
  CHECK(g.getRetention().getRanges()[0].getEnd() == 1000);
  CHECK(g.getRetention().getRanges()[0].getDurationMs() == 30'000);
  CHECK(g.getRetention().getDecodePriority() == 10);
  CHECK(std::string(g.getCacheSalt().cStr()) == "tenant");
  // Sampling was never initialised: the schema defaults apply.
  CHECK(g.getSampling().getTemperature() == 1.0f);
  CHECK(g.getSampling().getTopP() == 1.0f);
  CHECK(g.getSampling().getMaxTokens() == 16);
}

TEST_CASE("Cancel, Delta, Error, Hello and Bye round-trip") {
  {
    capnp::MallocMessageBuilder b;
    b.initRoot<s::ToWorker>().initCancel().setRequestId(5);
    auto m = RoundTrip<s::ToWorker>(b);
    CHECK(m->Root<s::ToWorker>().getCancel().getRequestId() == 5);
  }
  {
    capnp::MallocMessageBuilder b;
    auto d = b.initRoot<s::FromWorker>().initDelta();
    d.setRequestId(5);
    d.initTokens(1).set(0, 77);
    d.setFinishReason(s::FinishReason::LENGTH);
    d.initUsage().setCachedDeviceTokens(4000);
    auto m = RoundTrip<s::FromWorker>(b);
    auto r = m->Root<s::FromWorker>().getDelta();
    CHECK(r.getFinishReason() == s::FinishReason::LENGTH);
    CHECK(r.getUsage().getCachedDeviceTokens() == 4000);
  }
  {
    capnp::MallocMessageBuilder b;
    auto e = b.initRoot<s::FromWorker>().initError();
    e.setRequestId(6);
    e.setCode(s::ErrorCode::CONTEXT_TOO_LONG);
    e.setMessage("prompt of 9000 tokens exceeds the context of 8192");
    auto m = RoundTrip<s::FromWorker>(b);
    CHECK(m->Root<s::FromWorker>().getError().getCode() == s::ErrorCode::CONTEXT_TOO_LONG);
  }
  {
    capnp::MallocMessageBuilder b;
    auto h = b.initRoot<s::ToRouter>().initHello();
    h.setWorkerId("gpu-0");
    h.setBlockSize(32);
    h.initEndpoints().setEvents("tcp://10.0.0.1:5557");
    auto tiers = h.initTiers(2);
    tiers[1].setTier(s::Tier::HOST);
    tiers[1].setTotalBlocks(1 << 20);
    auto m = RoundTrip<s::ToRouter>(b);
    auto r = m->Root<s::ToRouter>().getHello();
    CHECK(r.getBlockSize() == 32);
    CHECK(std::string(r.getEndpoints().getEvents().cStr()) == "tcp://10.0.0.1:5557");
    CHECK(r.getTiers()[1].getTotalBlocks() == (1u << 20));
  }
  {
    capnp::MallocMessageBuilder b;
    b.initRoot<s::ToRouter>().initBye().setWorkerId("gpu-0");
    auto m = RoundTrip<s::ToRouter>(b);
    CHECK(m->Root<s::ToRouter>().isBye());
  }
}

TEST_CASE("empty, unaligned, truncated and random frames are errors, never crashes") {
  CHECK_FALSE(wire::Decode<s::EventBatch>("", 0).ok());
  CHECK_FALSE(wire::Decode<s::EventBatch>("abc", 3).ok());

  capnp::MallocMessageBuilder b;
  auto batch = b.initRoot<s::EventBatch>();
  batch.setWorkerId("w");
  batch.initEvents(3)[1].initStored().initBlocks(4);
  std::string good = wire::Encode(b);
  for (size_t cut = 8; cut < good.size(); cut += 8) {
    auto r = wire::Decode<s::EventBatch>(good.data(), cut);
    CHECK_FALSE(r.ok());
    if (!r.ok()) CHECK(r.status().code() == StatusCode::kDataLoss);
  }

  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = good;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    auto r = wire::Decode<s::EventBatch>(bytes.data(), bytes.size());
    if (r.ok()) {
      // A frame that passes Decode may still hold a mistyped field: reading it inside
      // Guard gives a Status instead of an exception.
      Status st = wire::Guard([&] {
        auto root = (*r)->Root<s::EventBatch>();
        (void)root.getWorkerId();
        for (auto e : root.getEvents()) {
          if (e.isStored()) {
            for (auto blk : e.getStored().getBlocks()) (void)blk.getTokens().size();
          }
        }
        return Status::Ok();
      });
      if (!st.ok()) CHECK(st.code() == StatusCode::kDataLoss);
    }
    std::string junk(8 * (1 + rng() % 32), '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    (void)wire::Decode<s::ToWorker>(junk.data(), junk.size());
  }
}
