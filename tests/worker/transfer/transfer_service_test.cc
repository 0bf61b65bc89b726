// TransferService: two services in one process over loopback TCP, one holding (serving runs
// as the engine streams them: ServeRun), one pulling (its blocks taken as they arrive:
// AwaitPulled); raw sockets play broken peers. Waits are bounded; nothing here measures time,
// and the deadline and bandwidth cases move a ManualClock instead of sleeping.
#include "worker/transfer/transfer_service.h"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "schema/limits.h"
#include "tests/worker/transfer/transfer_test_util.h"

namespace kvfleet::transfer {
namespace {

using namespace testing;

TEST_CASE("a chain served in several frames arrives whole, checked, with its bytes") {
  auto holder = Make();
  auto receiver = Make();
  // 6 blocks of 12 MiB: 72 MiB, a frame each (over 16 MiB, two do not fit one: BlocksPerFrame).
  const uint64_t block_bytes = uint64_t{12} << 20;
  const PullRequest request = Chain(6, block_bytes);
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  CHECK(in.request.transfer_id == id);
  CHECK(in.request.hashes == request.hashes);
  CHECK(in.request.layout == request.layout);
  CHECK_FALSE(ServeRun(*holder, in, Blocks(in.request, 6)).expired);
  Pulled p = AwaitPulled(*receiver, id);
  const PullResult& r = p.result;
  REQUIRE_MESSAGE(r.outcome == PullOutcome::kOk, r.status.ToString());
  CHECK(r.streamed_blocks == 6);
  REQUIRE(p.blocks.size() == 6);
  for (uint32_t i = 0; i < 6; ++i) {
    CHECK(p.blocks[i].index == i);
    CHECK(p.blocks[i].hash == request.hashes[i]);
    CHECK(p.blocks[i].tokens[1] == i * 100 + 1);
    CHECK(p.blocks[i].data[0].size() == block_bytes);
    CHECK(p.blocks[i].data[0][block_bytes - 1] == static_cast<std::byte>(i * 7 + 1));
  }
  CHECK(r.bytes == 6 * block_bytes);
  CHECK(r.source == holder->endpoint());
  const TransferStats hs = holder->Stats();
  CHECK(hs.served == 1);
  CHECK(hs.served_frames == 6);
  CHECK(hs.served_blocks == 6);
  CHECK(hs.served_bytes == 6 * block_bytes);
  const TransferStats rs = receiver->Stats();
  REQUIRE(rs.pulls.count(holder->endpoint()) == 1);
  CHECK(rs.pulls.at(holder->endpoint()).ok == 1);
  CHECK(rs.pulls.at(holder->endpoint()).bytes == 6 * block_bytes);
}

TEST_CASE("a frame carries as many blocks as fit 16 MiB, at least one") {
  CHECK(BlocksPerFrame(Chain(1, uint64_t{3} << 20).layout) == 5);  // 15 MiB and the blocks' headers
  CHECK(BlocksPerFrame(Chain(1, uint64_t{4} << 20).layout) == 3);  // four would pass 16 MiB by their headers
  CHECK(BlocksPerFrame(Chain(1, uint64_t{12} << 20).layout) == 1);
  CHECK(BlocksPerFrame(Chain(1, uint64_t{40} << 20).layout) == 1);  // a block over 16 MiB goes alone
  // Tokens only (dtype none): as many as a pull may ask for.
  CHECK(BlocksPerFrame(Chain(1, 1 << 20, KvDtype::kNone).layout) == wire::limits::kMaxPullBlocks);
}

TEST_CASE("a holder that has only the chain's first blocks sends them: a shorter run, still ok") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", Chain(5));
  IncomingPull in = AwaitPull(*holder);
  ServeRun(*holder, in, Blocks(in.request, 2));
  Pulled p = AwaitPulled(*receiver, id);
  CHECK(p.result.outcome == PullOutcome::kOk);
  CHECK(p.result.streamed_blocks == 2);
  CHECK(p.blocks.size() == 2);
  CHECK(p.result.bytes == 2 * 256);

