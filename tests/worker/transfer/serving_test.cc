// TransferService's streamed serves (serving.cc, ServeFrame): a run handed over a frame's chunk
// at a time arrives whole, each chunk's buffer comes back, and exactly one Released{stream}
// says when the engine may unpin: after the last frame left, or at once when the stream was
// cut (the receiver gone, the deadline passed, Stop, a chunk breaking Contract 4). Waits are
// bounded; nothing here measures time, and the deadline cases move a ManualClock.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "tests/worker/transfer/transfer_test_util.h"
#include "worker/transfer/transfer_service.h"

namespace kvfleet::transfer {
namespace {

using namespace testing;

// The stream releases `holder` reported so far, with the spent frames counted into `spent`.
std::vector<Released> StreamReleases(TransferService& holder, size_t* spent) {
  for (const SpentFrame& f : holder.TakeSpentFrames()) {
    CHECK(f.transfer_id != 0);
    ++*spent;
  }
  std::vector<Released> out;
  for (const Released& r : holder.TakeReleases()) {
    CHECK(r.stream);
    out.push_back(r);
  }
  return out;
}

// Waits until `holder` has given back `want` spent frames in all; collects stream releases.
void AwaitSpent(TransferService& holder, size_t want, size_t* spent, std::vector<Released>* released,
                ManualClock* clock = nullptr) {
  for (int i = 0; i < kWaitRounds && *spent < want; ++i) {
    for (const Released& r : StreamReleases(holder, spent)) released->push_back(r);
    if (*spent >= want) break;
    if (clock != nullptr) clock->AdvanceMs(100);
    holder.WaitForWork(kWaitStep);
  }
  REQUIRE(*spent >= want);
}

std::vector<Released> AwaitStreamEnd(TransferService& holder, size_t* spent, ManualClock* clock = nullptr) {
  std::vector<Released> released;
  for (int i = 0; i < kWaitRounds && released.empty(); ++i) {
    released = StreamReleases(holder, spent);
    if (!released.empty()) break;
    if (clock != nullptr) clock->AdvanceMs(100);
    holder.WaitForWork(kWaitStep);
  }
  REQUIRE(released.size() == 1);
  return released;
}

TEST_CASE("a streamed run arrives whole in several frames, and is released only once its last frame left") {
  auto holder = Make();
  auto receiver = Make();
  // 11 blocks of 3 MiB: five to a frame (BlocksPerFrame), handed over as 5, 5 and 1.
  const uint64_t block_bytes = uint64_t{3} << 20;
  const PullRequest request = Chain(11, block_bytes);
  REQUIRE(BlocksPerFrame(request.layout) == 5);
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  size_t spent = 0;
  std::vector<Released> released;
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 0, 5, false));
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 5, 5, false));
  AwaitSpent(*holder, 2, &spent, &released);
  // Both frames encoded and their buffers back; the run is not over until its last chunk.
  CHECK(released.empty());
  CHECK(holder->Stats().served == 0);
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 10, 1, true));
  released = AwaitStreamEnd(*holder, &spent);
  CHECK(released[0].peer_token == in.peer_token);
  CHECK(released[0].transfer_id == id);
  CHECK_FALSE(released[0].expired);
  CHECK(spent == 3);
  const TransferStats hs = holder->Stats();
  CHECK(hs.served == 1);  // counted with the release: `done` has left
  CHECK(hs.served_frames == 3);
  CHECK(hs.served_blocks == 11);
  CHECK(hs.served_bytes == 11 * block_bytes);
  CHECK(hs.cut_serves == 0);

  Pulled p = AwaitPulled(*receiver, id);
  REQUIRE_MESSAGE(p.result.outcome == PullOutcome::kOk, p.result.status.ToString());
  CHECK(p.result.streamed_blocks == 11);
  REQUIRE(p.blocks.size() == 11);
  for (uint32_t i = 0; i < 11; ++i) {
    CHECK(p.blocks[i].index == i);
    CHECK(p.blocks[i].hash == request.hashes[i]);
    CHECK(p.blocks[i].tokens[3] == i * 100 + 3);
    CHECK(p.blocks[i].data[0].front() == static_cast<std::byte>(i * 7 + 1));
    CHECK(p.blocks[i].data[0].back() == static_cast<std::byte>(i * 7 + 1));
  }
  CHECK(holder->TakeReleases().empty());  // exactly one
}

TEST_CASE("a stream the engine ends early sends done with the blocks it handed over") {
  auto holder = Make();
  auto receiver = Make();
  const PullRequest request = Chain(6);
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 0, 2, false));
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 2, 0, true));  // a read failed: no more
  size_t spent = 0;
  CHECK_FALSE(AwaitStreamEnd(*holder, &spent)[0].expired);
  Pulled p = AwaitPulled(*receiver, id);
  CHECK(p.result.outcome == PullOutcome::kOk);
  CHECK(p.result.streamed_blocks == 2);
  CHECK(p.blocks.size() == 2);
}

