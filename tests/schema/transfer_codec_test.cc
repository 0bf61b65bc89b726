// Contract 4's codec: the spec's vectors, round trips, and frames a holder or receiver must
// refuse without crashing.
#include "schema/transfer_codec.h"

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <capnp/message.h>

#include "schema/limits.h"
#include "schema/transfer.capnp.h"
#include "schema/wire.h"
#include "tests/schema/frame_vectors.h"
#include "tests/schema/transfer_example.h"

namespace kvfleet::transfer {
namespace {

// schema/transfer_vectors.txt: vector name -> frame bytes.
std::map<std::string, std::string> LoadTransferVectors() { return testing::LoadFrameVectors("schema/transfer_vectors.txt"); }

// Frames are copied into word-aligned memory, as ZMQ's receive buffers are.
struct Aligned {
  explicit Aligned(const std::string& frame) : words((frame.size() + 7) / 8), size(frame.size()) {
    if (!frame.empty()) std::memcpy(words.data(), frame.data(), frame.size());
  }
  const void* data() const { return words.data(); }
  std::vector<capnp::word> words;
  size_t size;
};

Result<PullRequest> DecodeRequest(const std::string& frame) {
  Aligned a(frame);
  return DecodePullRequest(a.data(), a.size);
}

Result<PullReply> DecodeReply(const std::string& frame) {
  Aligned a(frame);
  return DecodePullReply(a.data(), a.size);
}

using testing::ExampleRequest;

Block ExampleBlock() {
  Block b;
  b.index = 0;
  b.hash = 0x276a80ee59a83ca7ULL;
  b.tokens = {1, 2, 3, 4};
  b.data.resize(1);
  for (int i = 0; i < 64; ++i) b.data[0].push_back(static_cast<std::byte>(i));
  b.checksums = {Checksum(b.data[0])};
  return b;
}

TEST_CASE("a dtype's name reads back as that dtype; any other name is none of them") {
  for (KvDtype d : {KvDtype::kBf16, KvDtype::kFp8E4M3, KvDtype::kFp32, KvDtype::kNone}) {
    CHECK(ParseKvDtype(KvDtypeName(d)) == d);
  }
  CHECK_FALSE(ParseKvDtype("fp8").has_value());
  CHECK_FALSE(ParseKvDtype("").has_value());
}

TEST_CASE("Checksum is XXH3-64 with seed 0") {
  CHECK(Checksum(ExampleBlock().data[0]) == 0x6187eb9089b0ed55ULL);
  CHECK(Checksum({}) == 0x2d06800538d394c2ULL);  // XXH3_64bits of no bytes
}

TEST_CASE("the spec's vectors decode field by field and the encoders write them byte for byte") {
  const auto vectors = LoadTransferVectors();
  REQUIRE(vectors.size() == 4);

  const std::string& request_frame = vectors.at("pull request");
  auto request = DecodeRequest(request_frame);
  REQUIRE(request.ok());
  CHECK(*request == ExampleRequest());
  CHECK(request->layout.BytesPerBlock() == 64);
  CHECK(EncodePullRequest(ExampleRequest()) == request_frame);

  const std::string& blocks_frame = vectors.at("blocks: the first block of the chain");
  auto blocks = DecodeReply(blocks_frame);
  REQUIRE(blocks.ok());
  CHECK(blocks->transfer_id == 7);
  REQUIRE(std::holds_alternative<std::vector<Block>>(blocks->body));
  const auto& list = std::get<std::vector<Block>>(blocks->body);
  REQUIRE(list.size() == 1);
  CHECK(list[0] == ExampleBlock());
  CHECK(CheckBlock(ExampleRequest(), list[0], 0, true).ok());
  const Block example = ExampleBlock();
  CHECK(EncodeBlocks(7, {&example, 1}) == blocks_frame);

  auto done = DecodeReply(vectors.at("done: 1 block sent"));
  REQUIRE(done.ok());
  REQUIRE(std::holds_alternative<Done>(done->body));
  CHECK(std::get<Done>(done->body).count == 1);
  CHECK(EncodeDone(7, 1) == vectors.at("done: 1 block sent"));

  const std::string& refused_frame = vectors.at("refused: layout mismatch");
  auto refused = DecodeReply(refused_frame);
  REQUIRE(refused.ok());
  REQUIRE(std::holds_alternative<Refusal>(refused->body));
  CHECK(std::get<Refusal>(refused->body).reason == RefusalReason::kLayoutMismatch);
  CHECK(std::get<Refusal>(refused->body).message == "holder dtype fp8e4m3, request bf16");
  CHECK(EncodeRefused(7, RefusalReason::kLayoutMismatch, "holder dtype fp8e4m3, request bf16") == refused_frame);
}

TEST_CASE("a pull request round-trips with a namespace, a parent, several pools and dtype none") {
  PullRequest r = ExampleRequest();
  r.lora = "sql-adapter";
  r.cache_salt = "tenant-42";
  r.parent_hash = 0x1234;
  r.layout.dtype = KvDtype::kNone;
  r.layout.pools = {PoolGeometry{0, 30, 8, 128, 1 << 20}, PoolGeometry{4096, 10, 8, 128, 1 << 19}};
  auto back = DecodeRequest(EncodePullRequest(r));
  REQUIRE(back.ok());
  CHECK(*back == r);
}

TEST_CASE("a name with a NUL byte crosses the wire whole, not cut at the NUL") {
  // A setter given a std::string reads it up to its first NUL (kj::StringPtr's c_str()
  // constructor): found by transfer_codec_fuzzer, where such a request decoded, re-encoded
  // shorter and decoded as another namespace.
  PullRequest r = ExampleRequest();
  r.cache_salt = std::string("tenant\0b", 8);
  r.host_id = std::string("host\0a", 6);
  auto back = DecodeRequest(EncodePullRequest(r));
  REQUIRE(back.ok());
  CHECK(back->cache_salt.size() == 8);
  CHECK(*back == r);
}

TEST_CASE("a pull request that breaks a rule is refused, over a limit as OutOfRange") {
  auto fails = [](PullRequest r) { return DecodeRequest(EncodePullRequest(r)).status(); };
  PullRequest r = ExampleRequest();
  r.transfer_id = 0;
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.model.clear();
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.block_size = 3;
  r.layout.block_size = 3;
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.layout.block_size = 8;
  CHECK(fails(r).message().find("layout block size") != std::string::npos);
  r = ExampleRequest();
  r.hashes.clear();
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.hashes[1] = 0;
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.layout.pools.clear();
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.deadline_ms = 0;
  CHECK(fails(r).code() == StatusCode::kInvalidArgument);
  r = ExampleRequest();
  r.model = std::string(wire::limits::kMaxNameBytes + 1, 'm');
  CHECK(fails(r).code() == StatusCode::kOutOfRange);
  r = ExampleRequest();
  r.hashes.assign(wire::limits::kMaxPullBlocks + 1, 42);
  CHECK(fails(r).code() == StatusCode::kOutOfRange);
  r = ExampleRequest();
  r.layout.pools[0].bytes_per_block = wire::limits::kMaxTransferBytes;
  CHECK(fails(r).code() == StatusCode::kOutOfRange);
}

TEST_CASE("garbage and truncated frames are errors, and the transfer id is read when it can be") {
  const std::string frame = EncodePullRequest(ExampleRequest());
  for (size_t cut : {size_t{0}, size_t{7}, size_t{8}, frame.size() / 2, frame.size() - 8}) {
    CHECK(!DecodeRequest(frame.substr(0, cut)).ok());
    CHECK(!DecodeReply(frame.substr(0, cut)).ok());
  }
  CHECK(!DecodeRequest("not capnp at all").ok());
  CHECK(ReadTransferId("xx", 2) == 0);
  PullRequest bad = ExampleRequest();
  bad.deadline_ms = 0;
  const std::string bad_frame = EncodePullRequest(bad);
  Aligned a(bad_frame);
  CHECK(ReadTransferId(a.data(), a.size) == 7);
  // A PullReply is not a PullRequest: its second word is no namespace.
  CHECK(!DecodeRequest(EncodeDone(7, 1)).ok());
}

TEST_CASE("a reply with an unknown union member, an unknown reason or mismatched lists is refused") {
  {
    capnp::MallocMessageBuilder m;
    auto root = m.initRoot<schema::PullReply>();
    root.setTransferId(7);
    root.initRefused().setReason(static_cast<schema::RefusalReason>(99));
    CHECK(!DecodeReply(wire::Encode(m)).ok());
  }
  {
    // A union tag a newer schema might add: this one does not know it.
    capnp::MallocMessageBuilder m;
    auto root = m.initRoot<schema::PullReply>();
    root.setTransferId(7);
    root.setDone(1);
    std::string frame = wire::Encode(m);
    // The discriminant is the data section's second word's first 16 bits: after the segment
    // table, the root pointer and transferId.
    REQUIRE(frame[8 + 8 + 8] == 2);  // done
    frame[8 + 8 + 8] = 9;
    CHECK(!DecodeReply(frame).ok());
  }
  {
    capnp::MallocMessageBuilder m;
    auto root = m.initRoot<schema::PullReply>();
    root.setTransferId(7);
    auto w = root.initBlocks(1)[0];
    w.initData(2);
    w.initChecksums(1);
    CHECK(!DecodeReply(wire::Encode(m)).ok());
  }
  CHECK(!DecodeReply(EncodeDone(0, 1)).ok());
}

TEST_CASE("CheckBlock refuses a block out of order, of another hash, tokens or pools, and a bad checksum") {
  const PullRequest r = ExampleRequest();
  const Block good = ExampleBlock();
  CHECK(CheckBlock(r, good, 0, true).ok());
  CHECK(CheckBlock(r, good, 1, true).code() == StatusCode::kInvalidArgument);  // index 0 where 1 was due
  Block b = good;
  b.hash = 99;
  CHECK(CheckBlock(r, b, 0, true).code() == StatusCode::kInvalidArgument);
  b = good;
  b.tokens.push_back(5);
  CHECK(CheckBlock(r, b, 0, true).message().find("tokens") != std::string::npos);
  b = good;
  b.data.push_back(good.data[0]);
  b.checksums.push_back(good.checksums[0]);
  CHECK(CheckBlock(r, b, 0, true).message().find("pools") != std::string::npos);
  b = good;
  b.data[0].pop_back();
  CHECK(CheckBlock(r, b, 0, false).code() == StatusCode::kInvalidArgument);
  b = good;
  b.data[0][10] ^= std::byte{1};
  CHECK(CheckBlock(r, b, 0, false).ok());
  CHECK(CheckBlock(r, b, 0, true).code() == StatusCode::kDataLoss);
  b = good;
  b.index = 2;
  CHECK(CheckBlock(r, b, 2, true).message().find("beyond") != std::string::npos);

  PullRequest none = r;
  none.layout.dtype = KvDtype::kNone;
  Block empty = good;
  empty.data.clear();
  empty.checksums.clear();
  CHECK(CheckBlock(none, empty, 0, true).ok());
  CHECK(!CheckBlock(none, good, 0, true).ok());  // dtype none carries no bytes
}

TEST_CASE("EncodedBlockBytes bounds a blocks frame's size") {
  std::vector<Block> blocks(5, ExampleBlock());
  uint64_t bound = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].index = static_cast<uint32_t>(i);
    bound += EncodedBlockBytes(blocks[i]);
  }
  CHECK(EncodeBlocks(7, blocks).size() <= bound + 64);
}

