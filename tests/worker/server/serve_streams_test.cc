// ServeStreams (serve_streams.h) inside KvPulls: a holder answering a pull with bytes streams
// its run a frame per Poll, batched reads into reused buffers, the run pinned in its cache
// until the last frame has left, and unpinned whenever the transfer ends early (deadline,
// Stop, the receiver gone). Two mock engines whose backends are given bytes (BytesBackend),
// two TransferServices over loopback. Loops are bounded; nothing here measures time.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/block_hash.h"
#include "tests/worker/engine/engine_harness.h"
#include "worker/server/kv_pulls.h"

namespace kvfleet::server {
namespace {

using engine::testing::Harness;
using engine::testing::HarnessOptions;
using engine::testing::kBlock;

// The mock's engine with KV blocks that have bytes: fp32 blocks of `bytes_per_block` (in place
// of the mock's modelled size). Block b of every pool reads as its id (8 bytes) then b's low
// byte repeated. Reads are recorded (blocks per call); writes kept per (pool, block).
class BytesBackend final : public backend::ModelBackend {
 public:
  BytesBackend(backend::ModelBackend* inner, uint64_t bytes_per_block) : inner_(inner) {
    pools_.assign(inner->pools().begin(), inner->pools().end());
    for (backend::KvPoolInfo& p : pools_) p.bytes_per_block = bytes_per_block;
  }
  std::string_view name() const override { return "bytes"; }
  const model::ModelConfig& config() const override { return inner_->config(); }
  int32_t block_size() const override { return inner_->block_size(); }
  int32_t max_num_tokens() const override { return inner_->max_num_tokens(); }
  int32_t max_batch_size() const override { return inner_->max_batch_size(); }
  int64_t max_context() const override { return inner_->max_context(); }
  std::span<const backend::KvPoolInfo> pools() const override { return pools_; }
  Status Execute(const backend::StepBatch& batch, backend::StepOutput* out) override {
    return inner_->Execute(batch, out);
  }
  kv::BlockCopier& block_copier() override { return inner_->block_copier(); }
  backend::KvTransferFormat kv_transfer_format() const override { return {"fp32", "", {}}; }

  Status ReadKvBlocks(uint32_t pool, std::span<const kv::BlockLocation> blocks, std::span<std::byte> out) override {
    const uint64_t bpb = pools_[pool].bytes_per_block;
    REQUIRE(out.size() == blocks.size() * bpb);
    reads.push_back(blocks.size());
    if (fail_reads) return Internal("the test failed the read");
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::byte* b = out.data() + i * bpb;
      const uint64_t id = blocks[i].block;
      std::memcpy(b, &id, sizeof(id));
      std::memset(b + sizeof(id), static_cast<int>(id & 0xff), bpb - sizeof(id));
    }
    return Status::Ok();
  }
  Status WriteKvBlocks(uint32_t pool, std::span<const kv::BlockId> blocks, std::span<const std::byte> in) override {
    const uint64_t bpb = pools_[pool].bytes_per_block;
    REQUIRE(in.size() == blocks.size() * bpb);
    for (size_t i = 0; i < blocks.size(); ++i) {
      written[{pool, blocks[i]}].assign(in.begin() + i * bpb, in.begin() + (i + 1) * bpb);
    }
    return Status::Ok();
  }

  Status WriteKvBlocksFrom(uint32_t pool, std::span<const kv::BlockId> blocks,
                           std::span<const std::span<const std::byte>> in) override {
    const uint64_t bpb = pools_[pool].bytes_per_block;
    REQUIRE(in.size() == blocks.size());
    write_calls.push_back(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      REQUIRE(in[i].size() == bpb);
      written[{pool, blocks[i]}].assign(in[i].begin(), in[i].end());
    }
    return Status::Ok();
  }

  std::vector<size_t> reads;  // blocks per ReadKvBlocks call
  std::vector<size_t> write_calls;  // blocks per WriteKvBlocksFrom call
  bool fail_reads = false;
  std::map<std::pair<uint32_t, kv::BlockId>, std::vector<std::byte>> written;