TEST_CASE("a stream whose receiver left is cut and released, and later chunks only come back") {
  auto holder = Make();
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 10'000);
  dealer.connect(holder->endpoint());
  PullRequest request = Chain(1000);
  request.transfer_id = 5;
  dealer.send(zmq::buffer(EncodePullRequest(request)), zmq::send_flags::none);
  IncomingPull in = AwaitPull(*holder);
  holder->ServeFrame(in.peer_token, 5, Chunk(in.request, 0, 1, false));
  zmq::message_t first;
  REQUIRE(dealer.recv(first, zmq::recv_flags::none));  // the first frame reached the receiver
  dealer.close();
  // One block a chunk until the holder finds the receiver gone (its frames cannot be sent).
  size_t spent = 0;
  std::vector<Released> released;
  uint32_t next = 1;
  for (int i = 0; i < kWaitRounds && released.empty(); ++i) {
    if (next < 999 && spent + 1 >= next) holder->ServeFrame(in.peer_token, 5, Chunk(in.request, next++, 1, false));
    released = StreamReleases(*holder, &spent);
    if (released.empty()) holder->WaitForWork(kWaitStep);
  }
  REQUIRE(released.size() == 1);
  CHECK(released[0].expired);
  CHECK(released[0].transfer_id == 5);
  AwaitStats(*holder, [](const TransferStats& s) { return s.cut_serves == 1; });
  CHECK(holder->Stats().served == 0);
  // A chunk the engine sent before it saw the release: its buffer comes back, nothing else.
  const size_t before = spent;
  holder->ServeFrame(in.peer_token, 5, Chunk(in.request, next, 1, true));
  AwaitSpent(*holder, before + 1, &spent, &released);
  CHECK(released.size() == 1);
}

TEST_CASE("a stream past its deadline is cut and released; one stale at its first chunk is released at once") {
  ManualClock clock;
  auto holder = Make({}, &clock);
  auto receiver = Make();
  PullRequest request = Chain(4);
  request.deadline_ms = 1'000;
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  size_t spent = 0;
  std::vector<Released> released;
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 0, 2, false));
  AwaitSpent(*holder, 1, &spent, &released);
  CHECK(released.empty());  // waiting for the engine's next chunk, still pinned
  clock.AdvanceMs(1'001);
  released = AwaitStreamEnd(*holder, &spent);
  CHECK(released[0].expired);
  CHECK(holder->Stats().cut_serves == 1);
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 2, 2, true));
  AwaitSpent(*holder, 2, &spent, &released);
  CHECK(released.size() == 1);

  const uint64_t stale = receiver->StartPull(holder->endpoint(), "", request);
  in = AwaitPull(*holder);
  clock.AdvanceMs(1'001);
  holder->ServeFrame(in.peer_token, stale, Chunk(in.request, 0, 2, false));
  released = AwaitStreamEnd(*holder, &spent);
  CHECK(released[0].expired);
  CHECK(released[0].transfer_id == stale);
  CHECK(spent == 3);
  CHECK(holder->Stats().stale_serves == 1);
  CHECK(holder->Stats().served == 0);
}

TEST_CASE("Stop cuts a stream and releases it; a stream's first chunk after Stop is released at once") {
  auto holder = Make();
  auto receiver = Make();
  const PullRequest request = Chain(4);
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  const uint64_t second = receiver->StartPull(holder->endpoint(), "", request);
  std::vector<IncomingPull> in;
  for (int i = 0; i < kWaitRounds && in.size() < 2; ++i) {
    for (IncomingPull& p : holder->TakePulls()) in.push_back(std::move(p));
    if (in.size() < 2) holder->WaitForWork(kWaitStep);
  }
  REQUIRE(in.size() == 2);
  size_t spent = 0;
  std::vector<Released> released;
  holder->ServeFrame(in[0].peer_token, in[0].request.transfer_id, Chunk(in[0].request, 0, 2, false));
  AwaitSpent(*holder, 1, &spent, &released);
  holder->Stop();
  released = StreamReleases(*holder, &spent);
  REQUIRE(released.size() == 1);
  CHECK(released[0].expired);
  CHECK(released[0].transfer_id == in[0].request.transfer_id);
  // After Stop: a later chunk only comes back; a first chunk ends its stream at once.
  holder->ServeFrame(in[0].peer_token, in[0].request.transfer_id, Chunk(in[0].request, 2, 2, true));
  holder->ServeFrame(in[1].peer_token, in[1].request.transfer_id, Chunk(in[1].request, 0, 4, true));
  released = StreamReleases(*holder, &spent);
  REQUIRE(released.size() == 1);
  CHECK(released[0].expired);
  CHECK(released[0].transfer_id == in[1].request.transfer_id);
  CHECK(spent == 3);
  (void)id;
  (void)second;
}

TEST_CASE("a first chunk breaking Contract 4 refuses the pull malformed; a later one ends it with what was sent") {
  auto holder = Make();
  auto receiver = Make();
  const PullRequest request = Chain(6);
  uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  FrameChunk bad = Chunk(in.request, 0, 2, false);
  bad.hashes[1] = 77;
  holder->ServeFrame(in.peer_token, id, std::move(bad));
  size_t spent = 0;
  CHECK(AwaitStreamEnd(*holder, &spent)[0].expired);
  PullResult r = AwaitResult(*receiver, id);
  CHECK(r.outcome == PullOutcome::kRefused);
  CHECK(r.refusal == RefusalReason::kMalformed);

  id = receiver->StartPull(holder->endpoint(), "", request);
  in = AwaitPull(*holder);
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 0, 2, false));
  FrameChunk short_bytes = Chunk(in.request, 2, 2, false);
  short_bytes.bytes.resize(10);
  holder->ServeFrame(in.peer_token, id, std::move(short_bytes));
  holder->ServeFrame(in.peer_token, id, Chunk(in.request, 4, 2, true));  // dropped with the stream's end
  CHECK_FALSE(AwaitStreamEnd(*holder, &spent)[0].expired);
  const Pulled p = AwaitPulled(*receiver, id);
  CHECK(p.result.outcome == PullOutcome::kOk);
  CHECK(p.result.streamed_blocks == 2);
  CHECK(p.blocks.size() == 2);
  std::vector<Released> none;
  AwaitSpent(*holder, 4, &spent, &none);
  CHECK(none.empty());
}

}  // namespace
}  // namespace kvfleet::transfer