// A holder streaming a run encodes views into its frame buffers: the frame must be the one
// the Blocks encoder writes, the spec's vector included.
BlockView ViewOf(const Block& b) {
  BlockView v{b.index, b.hash, b.tokens, {}, b.checksums};
  for (const auto& d : b.data) v.data.emplace_back(d);
  return v;
}

TEST_CASE("blocks encoded from views are byte for byte the frame encoded from Blocks") {
  const auto vectors = LoadTransferVectors();
  const Block example = ExampleBlock();
  const BlockView view = ViewOf(example);
  CHECK(EncodeBlocks(7, {&view, 1}) == vectors.at("blocks: the first block of the chain"));
  CHECK(CheckBlock(ExampleRequest(), view, 0, true).ok());

  // Several blocks of several pools, one of 3 MiB: frames over capnp's first segment.
  std::vector<Block> blocks(4, ExampleBlock());
  for (size_t i = 0; i < blocks.size(); ++i) {
    Block& b = blocks[i];
    b.index = static_cast<uint32_t>(i);
    b.data = {std::vector<std::byte>(i == 2 ? size_t{3} << 20 : 64 * (i + 1), static_cast<std::byte>(i + 1)),
              std::vector<std::byte>(40, std::byte{0x7f})};
    b.checksums = {Checksum(b.data[0]), Checksum(b.data[1])};
  }
  std::vector<BlockView> views;
  for (const Block& b : blocks) views.push_back(ViewOf(b));
  const std::string frame = EncodeBlocks(9, views);
  CHECK(frame == EncodeBlocks(9, blocks));
  // Built in the frame itself as one segment: its table says 0 more segments, and every byte of
  // the frame is the message (no slack past it).
  uint32_t table[2];
  std::memcpy(table, frame.data(), sizeof(table));
  CHECK(table[0] == 0);
  CHECK(frame.size() == 8 * (1 + uint64_t{table[1]}));
  auto decoded = DecodeReply(frame);
  REQUIRE(decoded.ok());
  CHECK(std::get<std::vector<Block>>(decoded->body) == blocks);

  Layout layout = ExampleRequest().layout;
  Block sized = ExampleBlock();
  CHECK(EncodedBlockBytes(layout) == EncodedBlockBytes(sized));
  layout.dtype = KvDtype::kNone;
  sized.data.clear();
  CHECK(EncodedBlockBytes(layout) == EncodedBlockBytes(sized));

  BlockView bad = view;
  bad.checksums[0] ^= 1;
  CHECK(CheckBlock(ExampleRequest(), bad, 0, true).code() == StatusCode::kDataLoss);
  CHECK(CheckBlock(ExampleRequest(), bad, 1, false).code() == StatusCode::kInvalidArgument);
}