 private:
  backend::ModelBackend* inner_;
  std::vector<backend::KvPoolInfo> pools_;
};

// 1 MiB blocks: 15 to a 16 MiB frame.
constexpr uint64_t kBlockBytes = uint64_t{1} << 20;
constexpr uint32_t kPerFrame = 15;
constexpr uint32_t kChain = 40;  // blocks pulled: three frames (15, 15, 10)
constexpr DurationNs kPullDeadline = 60 * kNsPerSec;

struct Streams {
  // `bytes` false: the plain mock backends (dtype none, tokens only). `receiver_blocks`: the
  // receiver's device KV blocks.
  explicit Streams(bool bytes = true, int64_t receiver_blocks = 256)
      : b(ReceiverOptions(receiver_blocks)),
        holder_bytes(a.backend.get(), kBlockBytes),
        receiver_bytes(b.backend.get(), kBlockBytes) {
    auto hs = transfer::TransferService::Start({}, &holder_clock);
    REQUIRE_MESSAGE(hs.ok(), hs.status().ToString());
    holder_service = std::move(*hs);
    auto rs = transfer::TransferService::Start({}, SystemClock::Default());
    REQUIRE_MESSAGE(rs.ok(), rs.status().ToString());
    receiver_service = std::move(*rs);
    KvPullsOptions o;
    o.model = "mock-8b";
    // The receiver's clock is the system's: a 40-block pull under TSan on two busy cores took
    // over 5 s, and a test that waits for a deadline advances the holder's ManualClock instead.
    o.deadline = kPullDeadline;
    o.own_endpoint = holder_service->endpoint();
    backend::ModelBackend* holder_backend = bytes ? &holder_bytes : static_cast<backend::ModelBackend*>(a.backend.get());
    backend::ModelBackend* receiver_backend = bytes ? &receiver_bytes : static_cast<backend::ModelBackend*>(b.backend.get());
    holder = std::make_unique<KvPulls>(o, holder_service.get(), a.kv.get(), holder_backend, a.engine.get());
    o.own_endpoint = receiver_service->endpoint();
    receiver = std::make_unique<KvPulls>(o, receiver_service.get(), b.kv.get(), receiver_backend, b.engine.get());
    REQUIRE(holder->layout().has_value());
    if (bytes) REQUIRE(transfer::BlocksPerFrame(*holder->layout()) == kPerFrame);
    prompt = engine::testing::Prompt(kChain * kBlock + 3);
    a.Add(prompt, 1);
    a.RunToCompletion();
    REQUIRE(Pinned() == 0);
  }

  // The holder's device blocks held though no sequence is live there: pinned by a transfer.
  uint32_t Pinned() const { return a.kv->Stats().pools[0].tiers[0].in_use; }

  // The receiver pulls the prompt's kChain whole blocks from the holder, for a request of
  // `max_tokens`.
  void StartPull(uint32_t max_tokens = 1) {
    engine::GenerateRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    auto id = b.engine->Add(r, b.clock.Now());
    REQUIRE(id.ok());
    receiver->Start(*id, r, PullHint{holder_service->endpoint(), "", kChain, "a"});
    REQUIRE(receiver->pending() == 1);
  }

  // One holder tick, checked: at most one frame read (one batched read per pool), the run
  // pinned exactly while its stream lasts.
  void HolderTick() {
    const size_t reads = holder_bytes.reads.size();
    holder->Poll();
    CHECK(holder_bytes.reads.size() - reads <= 1);
    for (size_t i = reads; i < holder_bytes.reads.size(); ++i) CHECK(holder_bytes.reads[i] <= kPerFrame);
    REQUIRE(holder->streams()->CheckInvariants().ok());
    REQUIRE(a.kv->CheckInvariants().ok());
    CHECK(Pinned() == holder->streams()->pinned_blocks());
  }

  // Ticks the holder until its stream has started.
  void AwaitStream() {
    for (int i = 0; i < 2000 && holder->streams()->streams() == 0; ++i) {
      holder_service->WaitForWork(kNsPerMs);
      HolderTick();
    }
    REQUIRE(holder->streams()->streams() == 1);
    CHECK(Pinned() == kChain);
  }

