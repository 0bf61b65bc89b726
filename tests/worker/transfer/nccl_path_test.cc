// TransferService's NCCL answers (nccl_path.cc): the holder's `nccl` frame and its Released
// report, the receiver's checks, and answers it cannot receive reported as spent
// communicators. The NCCL transfer itself is the engines' (tests/gpu/cuda_kv_transfer_test.cc).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <zmq.hpp>

#include "tests/worker/transfer/transfer_test_util.h"

namespace kvfleet::transfer {
namespace {

using namespace testing;

// A pull from a receiver that can receive by NCCL.
PullRequest NcclChain(size_t n, uint64_t comm = 0) {
  PullRequest r = Chain(n);
  r.nccl = true;
  r.nccl_comm = comm;
  return r;
}

// The answer a holder's engine would give `r`: its first `n` blocks, on a new communicator 77.
NcclRun Nccl(const PullRequest& r, size_t n) {
  NcclRun run;
  run.comm = 77;
  run.unique_id = std::string(config::kNcclUniqueIdBytes, 'u');
  for (const Block& b : Blocks(r, n)) run.blocks.push_back(DeviceBlock{b.index, b.hash, b.tokens, {}});
  return run;
}

TEST_CASE("NCCL: an nccl answer reaches the receiver as sent, and the holder learns that its frame left") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", NcclChain(3));
  IncomingPull in = AwaitPull(*holder);
  CHECK(in.request.nccl);
  CHECK(in.request.nccl_comm == 0);
  CHECK(in.request.host_id.empty());
  const NcclRun run = Nccl(in.request, 2);
  holder->ServeNccl(in.peer_token, id, run);
  PullResult r = AwaitResult(*receiver, id);
  REQUIRE_MESSAGE(r.outcome == PullOutcome::kOk, r.status.ToString());
  REQUIRE(r.nccl.has_value());
  CHECK(*r.nccl == run);
  CHECK_FALSE(r.device.has_value());
  CHECK_FALSE(r.nccl_abandoned);
  CHECK(r.streamed_blocks == 0);
  CHECK(r.bytes == 2 * 256);
  const std::vector<Released> released = AwaitReleases(*holder);
  REQUIRE(released.size() == 1);
  CHECK(released[0].nccl);
  CHECK_FALSE(released[0].expired);  // sent: the engine sends the run now
  CHECK(released[0].transfer_id == id);
  CHECK(released[0].peer_token == in.peer_token);