// A same-host answer to ExampleRequest: both blocks, one pool, a 64-byte handle.
DeviceRun ExampleDeviceRun() {
  DeviceRun run;
  run.handles = {std::string(64, '\x11')};
  run.blocks = {DeviceBlock{0, 0x276a80ee59a83ca7ULL, {1, 2, 3, 4}, {17}},
                DeviceBlock{1, 0x48a3b26c8ba2c36dULL, {5, 6, 7, 8}, {3}}};
  return run;
}

TEST_CASE("a request without a host id or release keeps its first encoding; with a host id it round-trips") {
  // The vector's bytes come from the first schema: the later fields at their defaults add nothing.
  CHECK(EncodePullRequest(ExampleRequest()) == LoadTransferVectors().at("pull request"));
  PullRequest r = ExampleRequest();
  r.host_id = "gpu-node-3";
  const std::string frame = EncodePullRequest(r);
  CHECK(frame.size() > EncodePullRequest(ExampleRequest()).size());
  auto back = DecodeRequest(frame);
  REQUIRE(back.ok());
  CHECK(*back == r);
  CHECK_FALSE(back->release);

  // An old holder's reader sees the first fields of a new request unchanged.
  Aligned a(frame);
  auto msg = wire::Decode<schema::PullRequest>(a.data(), a.size);
  REQUIRE(msg.ok());
  CHECK((*msg)->Root<schema::PullRequest>().getDeadlineMs() == 2000);

  r.host_id = std::string(config::kMaxHostIdBytes, 'h');
  CHECK(DecodeRequest(EncodePullRequest(r)).ok());
  r.host_id.push_back('h');
  CHECK(DecodeRequest(EncodePullRequest(r)).status().code() == StatusCode::kOutOfRange);
}