  const uint64_t none = receiver->StartPull(holder->endpoint(), "", Chain(5));
  in = AwaitPull(*holder);
  CHECK_FALSE(ServeRun(*holder, in, {}).expired);
  p = AwaitPulled(*receiver, none);
  CHECK(p.result.outcome == PullOutcome::kOk);
  CHECK(p.result.streamed_blocks == 0);
  CHECK(p.blocks.empty());
  CHECK(holder->Stats().served == 2);
  CHECK(holder->Stats().served_blocks == 2);
}

TEST_CASE("a refusal reaches the receiver with its reason and message") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", Chain(3));
  IncomingPull in = AwaitPull(*holder);
  holder->Refuse(in.peer_token, id, RefusalReason::kLayoutMismatch, "holder dtype fp8e4m3");
  PullResult r = AwaitResult(*receiver, id);
  CHECK(r.outcome == PullOutcome::kRefused);
  REQUIRE(r.refusal.has_value());
  CHECK(*r.refusal == RefusalReason::kLayoutMismatch);
  CHECK(r.status.message().find("holder dtype fp8e4m3") != std::string::npos);
  CHECK(r.streamed_blocks == 0);
  AwaitStats(*holder, [](const TransferStats& s) {
    return s.refused[static_cast<size_t>(RefusalReason::kLayoutMismatch)] == 1;
  });
}