  // The next pull names the communicator; the holder reuses it (no unique id).
  const uint64_t second = receiver->StartPull(holder->endpoint(), "", NcclChain(3, 77));
  in = AwaitPull(*holder);
  CHECK(in.request.nccl_comm == 77);
  NcclRun reuse = Nccl(in.request, 3);
  reuse.unique_id.clear();
  holder->ServeNccl(in.peer_token, second, reuse);
  r = AwaitResult(*receiver, second);
  REQUIRE_MESSAGE(r.outcome == PullOutcome::kOk, r.status.ToString());
  CHECK(*r.nccl == reuse);
  receiver->RecordNcclCopy(holder->endpoint(), 3 * 256, 0.25);
  const SourceStats src = receiver->Stats().pulls.at(holder->endpoint());
  CHECK(src.ok == 2);
  CHECK(src.nccl == 2);
  CHECK(src.device == 0);
  CHECK(src.blocks == 5);
  CHECK(src.nccl_copy_bytes == 3 * 256);
  CHECK(src.nccl_copy_seconds == doctest::Approx(0.25));
  CHECK(AwaitReleases(*holder).size() == 1);
  const TransferStats hs = holder->Stats();
  CHECK(hs.served_nccl == 2);
  CHECK(hs.served == 0);
  CHECK(hs.served_device == 0);
}

TEST_CASE("NCCL: an nccl run a pull did not offer, or that does not answer it, is refused malformed and not sent") {
  auto holder = Make();
  auto receiver = Make();
  auto serve_bad = [&](const PullRequest& request, auto&& spoil) {
    const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
    IncomingPull in = AwaitPull(*holder);
    NcclRun run = Nccl(in.request, 2);
    spoil(run);
    holder->ServeNccl(in.peer_token, id, run);
    const PullResult r = AwaitResult(*receiver, id);
    CHECK(r.outcome == PullOutcome::kRefused);
    CHECK(r.refusal == RefusalReason::kMalformed);
    CHECK_FALSE(r.nccl_abandoned);  // no nccl frame left the holder: nothing follows it
    const std::vector<Released> released = AwaitReleases(*holder);
    REQUIRE(released.size() == 1);
    CHECK(released[0].nccl);
    CHECK(released[0].expired);
  };
  serve_bad(Chain(3), [](NcclRun&) {});                                     // the receiver offered no NCCL
  serve_bad(NcclChain(3), [](NcclRun& run) { run.unique_id.clear(); });     // a communicator it does not have
  serve_bad(NcclChain(3, 5), [](NcclRun& run) { run.unique_id.clear(); });  // another one than it named
  serve_bad(NcclChain(3), [](NcclRun& run) { run.blocks[1].hash ^= 1; });
  CHECK(holder->Stats().served_nccl == 0);
}

TEST_CASE("NCCL: a faulty nccl answer fails the pull malformed and spends the communicator") {
  zmq::context_t context;
  zmq::socket_t fake(context, zmq::socket_type::router);
  fake.set(zmq::sockopt::rcvtimeo, 10'000);
  fake.set(zmq::sockopt::linger, 0);
  fake.bind("tcp://127.0.0.1:0");
  const std::string endpoint = fake.get(zmq::sockopt::last_endpoint);
  auto receiver = Make();
  auto answer = [&](const PullRequest& request, auto&& spoil) {
    const uint64_t id = receiver->StartPull(endpoint, "", request);
    zmq::message_t identity, body;
    REQUIRE(fake.recv(identity, zmq::recv_flags::none));
    REQUIRE(fake.recv(body, zmq::recv_flags::none));
    auto decoded = DecodePullRequest(body.data(), body.size());
    REQUIRE(decoded.ok());
    NcclRun run = Nccl(*decoded, 2);
    spoil(run);
    fake.send(zmq::buffer(identity.to_string()), zmq::send_flags::sndmore);
    fake.send(zmq::buffer(EncodeNcclRun(id, run)));
    return AwaitResult(*receiver, id);
  };
  PullResult r = answer(NcclChain(3), [](NcclRun& run) { run.blocks[0].tokens.pop_back(); });
  CHECK(r.outcome == PullOutcome::kMalformed);
  CHECK(r.nccl_abandoned);
  CHECK_FALSE(r.nccl.has_value());
  CHECK(r.source == endpoint);
  // An nccl answer to a pull that never offered NCCL: malformed too, and the holder's
  // communicator, whatever it is, is not this receiver's to use.
  r = answer(Chain(3), [](NcclRun&) {});
  CHECK(r.outcome == PullOutcome::kMalformed);
  CHECK(r.nccl_abandoned);
  // A good one still passes after them.
  r = answer(NcclChain(3), [](NcclRun&) {});
  CHECK(r.outcome == PullOutcome::kOk);
  CHECK_FALSE(r.nccl_abandoned);
  CHECK(receiver->Stats().pulls.at(endpoint).by_outcome[static_cast<size_t>(PullOutcome::kMalformed)] == 2);
}

TEST_CASE("NCCL: an nccl answer after its pull ended is reported spent, once, and not counted as a pull") {
  auto holder = Make();
  ManualClock clock;
  auto receiver = Make({}, &clock);
  PullRequest request = NcclChain(2);
  request.deadline_ms = 1'000;
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  PullResult r = AwaitResult(*receiver, id, &clock);
  CHECK(r.outcome == PullOutcome::kDeadline);
  CHECK_FALSE(r.nccl_abandoned);
  // The holder's clock has not reached the deadline: it answers, and will send the run.
  holder->ServeNccl(in.peer_token, id, Nccl(in.request, 2));
  CHECK_FALSE(AwaitReleases(*holder)[0].expired);
  r = AwaitResult(*receiver, id);
  CHECK(r.outcome == PullOutcome::kCancelled);
  CHECK(r.nccl_abandoned);
  CHECK(r.source == holder->endpoint());
  const TransferStats rs = receiver->Stats();
  CHECK(rs.late_nccl == 1);
  CHECK(rs.late_frames == 1);
  const SourceStats& src = rs.pulls.at(holder->endpoint());
  CHECK(src.by_outcome[static_cast<size_t>(PullOutcome::kDeadline)] == 1);
  CHECK(src.by_outcome[static_cast<size_t>(PullOutcome::kCancelled)] == 0);
  CHECK(receiver->TakeResults().empty());
}

TEST_CASE("NCCL: a ServeNccl past the holder's deadline, or after Stop, is reported not sent") {
  ManualClock holder_clock;
  auto holder = Make({}, &holder_clock);
  auto receiver = Make();
  PullRequest request = NcclChain(2);
  request.deadline_ms = 1'000;
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  holder_clock.AdvanceMs(1'001);
  holder->ServeNccl(in.peer_token, id, Nccl(in.request, 2));
  std::vector<Released> released = AwaitReleases(*holder);
  REQUIRE(released.size() == 1);
  CHECK(released[0].nccl);
  CHECK(released[0].expired);
  CHECK(holder->Stats().stale_serves == 1);
  CHECK(holder->Stats().served_nccl == 0);

  holder->Stop();
  holder->ServeNccl(in.peer_token, id + 1, Nccl(in.request, 1));
  released = holder->TakeReleases();
  REQUIRE(released.size() == 1);
  CHECK(released[0].transfer_id == id + 1);
  CHECK(released[0].nccl);
  CHECK(released[0].expired);
}

}  // namespace
}  // namespace kvfleet::transfer
