// KvPulls' NCCL path (kv_pulls_nccl.cc) on two mock engines and two TransferServices over
// loopback, their KvNccl ends joined by a fake wire: a transfer moves when both sides have
// queued their halves, in order, on one communicator, as NCCL pairs a send with the next
// receive. The wire fails the test if a send would pair with a receive of another run (the
// order the real thing cannot check). The bytes are the GPU test's (tests/gpu/cuda_kv_transfer_test.cc).
#include <doctest/doctest.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/worker/engine/engine_harness.h"
#include "worker/server/kv_pulls.h"

namespace kvfleet::server {
namespace {

using engine::testing::Harness;
using engine::testing::kBlock;

// Two KvNccl ends, side 0 the holder's and side 1 the receiver's.
struct FakeWire {
  struct Half {
    backend::KvNccl::Transfer t;
  };
  std::deque<Half> queued[2];
  std::vector<backend::KvNccl::Done> done[2];
  std::map<std::string, int> joined;  // unique id -> sides that created a communicator from it
  int inits = 0;                      // communicators both sides created
  int moved = 0;                      // runs moved
  bool fail_next = false;             // the next run fails on both sides (a timeout)
  bool paused = false;                // halves queue and nothing moves

  // Pairs the oldest half of each side while both are there.
  void Match() {
    while (!paused && !queued[0].empty() && !queued[1].empty()) {
      const Half s = queued[0].front(), r = queued[1].front();
      queued[0].pop_front();
      queued[1].pop_front();
      REQUIRE(s.t.send);
      REQUIRE_FALSE(r.t.send);
      CHECK(s.t.comm == r.t.comm);
      CHECK(s.t.unique_id == r.t.unique_id);
      if (!s.t.unique_id.empty()) ++inits;
      // A send pairs with a receive of the same run: as many blocks per pool.
      REQUIRE(s.t.blocks.size() == r.t.blocks.size());
      for (size_t p = 0; p < s.t.blocks.size(); ++p) CHECK(s.t.blocks[p].size() == r.t.blocks[p].size());
      const Status st = fail_next ? Status{StatusCode::kDeadlineExceeded, "the fake wire timed out"} : Status::Ok();
      fail_next = false;
      if (st.ok()) ++moved;
      done[0].push_back({s.t.id, st, st.ok() ? 1u : 0u, 0.001});
      done[1].push_back({r.t.id, st, st.ok() ? 1u : 0u, 0.001});
    }
  }
};

class FakeKvNccl final : public backend::KvNccl {
 public:
  FakeKvNccl(FakeWire* wire, int side) : wire_(wire), side_(side) {}
  Result<std::string> NewUniqueId() override {
    return std::string(transfer::config::kNcclUniqueIdBytes, static_cast<char>('a' + ids_++));
  }
  uint64_t CommFor(const std::string& peer) const override {
    auto it = comm_.find(peer);
    return it == comm_.end() ? 0 : it->second;
  }
  void Submit(Transfer t) override {
    if (!t.unique_id.empty()) comm_[t.peer] = t.comm;
    if (t.unique_id.empty() && CommFor(t.peer) != t.comm) {  // a communicator this side no longer has
      wire_->done[side_].push_back({t.id, FailedPrecondition("no such communicator"), 0, 0});
      return;
    }
    wire_->queued[side_].push_back({std::move(t)});
    wire_->Match();
  }
  std::vector<Done> TakeDone() override {
    std::vector<Done> out;
    out.swap(wire_->done[side_]);
    for (const Done& d : out) {
      if (!d.status.ok()) comm_.clear();  // a failed transfer aborts the communicator
    }
    return out;
  }
  void Forget(const std::string& peer) override { comm_.erase(peer); ++forgotten; }
  int forgotten = 0;

 private:
  FakeWire* wire_;
  int side_;
  int ids_ = 0;
  std::map<std::string, uint64_t> comm_;
};

std::unique_ptr<transfer::TransferService> StartService() {
  auto s = transfer::TransferService::Start({}, SystemClock::Default());
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return std::move(*s);
}

// A holder and a receiver: each a mock engine, a TransferService and its KvPulls.
struct Pair {
  explicit Pair(bool holder_nccl = true, DurationNs holder_idle = server::config::kNcclPeerIdle) {
    holder_service = StartService();
    receiver_service = StartService();
    KvPullsOptions o;
    o.nccl_peer_idle = holder_idle;
    o.model = "mock-8b";
    o.deadline = 5 * kNsPerSec;
    o.own_endpoint = holder_service->endpoint();
    holder = std::make_unique<KvPulls>(o, holder_service.get(), a.kv.get(), a.backend.get(), a.engine.get(),
                                       holder_nccl ? &holder_nccl_end : nullptr);
    o.own_endpoint = receiver_service->endpoint();
    o.nccl_peer_idle = server::config::kNcclPeerIdle;
    receiver = std::make_unique<KvPulls>(o, receiver_service.get(), b.kv.get(), b.backend.get(), b.engine.get(),
                                         &receiver_nccl_end);
  }