// Sends `frames` as one message on a raw DEALER and returns the reply, if one comes.
std::optional<PullReply> RawExchange(zmq::socket_t& dealer, const std::vector<std::string>& frames, bool expect_reply) {
  for (size_t i = 0; i < frames.size(); ++i) {
    dealer.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  if (!expect_reply) return std::nullopt;
  zmq::message_t reply;
  REQUIRE(dealer.recv(reply, zmq::recv_flags::none));
  auto decoded = DecodePullReply(reply.data(), reply.size());
  REQUIRE(decoded.ok());
  return *decoded;
}

RefusalReason ReasonOf(const std::optional<PullReply>& reply) {
  REQUIRE(reply.has_value());
  REQUIRE(std::holds_alternative<Refusal>(reply->body));
  return std::get<Refusal>(reply->body).reason;
}

TEST_CASE("garbage on the holder's socket is refused or dropped, and the next good pull is served") {
  auto holder = Make();
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 10'000);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(holder->endpoint());

  RawExchange(dealer, {std::string("definitely not capnp")}, false);
  AwaitStats(*holder, [](const TransferStats& s) { return s.dropped_frames == 1; });

  PullRequest bad = Chain(2);
  bad.transfer_id = 11;
  bad.deadline_ms = 0;
  CHECK(ReasonOf(RawExchange(dealer, {EncodePullRequest(bad)}, true)) == RefusalReason::kMalformed);

  PullRequest two_frames = Chain(2);
  two_frames.transfer_id = 12;
  CHECK(ReasonOf(RawExchange(dealer, {EncodePullRequest(two_frames), "x"}, true)) == RefusalReason::kMalformed);

  PullRequest huge = Chain(2);
  huge.transfer_id = 13;
  huge.hashes.assign(wire::limits::kMaxPullBlocks + 1, 7);
  CHECK(ReasonOf(RawExchange(dealer, {EncodePullRequest(huge)}, true)) == RefusalReason::kTooLarge);
  CHECK(holder->TakePulls().empty());

  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", Chain(2));
  IncomingPull in = AwaitPull(*holder);
  ServeRun(*holder, in, Blocks(in.request, 2));
  CHECK(AwaitPulled(*receiver, id).blocks.size() == 2);
}

TEST_CASE("a holder that never answers: the pull ends at its deadline and late frames are dropped") {
  ManualClock holder_clock;
  auto holder = Make({}, &holder_clock);
  ManualClock clock;
  auto receiver = Make({}, &clock);
  PullRequest request = Chain(2);
  request.deadline_ms = 1'000;
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  PullResult r = AwaitResult(*receiver, id, &clock);  // moves the clock on while it waits
  CHECK(r.outcome == PullOutcome::kDeadline);
  CHECK(r.status.code() == StatusCode::kDeadlineExceeded);
  CHECK(r.elapsed >= 1'000 * kNsPerMs);
  // The holder's clock has not reached the deadline: it still sends, and the frames are dropped.
  CHECK_FALSE(ServeRun(*holder, in, Blocks(in.request, 2)).expired);
  AwaitStats(*receiver, [](const TransferStats& s) { return s.late_frames >= 1; });
  CHECK(receiver->TakeResults().empty());

  // Past its own view of the deadline the holder sends nothing.
  const uint64_t second = receiver->StartPull(holder->endpoint(), "", request);
  in = AwaitPull(*holder);
  holder_clock.AdvanceMs(1'001);
  CHECK(ServeRun(*holder, in, Blocks(in.request, 2)).expired);
  CHECK(holder->Stats().stale_serves == 1);
  CHECK(holder->Stats().served == 1);
  CHECK(in.request.transfer_id == second);
  CHECK(AwaitResult(*receiver, second, &clock).outcome == PullOutcome::kDeadline);
}

TEST_CASE("a corrupted block fails the whole pull and nothing is handed over") {
  TransferOptions corrupt;
  corrupt.test_corrupt_served_data = true;
  auto holder = Make(corrupt);
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", Chain(3));
  IncomingPull in = AwaitPull(*holder);
  ServeRun(*holder, in, Blocks(in.request, 3));
  Pulled p = AwaitPulled(*receiver, id);
  CHECK(p.result.outcome == PullOutcome::kBadChecksum);
  CHECK(p.result.status.message().find("checksum") != std::string::npos);
  CHECK(p.result.streamed_blocks == 0);
  CHECK(p.result.bytes == 0);
  CHECK(p.blocks.empty());  // the frame with the bad block is not handed over
}

TEST_CASE("a holder answering out of order, with another hash or a wrong count fails the pull as malformed") {
  zmq::context_t context;
  zmq::socket_t fake(context, zmq::socket_type::router);
  fake.set(zmq::sockopt::rcvtimeo, 10'000);
  fake.bind("tcp://127.0.0.1:0");
  const std::string endpoint = fake.get(zmq::sockopt::last_endpoint);
  auto receiver = Make();
  auto answer = [&](auto make_frames) {
    const uint64_t id = receiver->StartPull(endpoint, "", Chain(3));
    zmq::message_t identity, body;
    REQUIRE(fake.recv(identity, zmq::recv_flags::none));
    REQUIRE(fake.recv(body, zmq::recv_flags::none));
    auto request = DecodePullRequest(body.data(), body.size());
    REQUIRE(request.ok());
    std::vector<Block> blocks = Blocks(*request, 3);
    for (Block& b : blocks) {
      for (auto& d : b.data) b.checksums.push_back(Checksum(d));
    }
    for (const std::string& frame : make_frames(id, blocks)) {
      fake.send(zmq::buffer(identity.to_string()), zmq::send_flags::sndmore);
      fake.send(zmq::buffer(frame));
    }
    return AwaitPulled(*receiver, id);
  };
  Pulled p = answer([](uint64_t id, std::vector<Block>& b) {
    return std::vector<std::string>{EncodeBlocks(id, std::span<const Block>(b).subspan(1, 1))};
  });
  CHECK(p.result.outcome == PullOutcome::kMalformed);
  CHECK(p.result.status.message().find("out of order") != std::string::npos);
  CHECK(p.blocks.empty());
  p = answer([](uint64_t id, std::vector<Block>& b) {
    b[0].hash ^= 1;
    return std::vector<std::string>{EncodeBlocks(id, std::span<const Block>(b).subspan(0, 1))};
  });
  CHECK(p.result.outcome == PullOutcome::kMalformed);
  p = answer([](uint64_t id, std::vector<Block>& b) {
    return std::vector<std::string>{EncodeBlocks(id, std::span<const Block>(b).subspan(0, 2)), EncodeDone(id, 3)};
  });
  CHECK(p.result.outcome == PullOutcome::kMalformed);
  CHECK(p.result.streamed_blocks == 0);
  // The two good blocks were handed over as they came: after a failed pull, only leftovers.
  CHECK(p.blocks.size() == 2);
}

TEST_CASE("CURVE: an unauthorized worker is served nothing and an authorized one is") {
  if (!CurveAvailable()) return;
  auto holder_keys = GenerateCurveKeyPair();
  auto good_keys = GenerateCurveKeyPair();
  auto bad_keys = GenerateCurveKeyPair();
  REQUIRE((holder_keys.ok() && good_keys.ok() && bad_keys.ok()));
  TransferOptions holder_options;
  holder_options.keypair = *holder_keys;
  holder_options.authorized_keys = {good_keys->public_key};
  auto holder = Make(holder_options);

  TransferOptions bad_options;
  bad_options.keypair = *bad_keys;
  bad_options.authorized_keys = {holder_keys->public_key};
  ManualClock clock;
  auto intruder = Make(bad_options, &clock);
  PullRequest request = Chain(2);
  request.deadline_ms = 1'000;
  const uint64_t refused = intruder->StartPull(holder->endpoint(), holder_keys->public_key, request);
  AwaitStats(*holder, [](const TransferStats& s) { return s.unauthorized_clients >= 1; });
  CHECK(AwaitResult(*intruder, refused, &clock).outcome == PullOutcome::kDeadline);
  CHECK(holder->TakePulls().empty());

  TransferOptions good_options;
  good_options.keypair = *good_keys;
  good_options.authorized_keys = {holder_keys->public_key};
  auto receiver = Make(good_options);
  const uint64_t id = receiver->StartPull(holder->endpoint(), holder_keys->public_key, Chain(2));
  IncomingPull in = AwaitPull(*holder);
  ServeRun(*holder, in, Blocks(in.request, 2));
  CHECK(AwaitPulled(*receiver, id).blocks.size() == 2);
}

TEST_CASE("a bind other hosts can reach needs CURVE or insecure") {
  TransferOptions options;
  options.bind = "tcp://0.0.0.0:0";
  auto refused = TransferService::Start(options, SystemClock::Default());
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().find("unauthenticated") != std::string::npos);
  options.insecure = true;
  CHECK(TransferService::Start(options, SystemClock::Default()).ok());

  TransferOptions no_authorized;
  no_authorized.keypair = CurveKeyPair{"a", "b"};
  CHECK(!TransferService::Start(no_authorized, SystemClock::Default()).ok());
}

TEST_CASE("simulated bandwidth: a pull completes no earlier than its modelled bytes allow") {
  CHECK(ModelledTransferTime(1'000'000, 1e6) == kNsPerSec);
  CHECK(ModelledTransferTime(1'000'000, 0) == 0);
  auto holder = Make();
  ManualClock clock;
  TransferOptions options;
  options.simulated_bandwidth_bytes_per_s = 1024.0 * 1024.0;  // 1 MiB/s
  auto receiver = Make(options, &clock);
  const PullRequest request = Chain(4, 1 << 20, KvDtype::kNone);  // 4 modelled MiB, no bytes
  const TimeNs start = clock.Now();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  ServeRun(*holder, in, Blocks(in.request, 4));
  Pulled p = AwaitPulled(*receiver, id, &clock);
  const PullResult& r = p.result;
  REQUIRE(r.outcome == PullOutcome::kOk);
  CHECK(r.streamed_blocks == 4);
  REQUIRE(p.blocks.size() == 4);
  CHECK(p.blocks[0].data.empty());
  CHECK(r.bytes == 4u << 20);
  CHECK(r.elapsed == 4 * kNsPerSec);
  CHECK(clock.Now() - start >= 4 * kNsPerSec);
}

TEST_CASE("beyond max_inflight_pulls a pull fails at once; a cancelled pull ends cancelled") {
  auto holder = Make();
  TransferOptions options;
  options.max_inflight_pulls = 1;
  auto receiver = Make(options);
  const uint64_t first = receiver->StartPull(holder->endpoint(), "", Chain(2));
  const uint64_t second = receiver->StartPull(holder->endpoint(), "", Chain(2));
  CHECK(AwaitResult(*receiver, second).outcome == PullOutcome::kBusy);
  receiver->CancelPull(first);
  CHECK(AwaitResult(*receiver, first).outcome == PullOutcome::kCancelled);
  const TransferStats s = receiver->Stats();
  CHECK(s.pulls.at(holder->endpoint()).by_outcome[static_cast<size_t>(PullOutcome::kBusy)] == 1);
  CHECK(s.pulls.at(holder->endpoint()).by_outcome[static_cast<size_t>(PullOutcome::kCancelled)] == 1);
}

TEST_CASE("a stopping holder refuses the pulls it has not answered with shuttingDown") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", Chain(2));
  AwaitPull(*holder);
  holder->Stop();
  PullResult r = AwaitResult(*receiver, id);
  CHECK(r.outcome == PullOutcome::kRefused);
  CHECK(r.refusal == RefusalReason::kShuttingDown);
}

// --- The same-host device path ---

// A same-host pull: the receiver says it can copy device memory.
PullRequest DeviceChain(size_t n) {
  PullRequest r = Chain(n);
  r.host_id = "host-a";
  return r;
}

// The run a holder's engine would answer `r` with: its first `n` blocks, pinned in one pool.
DeviceRun Run(const PullRequest& r, size_t n) {
  DeviceRun run;
  for (size_t p = 0; p < r.layout.pools.size(); ++p) run.handles.push_back(std::string(64, static_cast<char>('a' + p)));
  for (const Block& b : Blocks(r, n)) {
    run.blocks.push_back(DeviceBlock{b.index, b.hash, b.tokens, std::vector<uint32_t>(r.layout.pools.size(), b.index + 40)});
  }
  return run;
}

TEST_CASE("same host: a device answer reaches the receiver as it was sent, and its release reaches the holder") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", DeviceChain(3));
  IncomingPull in = AwaitPull(*holder);
  CHECK(in.request.host_id == "host-a");
  const DeviceRun run = Run(in.request, 2);
  holder->ServeDevice(in.peer_token, id, run);
  PullResult r = AwaitResult(*receiver, id);
  REQUIRE_MESSAGE(r.outcome == PullOutcome::kOk, r.status.ToString());
  REQUIRE(r.device.has_value());
  CHECK(*r.device == run);
  CHECK(r.streamed_blocks == 0);
  CHECK(r.bytes == 2 * 256);
  CHECK(r.deadline > 0);
  const SourceStats src = receiver->Stats().pulls.at(holder->endpoint());
  CHECK(src.ok == 1);
  CHECK(src.bytes == 2 * 256);
  CHECK(src.blocks == 2);
  CHECK(holder->TakeReleases().empty());  // pinned until the receiver says so

  receiver->ReleasePull(id);
  receiver->ReleasePull(id);  // twice, or an unknown id: nothing more is sent
  receiver->ReleasePull(id + 100);
  const std::vector<Released> released = AwaitReleases(*holder);
  REQUIRE(released.size() == 1);
  CHECK(released[0].peer_token == in.peer_token);
  CHECK(released[0].transfer_id == id);
  CHECK_FALSE(released[0].expired);
  const TransferStats hs = holder->Stats();
  CHECK(hs.served_device == 1);
  CHECK(hs.device_releases == 1);
  CHECK(hs.device_expired == 0);
  CHECK(hs.served == 0);
}

TEST_CASE("same host: a device run never released is let go at the deadline plus the grace") {
  ManualClock holder_clock;
  auto holder = Make({}, &holder_clock);
  auto receiver = Make();
  PullRequest request = DeviceChain(2);
  request.deadline_ms = 1'000;
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", request);
  IncomingPull in = AwaitPull(*holder);
  holder->ServeDevice(in.peer_token, id, Run(in.request, 2));
  CHECK(AwaitResult(*receiver, id).device.has_value());
  AwaitStats(*holder, [](const TransferStats& s) { return s.served_device == 1; });
  // At the deadline plus the grace it is still held; just past it, it is not.
  holder_clock.AdvanceMs(1'000);
  holder_clock.Advance(config::kDeviceHoldGrace);
  for (int i = 0; i < 10; ++i) holder->WaitForWork(10 * kNsPerMs);
  CHECK(holder->TakeReleases().empty());
  holder_clock.AdvanceMs(1);
  const std::vector<Released> released = AwaitReleases(*holder);
  REQUIRE(released.size() == 1);
  CHECK(released[0].transfer_id == id);
  CHECK(released[0].expired);
  CHECK(holder->Stats().device_expired == 1);

  // A ServeDevice past the pull's deadline sends nothing and is released at once.
  const uint64_t late = receiver->StartPull(holder->endpoint(), "", request);
  in = AwaitPull(*holder);
  holder_clock.AdvanceMs(1'001);
  holder->ServeDevice(in.peer_token, late, Run(in.request, 2));
  const std::vector<Released> stale = AwaitReleases(*holder);
  REQUIRE(stale.size() == 1);
  CHECK(stale[0].transfer_id == late);
  CHECK(stale[0].expired);
  CHECK(holder->Stats().stale_serves == 1);
  CHECK(holder->Stats().served_device == 1);
}

TEST_CASE("same host: another peer's release for the same transfer id releases nothing") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", DeviceChain(2));
  IncomingPull in = AwaitPull(*holder);
  holder->ServeDevice(in.peer_token, id, Run(in.request, 2));
  REQUIRE(AwaitResult(*receiver, id).device.has_value());

  zmq::context_t context;
  zmq::socket_t other(context, zmq::socket_type::dealer);
  other.set(zmq::sockopt::linger, 0);
  other.connect(holder->endpoint());
  RawExchange(other, {EncodeRelease(id)}, false);
  AwaitStats(*holder, [](const TransferStats& s) { return s.stray_releases == 1; });
  CHECK(holder->TakeReleases().empty());
  CHECK(holder->Stats().device_releases == 0);

  receiver->ReleasePull(id);
  const std::vector<Released> released = AwaitReleases(*holder);
  REQUIRE(released.size() == 1);
  CHECK_FALSE(released[0].expired);
}

TEST_CASE("same host: a device run that does not answer the request fails the pull, and the holder may unpin") {
  // A holder that answers with another hash: the receiver refuses the run and releases it.
  zmq::context_t context;
  zmq::socket_t fake(context, zmq::socket_type::router);
  fake.set(zmq::sockopt::rcvtimeo, 10'000);
  fake.set(zmq::sockopt::linger, 0);
  fake.bind("tcp://127.0.0.1:0");
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(fake.get(zmq::sockopt::last_endpoint), "", DeviceChain(3));
  zmq::message_t identity, body;
  REQUIRE(fake.recv(identity, zmq::recv_flags::none));
  REQUIRE(fake.recv(body, zmq::recv_flags::none));
  auto request = DecodePullRequest(body.data(), body.size());
  REQUIRE(request.ok());
  DeviceRun run = Run(*request, 2);
  run.blocks[1].hash ^= 1;
  const std::string frame = EncodeDeviceRun(id, run);
  fake.send(zmq::buffer(identity.to_string()), zmq::send_flags::sndmore);
  fake.send(zmq::buffer(frame));
  PullResult r = AwaitResult(*receiver, id);
  CHECK(r.outcome == PullOutcome::kMalformed);
  CHECK_FALSE(r.device.has_value());
  CHECK(r.bytes == 0);
  zmq::message_t release_identity, release;
  REQUIRE(fake.recv(release_identity, zmq::recv_flags::none));
  REQUIRE(fake.recv(release, zmq::recv_flags::none));
  auto decoded = DecodePullRequest(release.data(), release.size());
  REQUIRE(decoded.ok());
  CHECK(decoded->release);
  CHECK(decoded->transfer_id == id);

  // A device answer after a `blocks` frame (Contract 4: `device` is a pull's only answer).
  const uint64_t mixed = receiver->StartPull(fake.get(zmq::sockopt::last_endpoint), "", DeviceChain(3));
  REQUIRE(fake.recv(identity, zmq::recv_flags::none));
  REQUIRE(fake.recv(body, zmq::recv_flags::none));
  std::vector<Block> first = Blocks(*request, 1);
  first[0].checksums = {Checksum(first[0].data[0])};
  for (const std::string& f : {EncodeBlocks(mixed, first), EncodeDeviceRun(mixed, Run(*request, 2))}) {
    fake.send(zmq::buffer(identity.to_string()), zmq::send_flags::sndmore);
    fake.send(zmq::buffer(f));
  }
  r = AwaitResult(*receiver, mixed);
  CHECK(r.outcome == PullOutcome::kMalformed);
  CHECK(r.status.message().find("after other replies") != std::string::npos);
  REQUIRE(fake.recv(release_identity, zmq::recv_flags::none));
  REQUIRE(fake.recv(release, zmq::recv_flags::none));
  decoded = DecodePullRequest(release.data(), release.size());
  REQUIRE(decoded.ok());
  CHECK(decoded->release);
  CHECK(decoded->transfer_id == mixed);

  // The holder's own engine serving a bad run: refused malformed, released at once.
  auto holder = Make();
  const uint64_t second = receiver->StartPull(holder->endpoint(), "", DeviceChain(3));
  IncomingPull in = AwaitPull(*holder);
  DeviceRun bad = Run(in.request, 2);
  bad.blocks[0].slots.push_back(7);
  holder->ServeDevice(in.peer_token, second, bad);
  r = AwaitResult(*receiver, second);
  CHECK(r.outcome == PullOutcome::kRefused);
  CHECK(r.refusal == RefusalReason::kMalformed);
  const std::vector<Released> released = AwaitReleases(*holder);
  REQUIRE(released.size() == 1);
  CHECK(released[0].transfer_id == second);
  CHECK(released[0].expired);

  // A receiver that gave no host id is never sent a device run.
  const uint64_t third = receiver->StartPull(holder->endpoint(), "", Chain(3));
  in = AwaitPull(*holder);
  holder->ServeDevice(in.peer_token, third, Run(in.request, 2));
  CHECK(AwaitResult(*receiver, third).refusal == RefusalReason::kMalformed);
  CHECK(AwaitReleases(*holder).size() == 1);
  CHECK(holder->Stats().served_device == 0);
}

TEST_CASE("same host: a stopping holder reports every held run released, and a ServeDevice after Stop too") {
  auto holder = Make();
  auto receiver = Make();
  const uint64_t id = receiver->StartPull(holder->endpoint(), "", DeviceChain(2));
  IncomingPull in = AwaitPull(*holder);
  holder->ServeDevice(in.peer_token, id, Run(in.request, 2));
  REQUIRE(AwaitResult(*receiver, id).device.has_value());
  const uint64_t open = receiver->StartPull(holder->endpoint(), "", DeviceChain(2));
  IncomingPull unanswered = AwaitPull(*holder);
  holder->Stop();
  std::vector<Released> released = holder->TakeReleases();
  REQUIRE(released.size() == 1);
  CHECK(released[0].transfer_id == id);
  CHECK(released[0].expired);
  CHECK(AwaitResult(*receiver, open).refusal == RefusalReason::kShuttingDown);
  holder->ServeDevice(unanswered.peer_token, open, Run(unanswered.request, 2));
  released = holder->TakeReleases();
  REQUIRE(released.size() == 1);
  CHECK(released[0].transfer_id == open);
  CHECK(released[0].expired);
}

}  // namespace
}  // namespace kvfleet::transfer