  // Ticks the holder and polls the receiver until the pull has ended there.
  void AwaitPullEnd() {
    for (int i = 0; i < 4000 && (receiver->pending() > 0 || holder->streams()->streams() > 0); ++i) {
      HolderTick();
      receiver->Poll();
      receiver_service->WaitForWork(kNsPerMs);
    }
    REQUIRE(receiver->pending() == 0);
  }

  // Ticks the holder until no stream is left.
  void AwaitNoStream() {
    for (int i = 0; i < 4000 && holder->streams()->streams() > 0; ++i) {
      holder_service->WaitForWork(kNsPerMs);
      HolderTick();
    }
    REQUIRE(holder->streams()->streams() == 0);
    CHECK(Pinned() == 0);
  }

  static HarnessOptions ReceiverOptions(int64_t blocks) {
    HarnessOptions o;
    o.device_blocks = blocks;
    o.verify_kv = false;  // a mock pull's blocks come without bytes: the request can run on them
    return o;
  }

  Harness a, b;
  ManualClock holder_clock;
  BytesBackend holder_bytes, receiver_bytes;
  std::unique_ptr<transfer::TransferService> holder_service, receiver_service;
  std::unique_ptr<KvPulls> holder, receiver;
  std::vector<TokenId> prompt;
};

TEST_CASE("a pull of many blocks streams a frame a tick, batched, pinned until its last frame has left") {
  Streams t;
  t.StartPull();
  bool started = false;
  for (int i = 0; i < 4000 && (t.receiver->pending() > 0 || t.holder->streams()->streams() > 0 || !started); ++i) {
    // What the service had reported before this tick: the run may be unpinned only after
    // the stream's `done` left (served counts it in the same step as the release).
    const uint64_t served_before = t.holder_service->Stats().served;
    t.HolderTick();
    started = started || t.holder->streams()->streams() > 0;
    if (started && served_before == 0) CHECK(t.Pinned() == kChain);
    if (started && t.holder->streams()->streams() == 0) {
      const transfer::TransferStats s = t.holder_service->Stats();
      CHECK(s.served == 1);
      CHECK(s.served_frames == 3);
    }
    t.receiver->Poll();
    t.receiver_service->WaitForWork(kNsPerMs);
  }
  REQUIRE(t.receiver->pending() == 0);
  REQUIRE(t.holder->streams()->streams() == 0);
  CHECK(t.Pinned() == 0);
  // One read per pool per frame, each of a frame's blocks: not a call per block.
  CHECK(t.holder_bytes.reads == std::vector<size_t>{kPerFrame, kPerFrame, kChain - 2 * kPerFrame});
  CHECK(t.holder->streams()->stats().frames == 3);
  CHECK(t.holder->streams()->stats().completed == 1);
  CHECK(t.holder->stats().bytes_held == 0);
  CHECK(t.receiver->stats().imported_blocks == kChain);
  // Written a frame at a time as it arrived: one call per pool per frame.
  CHECK(t.receiver_bytes.write_calls == std::vector<size_t>{kPerFrame, kPerFrame, kChain - 2 * kPerFrame});
  // Every block arrived as the holder read it: its id, then its low byte throughout.
  REQUIRE(t.receiver_bytes.written.size() == kChain);
  std::set<uint64_t> ids;
  for (const auto& [where, bytes] : t.receiver_bytes.written) {
    REQUIRE(bytes.size() == kBlockBytes);
    uint64_t id = 0;
    std::memcpy(&id, bytes.data(), sizeof(id));
    ids.insert(id);
    CHECK(bytes.back() == static_cast<std::byte>(id & 0xff));
  }
  CHECK(ids.size() == kChain);
}

TEST_CASE("a mock holder (no bytes, dtype none) streams its run's tokens in one frame") {
  Streams t(/*bytes=*/false);
  t.StartPull();
  t.AwaitPullEnd();
  CHECK(t.holder->streams()->streams() == 0);
  CHECK(t.Pinned() == 0);
  CHECK(t.holder->streams()->stats().frames == 1);
  CHECK(t.holder->streams()->stats().read_calls == 0);
  CHECK(t.holder->streams()->stats().completed == 1);
  CHECK(t.receiver->stats().imported_blocks == kChain);
}

TEST_CASE("a pulled chain stays out of eviction's reach until its request is admitted, then is released") {
  Streams t(/*bytes=*/false);
  t.StartPull(/*max_tokens=*/4);
  const engine::RequestId id = t.b.engine->scheduler().waiting().front()->id;
  t.AwaitPullEnd();
  REQUIRE(t.receiver->stats().imported_blocks == kChain);
  CHECK(t.receiver->stats().kept_blocks == kChain);
  CHECK(t.b.engine->AwaitsAdmission(id));
  // Whatever needs room before the request runs (a busy worker's queue) finds none of it:
  // stored below the default priority, it would go first.
  CHECK(t.b.kv->Evict(0, kChain).empty());
  t.receiver->Poll();
  CHECK(t.receiver->stats().kept_blocks == kChain);  // not admitted yet: kept
  t.b.Step();
  CHECK_FALSE(t.b.engine->AwaitsAdmission(id));
  REQUIRE(t.b.engine->scheduler().running().size() == 1);
  t.receiver->Poll();
  CHECK(t.receiver->stats().kept_blocks == 0);
  CHECK(t.b.kv->Evict(0, kChain).empty());  // the running request's own sequence holds it now
  t.b.RunToCompletion();
  REQUIRE(t.b.finals.count(id) == 1);
  CHECK(t.b.finals.at(id).finish == engine::FinishReason::kLength);
  CHECK(t.b.finals.at(id).usage.cached_device_tokens == kChain * kBlock);
  CHECK(t.b.kv->CheckInvariants().ok());
}

TEST_CASE("a pulled chain kept for a request that ends before its admission is released") {
  Streams t(/*bytes=*/false);
  t.StartPull();
  const engine::RequestId id = t.b.engine->scheduler().waiting().front()->id;
  t.AwaitPullEnd();
  REQUIRE(t.receiver->stats().kept_blocks == kChain);
  t.b.engine->Cancel(id);
  t.b.Step();
  t.receiver->Poll();
  CHECK(t.receiver->stats().kept_blocks == 0);
  CHECK(t.b.DeviceBlocksInUse() == 0);
  CHECK(t.b.kv->Evict(0, kChain).size() == kChain);  // cached still, evictable again
}

TEST_CASE("kept chains yield when a request waiting ahead does not fit: it runs, and so does the pulled one") {
  // 80 blocks: the chain kept (40, and the import's partial one) leaves 39, and the request
  // ahead needs 49. With nothing running it would have been called unfittable.
  Streams t(/*bytes=*/false, /*receiver_blocks=*/80);
  const engine::RequestId ahead = t.b.Add(engine::testing::Prompt(48 * kBlock, 50'000), 1);
  t.StartPull();
  const engine::RequestId pulled = t.b.engine->scheduler().waiting().back()->id;
  t.AwaitPullEnd();
  REQUIRE(t.receiver->stats().kept_blocks == kChain);
  t.b.Step();
  CHECK(t.b.engine->last_step().kv_short);
  CHECK(t.b.finals.count(ahead) == 0);  // waiting, not ended
  t.receiver->Poll();
  CHECK(t.receiver->stats().kept_blocks == 0);
  t.b.RunToCompletion();
  REQUIRE(t.b.finals.count(ahead) == 1);
  CHECK(t.b.finals.at(ahead).finish == engine::FinishReason::kLength);
  REQUIRE(t.b.finals.count(pulled) == 1);
  CHECK(t.b.finals.at(pulled).finish == engine::FinishReason::kLength);
  CHECK(t.b.kv->CheckInvariants().ok());
}

TEST_CASE("a stream past its deadline is cut and its run unpinned") {
  Streams t;
  t.StartPull();
  t.AwaitStream();  // its first frame read
  t.holder_clock.AdvanceMs(kPullDeadline / kNsPerMs + 1'000);
  t.AwaitNoStream();
  CHECK(t.holder->streams()->stats().cut == 1);
  CHECK(t.holder->streams()->stats().completed == 0);
  CHECK(t.holder_service->Stats().served == 0);
}

TEST_CASE("a holder stopping cuts its streams and unpins their runs") {
  Streams t;
  t.StartPull();
  t.AwaitStream();
  t.holder_service->Stop();
  t.AwaitNoStream();
  CHECK(t.holder->streams()->stats().cut == 1);
  CHECK(t.holder->streams()->stats().completed == 0);
}

TEST_CASE("a receiver that leaves mid-pull costs the holder no pinned block") {
  Streams t;
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(t.holder_service->endpoint());
  transfer::PullRequest r;
  r.transfer_id = 9;
  r.model = "mock-8b";
  r.block_size = kBlock;
  const BlockHasher hasher(kBlock, HashNamespace{"mock-8b", "", ""});
  r.hashes = hasher.HashAll(std::span(t.prompt).first(size_t{kChain} * kBlock));
  r.layout = *t.holder->layout();
  r.deadline_ms = 30'000;
  dealer.send(zmq::buffer(transfer::EncodePullRequest(r)), zmq::send_flags::none);
  t.AwaitStream();
  dealer.close();  // gone after the first frame was read, before the run is sent
  t.AwaitNoStream();
  // Cut when the holder saw the receiver gone, done when its frames all left first.
  CHECK(t.holder->streams()->stats().cut + t.holder->streams()->stats().completed == 1);
}

TEST_CASE("a run that cannot be read is refused and unpinned at once") {
  Streams t;
  t.holder_bytes.fail_reads = true;
  t.StartPull();
  t.AwaitPullEnd();
  CHECK(t.receiver->stats().imported_blocks == 0);
  CHECK(t.holder->streams()->streams() == 0);
  CHECK(t.Pinned() == 0);
  CHECK(t.holder->streams()->stats().read_failures == 1);
  CHECK(t.holder->stats().served_requests == 1);
}

// A receiver alone against a holder played by hand on a ROUTER, a frame at a time: what the
// receiver has written between frames, a bad frame, a holder that goes quiet. The receiver's
// service runs on a ManualClock (its deadlines).
struct HandHolder {
  HandHolder() : receiver_bytes(b.backend.get(), kBlockBytes) {
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    endpoint = router.get(zmq::sockopt::last_endpoint);
    auto rs = transfer::TransferService::Start({}, &clock);
    REQUIRE_MESSAGE(rs.ok(), rs.status().ToString());
    service = std::move(*rs);
    KvPullsOptions o;
    o.model = "mock-8b";
    o.deadline = 5 * kNsPerSec;
    o.own_endpoint = service->endpoint();
    receiver = std::make_unique<KvPulls>(o, service.get(), b.kv.get(), &receiver_bytes, b.engine.get());
    prompt = engine::testing::Prompt(kChain * kBlock + 3);
  }

  // The receiver pulls the prompt's kChain whole blocks; the pull reaches the ROUTER.
  void StartPull() {
    engine::GenerateRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 1;
    auto id = b.engine->Add(r, b.clock.Now());
    REQUIRE(id.ok());
    request_id = *id;
    receiver->Start(*id, r, PullHint{endpoint, "", kChain, "a"});
    REQUIRE(receiver->pending() == 1);
    std::vector<zmq::message_t> parts;
    REQUIRE(zmq::recv_multipart(router, std::back_inserter(parts)).has_value());
    REQUIRE(parts.size() == 2);
    identity = parts[0].to_string();
    auto decoded = transfer::DecodePullRequest(parts[1].data(), parts[1].size());
    REQUIRE(decoded.ok());
    request = std::move(*decoded);
    REQUIRE(request.hashes.size() == kChain);
  }

  void Send(const std::string& frame) {
    router.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    router.send(zmq::buffer(frame), zmq::send_flags::none);
  }
  // Blocks [first, first + n) in one frame, each pool's bytes its index; `corrupt`: block
  // `first`'s bytes changed after their checksum; `other_tokens`: block `first` carries tokens
  // that are not the prompt's (under the hash asked for: a collision).
  void SendFrame(uint32_t first, uint32_t n, bool corrupt = false, bool other_tokens = false) {
    std::vector<transfer::Block> blocks;
    for (uint32_t i = first; i < first + n; ++i) {
      transfer::Block& bl = blocks.emplace_back();
      bl.index = i;
      bl.hash = request.hashes[i];
      bl.tokens.assign(prompt.begin() + size_t{i} * kBlock, prompt.begin() + size_t{i + 1} * kBlock);
      if (other_tokens && i == first) bl.tokens[0] += 1;
      for (const transfer::PoolGeometry& p : request.layout.pools) {
        bl.data.emplace_back(p.bytes_per_block, static_cast<std::byte>(i));
        bl.checksums.push_back(transfer::Checksum(bl.data.back()));
      }
      if (corrupt && i == first) bl.data[0][1] ^= std::byte{1};
    }
    Send(transfer::EncodeBlocks(request.transfer_id, blocks));
  }

  // Polls the receiver until `done` holds.
  void PollUntil(const std::function<bool()>& done) {
    for (int i = 0; i < 4000 && !done(); ++i) {
      service->WaitForWork(kNsPerMs);
      receiver->Poll();
    }
    REQUIRE(done());
  }
  size_t Written() const { return receiver_bytes.written.size(); }

  // Starts the pull and sends its first frame (kPerFrame blocks); returns once the receiver
  // has written them, the pull still waiting for the rest.
  void StartWithFirstFrame() {
    StartPull();
    SendFrame(0, kPerFrame);
    PollUntil([&] { return Written() == kPerFrame; });
    REQUIRE(receiver->pending() == 1);
  }

  // The held request, released with nothing imported, computes its whole prompt and
  // finishes. (Imported blocks hold bytes the mock's shadow KV never saw: a request reading
  // them fails its step here, so the cases that import stop at the import.)
  void AwaitRequestDone() {
    b.RunToCompletion();
    REQUIRE(b.finals.count(request_id) == 1);
    CHECK(b.finals.at(request_id).finish == engine::FinishReason::kLength);
    CHECK(b.kv->CheckInvariants().ok());
  }

  Harness b;
  ManualClock clock;
  BytesBackend receiver_bytes;
  zmq::context_t context;
  zmq::socket_t router{context, zmq::socket_type::router};
  std::string endpoint;
  std::unique_ptr<transfer::TransferService> service;
  std::unique_ptr<KvPulls> receiver;
  std::vector<TokenId> prompt;
  engine::RequestId request_id = 0;
  std::string identity;
  transfer::PullRequest request;
};

TEST_CASE("a pulled run is written frame by frame as it arrives, before its done, and stored at the done") {
  HandHolder t;
  t.StartWithFirstFrame();
  // On the device already, one call for the frame, while the pull still waits for the rest.
  CHECK(t.receiver_bytes.write_calls == std::vector<size_t>{kPerFrame});
  CHECK(t.receiver->stats().imported_blocks == 0);
  t.SendFrame(kPerFrame, kPerFrame);
  t.PollUntil([&] { return t.Written() == 2 * kPerFrame; });
  CHECK(t.receiver->pending() == 1);
  t.SendFrame(2 * kPerFrame, kChain - 2 * kPerFrame);
  t.Send(transfer::EncodeDone(t.request.transfer_id, kChain));
  t.PollUntil([&] { return t.receiver->pending() == 0; });
  CHECK(t.receiver_bytes.write_calls == std::vector<size_t>{kPerFrame, kPerFrame, kChain - 2 * kPerFrame});
  CHECK(t.receiver->stats().imported_blocks == kChain);
  CHECK(t.receiver->stats().fallbacks.empty());
  // Each block of the chain written once, with its own bytes.
  std::set<int> values;
  for (const auto& [where, bytes] : t.receiver_bytes.written) values.insert(static_cast<int>(bytes.front()));
  CHECK(values.size() == kChain);
  CHECK(t.b.kv->CheckInvariants().ok());
}

TEST_CASE("a bad checksum in a pull's second frame stores none of it: the request computes its whole prompt") {
  HandHolder t;
  t.StartWithFirstFrame();
  t.SendFrame(kPerFrame, kPerFrame, /*corrupt=*/true);
  t.PollUntil([&] { return t.receiver->pending() == 0; });
  // The first frame was written, the second not; the pull failed, so nothing is stored.
  CHECK(t.Written() == kPerFrame);
  CHECK(t.receiver->stats().imported_blocks == 0);
  CHECK(t.receiver->stats().fallbacks.at("bad-checksum") == 1);
  t.AwaitRequestDone();
}

TEST_CASE("a holder gone after a pull's first frame is the pull's deadline: nothing stored, the request computes") {
  HandHolder t;
  t.StartWithFirstFrame();
  t.router.close();
  t.clock.AdvanceMs(6'000);  // past the pull's 5 s
  t.PollUntil([&] { return t.receiver->pending() == 0; });
  CHECK(t.receiver->stats().imported_blocks == 0);
  CHECK(t.receiver->stats().fallbacks.at("deadline") == 1);
  // The load reports count it failed, with the time it took, apart from the pulls that brought blocks.
  const std::vector<PullTotals> totals = t.receiver->TakeChangedPullTotals();
  REQUIRE(totals.size() == 1);
  CHECK(totals[0].pulls == 0);
  CHECK(totals[0].bytes == 0);
  CHECK(totals[0].failed == 1);
  CHECK(totals[0].failed_seconds >= 5.0);
  t.AwaitRequestDone();
}

TEST_CASE("a holder that refuses a pull (busy, or its blocks gone) is a failed pull, reported with what it took") {
  for (const transfer::RefusalReason reason : {transfer::RefusalReason::kBusy, transfer::RefusalReason::kNotHeld}) {
    CAPTURE(transfer::RefusalReasonName(reason));
    HandHolder t;
    t.StartPull();
    t.clock.AdvanceMs(3);  // the refusal's round trip, on the receiver's clock
    t.Send(transfer::EncodeRefused(t.request.transfer_id, reason, "not now"));
    t.PollUntil([&] { return t.receiver->pending() == 0; });
    CHECK(t.Written() == 0);
    CHECK(t.receiver->stats().imported_blocks == 0);
    CHECK(t.receiver->stats().fallbacks.at("refused") == 1);
    // A failure as a router weighs the pair by: no blocks, the 3 ms to the fallback.
    const std::vector<PullTotals> totals = t.receiver->TakeChangedPullTotals();
    REQUIRE(totals.size() == 1);
    CHECK(totals[0].source == t.endpoint);
    CHECK(totals[0].pulls == 0);
    CHECK(totals[0].failed == 1);
    CHECK(totals[0].failed_seconds == doctest::Approx(0.003));
    t.AwaitRequestDone();
  }
}

TEST_CASE("a block whose tokens are not the prompt's ends the written run there; the run before it is stored") {
  HandHolder t;
  t.StartPull();
  t.SendFrame(0, kPerFrame);
  t.SendFrame(kPerFrame, kPerFrame, false, /*other_tokens=*/true);
  t.SendFrame(2 * kPerFrame, kChain - 2 * kPerFrame);
  t.Send(transfer::EncodeDone(t.request.transfer_id, kChain));
  t.PollUntil([&] { return t.receiver->pending() == 0; });
  // Nothing past the collision is written; the verified leading run is imported.
  CHECK(t.Written() == kPerFrame);
  CHECK(t.receiver->stats().imported_blocks == kPerFrame);
  CHECK(t.receiver->stats().token_mismatches == 1);
  CHECK(t.receiver->stats().fallbacks.at("token_mismatch") == 1);
  // Blocks came: a pull, not a failed one.
  const std::vector<PullTotals> totals = t.receiver->TakeChangedPullTotals();
  REQUIRE(totals.size() == 1);
  CHECK(totals[0].pulls == 1);
  CHECK(totals[0].failed == 0);
  CHECK(t.b.kv->CheckInvariants().ok());
}

}  // namespace
}  // namespace kvfleet::server