  std::vector<TokenId> Prompt(TokenId first) const {
    std::vector<TokenId> p(6 * kBlock + 3);
    for (size_t i = 0; i < p.size(); ++i) p[i] = first + static_cast<TokenId>(i);
    return p;
  }

  // The holder computes `prompt`; the receiver pulls its 6 whole blocks and waits for the pull.
  void PullOnce(const std::vector<TokenId>& prompt) {
    a.Add(prompt, 1);
    a.RunToCompletion();
    engine::GenerateRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 1;
    auto id = b.engine->Add(r, b.clock.Now());
    REQUIRE(id.ok());
    receiver->Start(*id, r, PullHint{holder_service->endpoint(), "", 6, "a"});
    for (int i = 0; i < 2000 && receiver->pending() > 0; ++i) {
      holder->Poll();
      receiver->Poll();
      receiver_service->WaitForWork(kNsPerMs);
    }
    REQUIRE(receiver->pending() == 0);
    for (int i = 0; i < 200 && holder->stats().nccl_held > 0; ++i) {
      holder_service->WaitForWork(kNsPerMs);
      holder->Poll();
    }
    // b's engine is not run: the mock (verify_kv) would see pulled blocks nothing wrote.
  }

  Harness a, b;
  FakeWire wire;
  FakeKvNccl holder_nccl_end{&wire, 0}, receiver_nccl_end{&wire, 1};
  std::unique_ptr<transfer::TransferService> holder_service, receiver_service;
  std::unique_ptr<KvPulls> holder, receiver;
};

TEST_CASE("NCCL pulls: the run moves by NCCL, the pair's communicator is set up once and reused, and pins end") {
  Pair p;
  REQUIRE(p.receiver->nccl());
  p.PullOnce(p.Prompt(1000));
  CHECK(p.receiver->stats().nccl_pulls == 1);
  CHECK(p.receiver->stats().imported_blocks == 6);
  CHECK(p.receiver->stats().fallbacks.empty());
  CHECK(p.holder->stats().nccl_served == 1);
  CHECK(p.holder->stats().nccl_held == 0);  // unpinned once the send ended
  CHECK(p.wire.inits == 1);
  CHECK(p.wire.moved == 1);
  const transfer::SourceStats src = p.receiver_service->Stats().pulls.at(p.holder_service->endpoint());
  CHECK(src.nccl == 1);
  CHECK(src.device == 0);
  CHECK(src.nccl_copy_bytes == 1);  // what the wire said it moved
  // The load reports' pull totals (Contract 2's Load.pulls): the holder's, once, with the
  // receive's time in them.
  std::vector<PullTotals> totals = p.receiver->TakeChangedPullTotals();
  REQUIRE(totals.size() == 1);
  CHECK(totals[0].source == p.holder_service->endpoint());
  CHECK(totals[0].pulls == 1);
  CHECK(totals[0].seconds > 0);
  CHECK(totals[0].bytes == 6 * p.receiver->layout()->BytesPerBlock());
  CHECK(p.receiver->TakeChangedPullTotals().empty());
  CHECK(p.holder->TakeChangedPullTotals().empty());  // it pulled nothing

  p.PullOnce(p.Prompt(5000));  // another prompt: the same communicator
  CHECK(p.receiver->stats().nccl_pulls == 2);
  CHECK(p.receiver->stats().imported_blocks == 12);
  CHECK(p.wire.inits == 1);
  CHECK(p.wire.moved == 2);
  CHECK(p.holder->stats().nccl_held == 0);
  totals = p.receiver->TakeChangedPullTotals();
  REQUIRE(totals.size() == 1);
  CHECK(totals[0].pulls == 2);
}

TEST_CASE("NCCL pulls: a pull mid-receive is not in the load report's totals until its receive ends") {
  Pair p;
  const std::vector<TokenId> prompt = p.Prompt(1000);
  p.a.Add(prompt, 1);
  p.a.RunToCompletion();
  engine::GenerateRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 1;
  auto id = p.b.engine->Add(r, p.b.clock.Now());
  REQUIRE(id.ok());
  p.receiver->Start(*id, r, PullHint{p.holder_service->endpoint(), "", 6, "a"});
  p.wire.paused = true;  // the run does not move until the test says
  for (int i = 0; i < 2000 && p.wire.queued[1].empty(); ++i) {
    p.holder->Poll();
    p.receiver->Poll();
    p.receiver_service->WaitForWork(kNsPerMs);
  }
  REQUIRE(p.wire.queued[1].size() == 1);  // the receive, posted and not done
  CHECK(p.receiver_service->Stats().pulls.at(p.holder_service->endpoint()).ok == 1);
  CHECK(p.receiver->TakeChangedPullTotals().empty());
  p.wire.paused = false;
  p.wire.Match();
  for (int i = 0; i < 2000 && p.receiver->pending() > 0; ++i) {
    p.holder->Poll();
    p.receiver->Poll();
    p.receiver_service->WaitForWork(kNsPerMs);
  }
  REQUIRE(p.receiver->pending() == 0);
  const std::vector<PullTotals> totals = p.receiver->TakeChangedPullTotals();
  REQUIRE(totals.size() == 1);
  CHECK(totals[0].pulls == 1);
}

TEST_CASE("NCCL pulls: pulls seconds apart reuse the pair's communicator") {
  // The holder's TransferService recycles a connection's peer token a second after its last
  // pull; the communicator is the receiver's, kept by its connection, not by the token.
  Pair p;
  p.PullOnce(p.Prompt(1000));
  REQUIRE(p.wire.inits == 1);
  const TimeNs until = SystemClock::Default()->Now() + 2200 * kNsPerMs;  // two of the service's sweeps
  while (SystemClock::Default()->Now() < until) {
    p.holder_service->WaitForWork(50 * kNsPerMs);
    p.holder->Poll();
    p.receiver->Poll();
  }
  p.PullOnce(p.Prompt(5000));
  CHECK(p.receiver->stats().nccl_pulls == 2);
  CHECK(p.wire.inits == 1);
  CHECK(p.holder_nccl_end.forgotten == 0);
  CHECK(p.holder->stats().nccl_peers == 1);
  CHECK(p.receiver->stats().nccl_peers == 1);
}

TEST_CASE("NCCL pulls: a holder lets an idle communicator go, and the pair's next pull sets up a new one") {
  Pair p(/*holder_nccl=*/true, /*holder_idle=*/200 * kNsPerMs);
  p.PullOnce(p.Prompt(1000));
  REQUIRE(p.wire.inits == 1);
  for (int i = 0; i < 100 && p.holder->stats().nccl_peers > 0; ++i) {
    p.holder_service->WaitForWork(20 * kNsPerMs);
    p.holder->Poll();
  }
  CHECK(p.holder->stats().nccl_peers == 0);
  CHECK(p.holder->stats().nccl_peers_forgotten == 1);
  CHECK(p.holder_nccl_end.forgotten == 1);
  CHECK(p.receiver->stats().nccl_peers == 1);  // the receiver still keeps its side
  // The receiver names the communicator it keeps; the holder has none and answers with a new
  // one, which the receiver takes in its place: no pull waits for a half that never comes.
  p.PullOnce(p.Prompt(5000));
  CHECK(p.receiver->stats().nccl_pulls == 2);
  CHECK(p.receiver->stats().fallbacks.empty());
  CHECK(p.wire.inits == 2);
  CHECK(p.holder->stats().nccl_peers == 1);
}

TEST_CASE("NCCL pulls: a failed transfer costs that prefix only, and the pair's next pull sets up a new communicator") {
  Pair p;
  p.PullOnce(p.Prompt(1000));
  REQUIRE(p.wire.inits == 1);
  p.wire.fail_next = true;
  p.PullOnce(p.Prompt(3000));
  CHECK(p.receiver->stats().fallbacks.at("nccl_failed") == 1);
  CHECK(p.receiver->stats().imported_blocks == 6);  // the first pull's only
  CHECK(p.holder->stats().nccl_send_failures == 1);
  CHECK(p.holder->stats().nccl_held == 0);
  p.PullOnce(p.Prompt(7000));
  CHECK(p.receiver->stats().nccl_pulls == 2);
  CHECK(p.receiver->stats().imported_blocks == 12);
  CHECK(p.wire.inits == 2);  // a new one
}

TEST_CASE("NCCL pulls: a holder without NCCL answers with bytes, and nothing goes by NCCL") {
  Pair p(/*holder_nccl=*/false);
  p.PullOnce(p.Prompt(1000));
  CHECK(p.receiver->stats().nccl_pulls == 0);
  CHECK(p.receiver->stats().imported_blocks == 6);
  CHECK(p.holder->stats().served_requests == 1);
  CHECK(p.holder->stats().nccl_served == 0);
  CHECK(p.wire.inits == 0);
  CHECK(p.receiver_service->Stats().pulls.at(p.holder_service->endpoint()).nccl == 0);
}

}  // namespace
}  // namespace kvfleet::server