TEST_CASE("a release frame needs only its transfer id") {
  auto back = DecodeRequest(EncodeRelease(7));
  REQUIRE(back.ok());
  CHECK(back->release);
  CHECK(back->transfer_id == 7);
  CHECK(back->hashes.empty());
  CHECK(back->model.empty());
  CHECK(ReadTransferId(Aligned(EncodeRelease(7)).data(), EncodeRelease(7).size()) == 7);
  // Through EncodePullRequest the other fields are written but ignored.
  PullRequest r = ExampleRequest();
  r.release = true;
  back = DecodeRequest(EncodePullRequest(r));
  REQUIRE(back.ok());
  CHECK(back->release);
  CHECK(back->hashes.empty());
  CHECK(DecodeRequest(EncodeRelease(0)).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a device run round-trips and matches the request it answers") {
  const DeviceRun run = ExampleDeviceRun();
  auto back = DecodeReply(EncodeDeviceRun(7, run));
  REQUIRE(back.ok());
  CHECK(back->transfer_id == 7);
  REQUIRE(std::holds_alternative<DeviceRun>(back->body));
  CHECK(std::get<DeviceRun>(back->body) == run);
  CHECK(CheckDeviceRun(ExampleRequest(), run).ok());

  DeviceRun shorter = run;
  shorter.blocks.resize(1);
  CHECK(CheckDeviceRun(ExampleRequest(), shorter).ok());
  shorter.blocks.clear();
  CHECK(CheckDeviceRun(ExampleRequest(), shorter).ok());  // nothing held: an empty run

  PullRequest two_pools = ExampleRequest();
  two_pools.layout.pools.push_back(PoolGeometry{4096, 2, 1, 2, 64});
  DeviceRun wide = run;
  wide.handles.push_back(std::string(64, '\x22'));
  for (DeviceBlock& b : wide.blocks) b.slots.push_back(5);
  back = DecodeReply(EncodeDeviceRun(9, wide));
  REQUIRE(back.ok());
  CHECK(std::get<DeviceRun>(back->body) == wide);
  CHECK(CheckDeviceRun(two_pools, wide).ok());
  CHECK(!CheckDeviceRun(ExampleRequest(), wide).ok());  // two handles for one pool
}

TEST_CASE("a device run over the limits or with mismatched slots does not decode") {
  auto fails = [](const DeviceRun& run) { return !DecodeReply(EncodeDeviceRun(7, run)).ok(); };
  DeviceRun run = ExampleDeviceRun();
  run.handles.clear();
  for (DeviceBlock& b : run.blocks) b.slots.clear();
  CHECK(fails(run));  // no handle
  run = ExampleDeviceRun();
  run.handles.assign(wire::limits::kMaxKvPools + 1, "h");
  for (DeviceBlock& b : run.blocks) b.slots.assign(run.handles.size(), 0);
  CHECK(fails(run));  // too many handles
  run = ExampleDeviceRun();
  run.handles[0] = std::string(config::kMaxDeviceHandleBytes, 'x');
  CHECK_FALSE(fails(run));
  run.handles[0].push_back('x');
  CHECK(fails(run));  // a handle too long
  run = ExampleDeviceRun();
  run.handles[0].clear();
  CHECK(fails(run));  // an empty handle
  run = ExampleDeviceRun();
  run.blocks[1].slots.push_back(4);
  CHECK(fails(run));  // two slots for one handle
  run = ExampleDeviceRun();
  run.blocks[0].slots.clear();
  CHECK(fails(run));
  run = ExampleDeviceRun();
  run.blocks[0].tokens.assign(config::kMaxBlockTokens + 1, 1);
  CHECK(fails(run));
  run = ExampleDeviceRun();
  run.blocks.assign(wire::limits::kMaxPullBlocks + 1, DeviceBlock{0, 1, {}, {0}});
  CHECK(fails(run));
  CHECK(fails(DeviceRun{}));
  CHECK(!DecodeReply(EncodeDeviceRun(0, ExampleDeviceRun())).ok());
}

TEST_CASE("CheckDeviceRun refuses a run out of order, of another hash, tokens, handles or slots") {
  const PullRequest r = ExampleRequest();
  auto code = [&](const DeviceRun& run) { return CheckDeviceRun(r, run).code(); };
  DeviceRun run = ExampleDeviceRun();
  std::swap(run.blocks[0], run.blocks[1]);
  CHECK(code(run) == StatusCode::kInvalidArgument);
  run = ExampleDeviceRun();
  run.blocks[1].hash ^= 1;
  CHECK(code(run) == StatusCode::kInvalidArgument);
  run = ExampleDeviceRun();
  run.blocks[0].tokens.pop_back();
  CHECK(CheckDeviceRun(r, run).message().find("tokens") != std::string::npos);
  run = ExampleDeviceRun();
  run.blocks[1].slots.push_back(1);
  CHECK(CheckDeviceRun(r, run).message().find("slots") != std::string::npos);
  run = ExampleDeviceRun();
  run.handles.push_back("h");
  CHECK(CheckDeviceRun(r, run).message().find("handles") != std::string::npos);
  run = ExampleDeviceRun();
  run.blocks.push_back(DeviceBlock{2, 99, {9, 10, 11, 12}, {1}});
  CHECK(CheckDeviceRun(r, run).message().find("chain of 2") != std::string::npos);
}

// An NCCL answer to ExampleRequest offering NCCL: both blocks, a new communicator.
NcclRun ExampleNcclRun() {
  NcclRun run;
  run.comm = 41;
  run.unique_id = std::string(config::kNcclUniqueIdBytes, '\x5a');
  run.blocks = {DeviceBlock{0, 0x276a80ee59a83ca7ULL, {1, 2, 3, 4}, {}},
                DeviceBlock{1, 0x48a3b26c8ba2c36dULL, {5, 6, 7, 8}, {}}};
  return run;
}

TEST_CASE("a request offering NCCL round-trips; an old holder reads the fields it knows, and an old receiver's request offers none") {
  PullRequest r = ExampleRequest();
  r.nccl = true;
  r.nccl_comm = 41;
  const std::string frame = EncodePullRequest(r);
  auto back = DecodeRequest(frame);
  REQUIRE(back.ok());
  CHECK(*back == r);
  CHECK(back->host_id.empty());
  // An old holder's reader: every field up to release unchanged, the new ones unseen.
  Aligned a(frame);
  auto msg = wire::Decode<schema::PullRequest>(a.data(), a.size);
  REQUIRE(msg.ok());
  auto old = (*msg)->Root<schema::PullRequest>();
  CHECK(old.getDeadlineMs() == 2000);
  CHECK(old.getHashes().size() == 2);
  CHECK_FALSE(old.getRelease());
  // An old receiver's request (the first encoding, the vector's bytes) offers no NCCL.
  back = DecodeRequest(LoadTransferVectors().at("pull request"));
  REQUIRE(back.ok());
  CHECK_FALSE(back->nccl);
  CHECK(back->nccl_comm == 0);
  // Only the communicator named (a receiver that keeps one) is enough to leave the first encoding.
  r.nccl = false;
  CHECK(EncodePullRequest(r) != EncodePullRequest(ExampleRequest()));
  CHECK(DecodeRequest(EncodePullRequest(r))->nccl_comm == 41);
}

TEST_CASE("an nccl run round-trips and matches the request it answers") {
  PullRequest r = ExampleRequest();
  r.nccl = true;
  const NcclRun run = ExampleNcclRun();
  auto back = DecodeReply(EncodeNcclRun(7, run));
  REQUIRE(back.ok());
  CHECK(back->transfer_id == 7);
  REQUIRE(std::holds_alternative<NcclRun>(back->body));
  CHECK(std::get<NcclRun>(back->body) == run);
  CHECK(CheckNcclRun(r, run).ok());
  // The communicator the request named, reused: no unique id.
  NcclRun reuse = run;
  reuse.unique_id.clear();
  back = DecodeReply(EncodeNcclRun(7, reuse));
  REQUIRE(back.ok());
  CHECK(std::get<NcclRun>(back->body) == reuse);
  CHECK(!CheckNcclRun(r, reuse).ok());  // the request named none
  r.nccl_comm = 41;
  CHECK(CheckNcclRun(r, reuse).ok());
  r.nccl_comm = 40;
  CHECK(CheckNcclRun(r, reuse).message().find("did not name") != std::string::npos);
  CHECK(CheckNcclRun(r, run).ok());  // a new communicator replaces the one named
  NcclRun empty = run;
  empty.blocks.clear();
  CHECK(CheckNcclRun(r, empty).ok());
}

TEST_CASE("an nccl run that breaks Contract 4 does not decode or fails CheckNcclRun") {
  auto fails = [](const NcclRun& run) { return !DecodeReply(EncodeNcclRun(7, run)).ok(); };
  NcclRun run = ExampleNcclRun();
  run.comm = 0;
  CHECK(fails(run));
  run = ExampleNcclRun();
  run.unique_id.pop_back();
  CHECK(fails(run));  // not an ncclUniqueId's size
  run = ExampleNcclRun();
  run.blocks[0].slots = {3};
  CHECK(fails(run));  // the receiver names its own blocks
  run = ExampleNcclRun();
  run.blocks.assign(wire::limits::kMaxPullBlocks + 1, DeviceBlock{0, 1, {}, {}});
  CHECK(fails(run));

  PullRequest r = ExampleRequest();
  auto check = [&](const NcclRun& run) { return CheckNcclRun(r, run).message(); };
  CHECK(check(ExampleNcclRun()).find("did not offer NCCL") != std::string::npos);
  r.nccl = true;
  run = ExampleNcclRun();
  std::swap(run.blocks[0], run.blocks[1]);
  CHECK(check(run).find("out of order") != std::string::npos);
  run = ExampleNcclRun();
  run.blocks[1].hash ^= 1;
  CHECK(check(run).find("hash") != std::string::npos);
  run = ExampleNcclRun();
  run.blocks[0].tokens.pop_back();
  CHECK(check(run).find("tokens") != std::string::npos);
  run = ExampleNcclRun();
  run.blocks.push_back(DeviceBlock{2, 99, {9, 10, 11, 12}, {}});
  CHECK(check(run).find("chain of 2") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::transfer
