#include "schema/transfer_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <capnp/any.h>
#include <capnp/message.h>
#include <xxhash.h>

#include "common/check.h"
#include "schema/limits.h"
#include "schema/transfer.capnp.h"
#include "schema/wire.h"

namespace kvfleet::transfer {

namespace {

namespace limits = wire::limits;

// A block's frame share beyond its bytes: index, hash and the three list pointers (5 words),
// the lists' tags, each data's pointer, each checksum word, padding of each data to a word.
constexpr uint64_t kBlockOverheadBytes = 5 * 8 + 3 * 8;

schema::KvDtype ToWire(KvDtype d) {
  switch (d) {
    case KvDtype::kBf16: return schema::KvDtype::BF16;
    case KvDtype::kFp8E4M3: return schema::KvDtype::FP8E4M3;
    case KvDtype::kFp32: return schema::KvDtype::FP32;
    case KvDtype::kNone: return schema::KvDtype::NONE;
  }
  return schema::KvDtype::NONE;
}

Result<KvDtype> FromWire(schema::KvDtype d) {
  switch (d) {
    case schema::KvDtype::BF16: return KvDtype::kBf16;
    case schema::KvDtype::FP8E4M3: return KvDtype::kFp8E4M3;
    case schema::KvDtype::FP32: return KvDtype::kFp32;
    case schema::KvDtype::NONE: return KvDtype::kNone;
  }
  return InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(d)));
}

Result<RefusalReason> FromWire(schema::RefusalReason r) {
  const auto v = static_cast<uint16_t>(r);
  if (v >= kNumRefusalReasons) return InvalidArgument("unknown refusal reason " + std::to_string(v));
  return static_cast<RefusalReason>(v);
}

Result<std::string> ReadName(capnp::Text::Reader text, size_t max, const char* what) {
  if (text.size() > max) return OutOfRange(std::string(what) + " longer than " + std::to_string(max) + " bytes");
  return wire::FromText(text);
}

// Contract 4's first PullRequest struct: 3 data words (transferId; blockSize and deadlineMs;
// parentHash) and 3 pointers (hashNamespace, hashes, layout), fields @0..@6. Cap'n Proto
// builders always write a struct at its schema's full size; a request that sets none of the
// later fields is written at this one instead, the bytes every encoder wrote before them.
constexpr uint16_t kFirstRequestDataWords = 3;
constexpr uint16_t kFirstRequestPointers = 3;

// Writes fields @0..@6 only: `out` may be a struct of the first size, which holds no more.
void WriteRequestFields(schema::PullRequest::Builder out, const PullRequest& r) {
  out.setTransferId(r.transfer_id);
  auto ns = out.initHashNamespace();
  ns.setModel(wire::AsText(r.model));
  ns.setLora(wire::AsText(r.lora));
  ns.setCacheSalt(wire::AsText(r.cache_salt));
  out.setBlockSize(r.block_size);
  out.setParentHash(r.parent_hash);
  auto hashes = out.initHashes(static_cast<unsigned>(r.hashes.size()));
  for (size_t i = 0; i < r.hashes.size(); ++i) hashes.set(static_cast<unsigned>(i), r.hashes[i]);
  auto layout = out.initLayout();
  layout.setDtype(ToWire(r.layout.dtype));
  layout.setBlockSize(r.layout.block_size);
  auto pools = layout.initPools(static_cast<unsigned>(r.layout.pools.size()));
  for (size_t i = 0; i < r.layout.pools.size(); ++i) {
    const PoolGeometry& p = r.layout.pools[i];
    auto w = pools[static_cast<unsigned>(i)];
    w.setWindow(p.window);
    w.setLayers(p.layers);
    w.setKvHeads(p.kv_heads);
    w.setHeadDim(p.head_dim);
    w.setBytesPerBlock(p.bytes_per_block);
  }
  out.setDeadlineMs(r.deadline_ms);
}

// The largest pool block a frame can carry next to one block's other fields.
constexpr uint64_t kMaxPoolBlockBytes = limits::kMaxTransferBytes - limits::kSlackBytes;

Status CheckLayout(const Layout& layout) {
  if (layout.pools.empty()) return InvalidArgument("layout with no pool");
  if (layout.pools.size() > static_cast<size_t>(limits::kMaxKvPools)) {
    return OutOfRange("layout with " + std::to_string(layout.pools.size()) + " pools, more than " +
                      std::to_string(limits::kMaxKvPools));
  }
  uint64_t total = 0;
  for (const PoolGeometry& p : layout.pools) {
    if (p.bytes_per_block == 0) return InvalidArgument("pool of window " + std::to_string(p.window) + " with 0 bytes a block");
    if (p.bytes_per_block > kMaxPoolBlockBytes) {
      return OutOfRange("pool block of " + std::to_string(p.bytes_per_block) + " bytes, over a frame's " +
                        std::to_string(kMaxPoolBlockBytes));
    }
    total += p.bytes_per_block;
  }
  if (layout.dtype != KvDtype::kNone && total > kMaxPoolBlockBytes) {
    return OutOfRange("a block of " + std::to_string(total) + " bytes over every pool does not fit a frame");
  }
  return Status::Ok();
}

}  // namespace

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kBf16: return "bf16";
    case KvDtype::kFp8E4M3: return "fp8e4m3";
    case KvDtype::kFp32: return "fp32";
    case KvDtype::kNone: return "none";
  }
  return "?";
}

std::optional<KvDtype> ParseKvDtype(std::string_view name) {
  for (KvDtype d : {KvDtype::kBf16, KvDtype::kFp8E4M3, KvDtype::kFp32, KvDtype::kNone}) {
    if (KvDtypeName(d) == name) return d;
  }
  return std::nullopt;
}

std::string_view RefusalReasonName(RefusalReason reason) {
  switch (reason) {
    case RefusalReason::kNotHeld: return "not-held";
    case RefusalReason::kLayoutMismatch: return "layout-mismatch";
    case RefusalReason::kUnauthorized: return "unauthorized";
    case RefusalReason::kMalformed: return "malformed";
    case RefusalReason::kBusy: return "busy";
    case RefusalReason::kShuttingDown: return "shutting-down";
    case RefusalReason::kTooLarge: return "too-large";
  }
  return "?";
}

uint64_t Layout::BytesPerBlock() const {
  uint64_t total = 0;
  for (const PoolGeometry& p : pools) total += p.bytes_per_block;
  return total;
}

uint64_t Checksum(std::span<const std::byte> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

std::string EncodePullRequest(const PullRequest& r) {
  capnp::MallocMessageBuilder message;
  if (r.host_id.empty() && !r.release && !r.nccl && r.nccl_comm == 0) {
    auto first = message.getRoot<capnp::AnyPointer>().initAsAnyStruct(kFirstRequestDataWords, kFirstRequestPointers);
    WriteRequestFields(first.as<schema::PullRequest>(), r);
    return wire::Encode(message);
  }
  auto out = message.initRoot<schema::PullRequest>();
  WriteRequestFields(out, r);
  out.setHostId(wire::AsText(r.host_id));
  out.setRelease(r.release);
  out.setNccl(r.nccl);
  out.setNcclComm(r.nccl_comm);
  return wire::Encode(message);
}

std::string EncodeRelease(uint64_t transfer_id) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<schema::PullRequest>();
  out.setTransferId(transfer_id);
  out.setRelease(true);
  return wire::Encode(message);
}

Result<PullRequest> DecodePullRequest(const void* data, size_t size) {
  if (size > static_cast<size_t>(limits::kMaxPullRequestBytes)) {
    return OutOfRange("pull request of " + std::to_string(size) + " bytes");
  }
  auto msg = wire::Decode<schema::PullRequest>(data, size);
  if (!msg.ok()) return msg.status();
  return wire::Guard([&]() -> Result<PullRequest> {
    auto in = (*msg)->Root<schema::PullRequest>();
    PullRequest r;
    r.transfer_id = in.getTransferId();
    if (r.transfer_id == 0) return InvalidArgument("pull request with transfer id 0");
    if (in.getRelease()) {
      r.release = true;
      return r;
    }
    auto ns = in.getHashNamespace();
    KVF_ASSIGN_OR_RETURN(r.model, ReadName(ns.getModel(), limits::kMaxNameBytes, "model"));
    if (r.model.empty()) return InvalidArgument("pull request with no model");
    KVF_ASSIGN_OR_RETURN(r.lora, ReadName(ns.getLora(), limits::kMaxNameBytes, "lora"));
    KVF_ASSIGN_OR_RETURN(r.cache_salt, ReadName(ns.getCacheSalt(), limits::kMaxPathBytes, "cache salt"));
    r.block_size = in.getBlockSize();
    if (!IsValidBlockSize(r.block_size) || r.block_size > config::kMaxBlockTokens) {
      return InvalidArgument("block size " + std::to_string(r.block_size) + " is not a power of two up to " +
                             std::to_string(config::kMaxBlockTokens));
    }
    r.parent_hash = in.getParentHash();
    auto hashes = in.getHashes();
    if (hashes.size() == 0) return InvalidArgument("pull request for no block");
    if (hashes.size() > static_cast<size_t>(limits::kMaxPullBlocks)) {
      return OutOfRange("pull request for " + std::to_string(hashes.size()) + " blocks, more than " +
                        std::to_string(limits::kMaxPullBlocks));
    }
    r.hashes.resize(hashes.size());
    for (unsigned i = 0; i < hashes.size(); ++i) {
      r.hashes[i] = hashes[i];
      if (r.hashes[i] == 0) return InvalidArgument("hash 0 (the root) at position " + std::to_string(i));
    }
    auto layout = in.getLayout();
    KVF_ASSIGN_OR_RETURN(r.layout.dtype, FromWire(layout.getDtype()));
    r.layout.block_size = layout.getBlockSize();
    if (r.layout.block_size != r.block_size) {
      return InvalidArgument("layout block size " + std::to_string(r.layout.block_size) + " differs from block size " +
                             std::to_string(r.block_size));
    }
    auto pools = layout.getPools();
    if (pools.size() > static_cast<size_t>(limits::kMaxKvPools)) {
      return OutOfRange("layout with " + std::to_string(pools.size()) + " pools");
    }
    r.layout.pools.resize(pools.size());
    for (unsigned i = 0; i < pools.size(); ++i) {
      auto p = pools[i];
      r.layout.pools[i] = {p.getWindow(), p.getLayers(), p.getKvHeads(), p.getHeadDim(), p.getBytesPerBlock()};
    }
    KVF_RETURN_IF_ERROR(CheckLayout(r.layout));
    r.deadline_ms = in.getDeadlineMs();
    if (r.deadline_ms == 0) return InvalidArgument("pull request with deadline 0");
    KVF_ASSIGN_OR_RETURN(r.host_id, ReadName(in.getHostId(), config::kMaxHostIdBytes, "host id"));
    r.nccl = in.getNccl();
    r.nccl_comm = in.getNcclComm();
    return r;
  });
}

uint64_t ReadTransferId(const void* data, size_t size) {
  auto msg = wire::Decode<schema::PullRequest>(data, size);
  if (!msg.ok()) return 0;
  auto id = wire::Guard([&]() -> Result<uint64_t> { return (*msg)->Root<schema::PullRequest>().getTransferId(); });
  return id.ok() ? *id : 0;
}

std::string EncodeRefused(uint64_t transfer_id, RefusalReason reason, std::string_view message) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<schema::PullReply>();
  out.setTransferId(transfer_id);
  auto refused = out.initRefused();
  refused.setReason(static_cast<schema::RefusalReason>(reason));
  refused.setMessage(capnp::Text::Reader(message.data(), message.size()));
  return wire::Encode(builder);
}

namespace {

// A `blocks` reply's blocks, from Blocks or BlockViews alike.
template <typename B>
void FillBlocks(uint64_t transfer_id, std::span<const B> blocks, capnp::MessageBuilder& builder) {
  auto out = builder.initRoot<schema::PullReply>();
  out.setTransferId(transfer_id);
  auto list = out.initBlocks(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    const B& b = blocks[i];
    KVF_CHECK(b.data.size() == b.checksums.size());
    auto w = list[static_cast<unsigned>(i)];
    w.setIndex(b.index);
    w.setHash(b.hash);
    auto tokens = w.initTokens(static_cast<unsigned>(b.tokens.size()));
    for (size_t j = 0; j < b.tokens.size(); ++j) tokens.set(static_cast<unsigned>(j), b.tokens[j]);
    // Each list then its contents, in field order: the bytes capnp's own encoder writes.
    auto data = w.initData(static_cast<unsigned>(b.data.size()));
    for (size_t j = 0; j < b.data.size(); ++j) {
      const auto& bytes = b.data[j];
      data.set(static_cast<unsigned>(j),
               capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(bytes.data()), bytes.size()));
    }
    auto sums = w.initChecksums(static_cast<unsigned>(b.checksums.size()));
    for (size_t j = 0; j < b.checksums.size(); ++j) sums.set(static_cast<unsigned>(j), b.checksums[j]);
  }
}

// A `blocks` reply's root and list beyond its blocks: the root pointer, the reply's struct (its
// transfer id and union tag, the list pointer) and the list's tag.
constexpr uint64_t kBlocksReplyOverheadBytes = 8 + 3 * 8 + 8;

// EncodedBlockBytes of a Block or a BlockView.
template <typename B>
uint64_t EncodedBytesOf(const B& b) {
  uint64_t bytes = kBlockOverheadBytes + (b.tokens.size() * 4 + 7) / 8 * 8;
  for (const auto& d : b.data) bytes += (d.size() + 7) / 8 * 8 + 8 + 8;  // padded bytes, pointer, checksum
  return bytes;
}

// Builds a message in zeroed words the caller owns and leaves them as built (capnp's
// MallocMessageBuilder zeroes a first segment it was given when it is destroyed); a message that
// outgrows them gets segments of its own, and `in_place()` is then false.
class InPlaceBuilder final : public capnp::MessageBuilder {
 public:
  explicit InPlaceBuilder(kj::ArrayPtr<capnp::word> words) : words_(words) {}
  kj::ArrayPtr<capnp::word> allocateSegment(unsigned minimum) override {
    if (!given_ && minimum <= words_.size()) {
      given_ = true;
      return words_;
    }
    given_ = true;
    more_.push_back(kj::heapArray<capnp::word>(std::max<size_t>(minimum, 1024)));
    std::memset(more_.back().begin(), 0, more_.back().size() * sizeof(capnp::word));
    return more_.back();
  }
  bool in_place() const { return more_.empty(); }

 private:
  kj::ArrayPtr<capnp::word> words_;
  bool given_ = false;
  std::vector<kj::Array<capnp::word>> more_;
};

// A holder's frames are megabytes: the message is built as the frame's one segment, in the
// string it is sent from, after the 8 bytes of its segment table. Left to grow its own segments,
// the builder copied the blocks' bytes into them and wire::Encode copied them all again into the
// frame. The bytes are those capnp's own builder writes for a message of one segment, from
// Blocks or BlockViews alike.
template <typename B>
std::string EncodeBlocksOf(uint64_t transfer_id, std::span<const B> blocks) {
  uint64_t bound = kBlocksReplyOverheadBytes;
  for (const B& b : blocks) bound += EncodedBytesOf(b);
  std::string out(sizeof(capnp::word) + bound, '\0');  // zeroed, as a builder's segment must be
  capnp::word* segment = reinterpret_cast<capnp::word*>(out.data() + sizeof(capnp::word));
  KVF_CHECK(reinterpret_cast<uintptr_t>(segment) % alignof(capnp::word) == 0);
  InPlaceBuilder builder(kj::arrayPtr(segment, bound / sizeof(capnp::word)));
  FillBlocks(transfer_id, blocks, builder);
  if (!builder.in_place()) return wire::Encode(builder);  // past the bound, which is an upper one
  const auto words = static_cast<uint32_t>(builder.getSegmentsForOutput()[0].size());
  const uint32_t table[2] = {0, words};  // one segment (count - 1), of `words` words
  std::memcpy(out.data(), table, sizeof(table));
  out.resize(sizeof(capnp::word) * (1 + uint64_t{words}));
  return out;
}

}  // namespace

std::string EncodeBlocks(uint64_t transfer_id, std::span<const Block> blocks) {
  return EncodeBlocksOf(transfer_id, blocks);
}

std::string EncodeBlocks(uint64_t transfer_id, std::span<const BlockView> blocks) {
  return EncodeBlocksOf(transfer_id, blocks);
}

std::string EncodeDone(uint64_t transfer_id, uint32_t count) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<schema::PullReply>();
  out.setTransferId(transfer_id);
  out.setDone(count);
  return wire::Encode(builder);
}

namespace {

void WriteDeviceBlocks(capnp::List<schema::DeviceBlock>::Builder list, std::span<const DeviceBlock> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const DeviceBlock& b = blocks[i];
    auto w = list[static_cast<unsigned>(i)];
    w.setIndex(b.index);
    w.setHash(b.hash);
    auto tokens = w.initTokens(static_cast<unsigned>(b.tokens.size()));
    for (size_t j = 0; j < b.tokens.size(); ++j) tokens.set(static_cast<unsigned>(j), b.tokens[j]);
    auto slots = w.initSlots(static_cast<unsigned>(b.slots.size()));
    for (size_t j = 0; j < b.slots.size(); ++j) slots.set(static_cast<unsigned>(j), b.slots[j]);
  }
}

}  // namespace

std::string EncodeDeviceRun(uint64_t transfer_id, const DeviceRun& run) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<schema::PullReply>();
  out.setTransferId(transfer_id);
  auto device = out.initDevice();
  auto handles = device.initHandles(static_cast<unsigned>(run.handles.size()));
  for (size_t i = 0; i < run.handles.size(); ++i) {
    const std::string& h = run.handles[i];
    handles.set(static_cast<unsigned>(i), capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(h.data()), h.size()));
  }
  WriteDeviceBlocks(device.initBlocks(static_cast<unsigned>(run.blocks.size())), run.blocks);
  return wire::Encode(builder);
}

std::string EncodeNcclRun(uint64_t transfer_id, const NcclRun& run) {
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<schema::PullReply>();
  out.setTransferId(transfer_id);
  auto nccl = out.initNccl();
  nccl.setComm(run.comm);
  nccl.setUniqueId(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(run.unique_id.data()), run.unique_id.size()));
  WriteDeviceBlocks(nccl.initBlocks(static_cast<unsigned>(run.blocks.size())), run.blocks);
  return wire::Encode(builder);
}

namespace {

// A device or nccl run's blocks, each with `slots` slots.
Result<std::vector<DeviceBlock>> ReadDeviceBlocks(capnp::List<schema::DeviceBlock>::Reader list, size_t slots_each) {
  if (list.size() > static_cast<size_t>(limits::kMaxPullBlocks)) {
    return InvalidArgument("device run of " + std::to_string(list.size()) + " blocks, more than " +
                           std::to_string(limits::kMaxPullBlocks));
  }
  std::vector<DeviceBlock> blocks(list.size());
  for (unsigned i = 0; i < list.size(); ++i) {
    auto w = list[i];
    DeviceBlock& b = blocks[i];
    b.index = w.getIndex();
    b.hash = w.getHash();
    auto tokens = w.getTokens();
    if (tokens.size() > config::kMaxBlockTokens) return InvalidArgument("device block with too many tokens");
    b.tokens.resize(tokens.size());
    for (unsigned j = 0; j < tokens.size(); ++j) b.tokens[j] = tokens[j];
    auto slots = w.getSlots();
    if (slots.size() != slots_each) {
      return InvalidArgument("device block " + std::to_string(b.index) + " with " + std::to_string(slots.size()) +
                             " slots, not " + std::to_string(slots_each));
    }
    b.slots.resize(slots.size());
    for (unsigned j = 0; j < slots.size(); ++j) b.slots[j] = slots[j];
  }
  return blocks;
}

Result<DeviceRun> ReadDeviceRun(schema::DeviceRun::Reader in) {
  DeviceRun run;
  auto handles = in.getHandles();
  if (handles.size() == 0) return InvalidArgument("device run with no handle");
  if (handles.size() > static_cast<size_t>(limits::kMaxKvPools)) {
    return InvalidArgument("device run with " + std::to_string(handles.size()) + " handles, more than " +
                           std::to_string(limits::kMaxKvPools));
  }
  run.handles.resize(handles.size());
  for (unsigned i = 0; i < handles.size(); ++i) {
    auto h = handles[i];
    if (h.size() == 0 || h.size() > config::kMaxDeviceHandleBytes) {
      return InvalidArgument("device handle " + std::to_string(i) + " of " + std::to_string(h.size()) +
                             " bytes, not 1 to " + std::to_string(config::kMaxDeviceHandleBytes));
    }
    run.handles[i].assign(reinterpret_cast<const char*>(h.begin()), h.size());
  }
  KVF_ASSIGN_OR_RETURN(run.blocks, ReadDeviceBlocks(in.getBlocks(), handles.size()));
  return run;
}

Result<NcclRun> ReadNcclRun(schema::NcclRun::Reader in) {
  NcclRun run;
  run.comm = in.getComm();
  if (run.comm == 0) return InvalidArgument("nccl run with communicator 0");
  auto id = in.getUniqueId();
  if (id.size() != 0 && id.size() != config::kNcclUniqueIdBytes) {
    return InvalidArgument("nccl unique id of " + std::to_string(id.size()) + " bytes, not " +
                           std::to_string(config::kNcclUniqueIdBytes));
  }
  run.unique_id.assign(reinterpret_cast<const char*>(id.begin()), id.size());
  KVF_ASSIGN_OR_RETURN(run.blocks, ReadDeviceBlocks(in.getBlocks(), 0));
  return run;
}

}  // namespace

Block ToBlock(const BlockView& v) {
  Block b;
  b.index = v.index;
  b.hash = v.hash;
  b.tokens.assign(v.tokens.begin(), v.tokens.end());
  b.data.reserve(v.data.size());
  for (std::span<const std::byte> d : v.data) b.data.emplace_back(d.begin(), d.end());
  b.checksums = v.checksums;
  return b;
}

Result<PullReply> DecodePullReply(const void* data, size_t size) {
  BlockFrame frame;
  KVF_ASSIGN_OR_RETURN(PullReply reply, DecodePullReply(data, size, &frame));
  if (auto* blocks = std::get_if<std::vector<Block>>(&reply.body)) {
    blocks->reserve(frame.blocks.size());
    for (const BlockView& v : frame.blocks) blocks->push_back(ToBlock(v));
  }
  return reply;
}

Result<PullReply> DecodePullReply(const void* data, size_t size, BlockFrame* frame) {
  // Read in place: a frame is up to 64 MiB, and its blocks' bytes are read where they lie.
  auto decoded = wire::DecodeInPlace<schema::PullReply>(data, size);
  if (!decoded.ok()) return decoded.status();
  std::shared_ptr<wire::DecodedMessage> msg = std::move(*decoded);
  return wire::Guard([&]() -> Result<PullReply> {
    auto in = msg->Root<schema::PullReply>();
    PullReply reply;
    reply.transfer_id = in.getTransferId();
    if (reply.transfer_id == 0) return InvalidArgument("pull reply with transfer id 0");
    switch (in.which()) {
      case schema::PullReply::REFUSED: {
        auto r = in.getRefused();
        Refusal refusal;
        KVF_ASSIGN_OR_RETURN(refusal.reason, FromWire(r.getReason()));
        KVF_ASSIGN_OR_RETURN(refusal.message, ReadName(r.getMessage(), limits::kMaxPathBytes, "refusal message"));
        reply.body = std::move(refusal);
        return reply;
      }
      case schema::PullReply::BLOCKS: {
        auto list = in.getBlocks();
        // A zero-sized struct costs its sender nothing: a real block takes words of its own,
        // so the frame's size in words bounds how many it can honestly hold.
        if (list.size() > size / sizeof(capnp::word)) return DataLoss("pull reply with empty block entries");
        std::vector<BlockView> blocks(list.size());
        std::vector<size_t> token_at(list.size() + 1, 0);
        std::vector<TokenId> tokens;
        for (unsigned i = 0; i < list.size(); ++i) {
          auto w = list[i];
          BlockView& b = blocks[i];
          b.index = w.getIndex();
          b.hash = w.getHash();
          auto t = w.getTokens();
          if (t.size() > config::kMaxBlockTokens) return InvalidArgument("block with too many tokens");
          for (unsigned j = 0; j < t.size(); ++j) tokens.push_back(t[j]);
          token_at[i + 1] = tokens.size();
          auto bytes = w.getData();
          auto sums = w.getChecksums();
          if (bytes.size() > static_cast<size_t>(limits::kMaxKvPools)) return InvalidArgument("block with too many pools");
          if (bytes.size() != sums.size()) {
            return InvalidArgument("block " + std::to_string(b.index) + " with " + std::to_string(bytes.size()) +
                                   " data and " + std::to_string(sums.size()) + " checksums");
          }
          b.data.resize(bytes.size());
          b.checksums.resize(sums.size());
          for (unsigned j = 0; j < bytes.size(); ++j) {
            auto d = bytes[j];
            b.data[j] = std::span(reinterpret_cast<const std::byte*>(d.begin()), d.size());
            b.checksums[j] = sums[j];
          }
        }
        frame->tokens = std::move(tokens);
        for (size_t i = 0; i < blocks.size(); ++i) {
          blocks[i].tokens = std::span<const TokenId>(frame->tokens).subspan(token_at[i], token_at[i + 1] - token_at[i]);
        }
        frame->blocks = std::move(blocks);
        frame->message = std::move(msg);
        reply.body = std::vector<Block>();
        return reply;
      }
      case schema::PullReply::DONE:
        reply.body = Done{in.getDone()};
        return reply;
      case schema::PullReply::DEVICE: {
        KVF_ASSIGN_OR_RETURN(DeviceRun run, ReadDeviceRun(in.getDevice()));
        reply.body = std::move(run);
        return reply;
      }
      case schema::PullReply::NCCL: {
        KVF_ASSIGN_OR_RETURN(NcclRun run, ReadNcclRun(in.getNccl()));
        reply.body = std::move(run);
        return reply;
      }
    }
    return InvalidArgument("pull reply of unknown kind " + std::to_string(static_cast<int>(in.which())));
  });
}

uint64_t EncodedBlockBytes(const Block& b) { return EncodedBytesOf(b); }

uint64_t EncodedBlockBytes(const Layout& layout) {
  uint64_t bytes = kBlockOverheadBytes + (uint64_t{layout.block_size} * 4 + 7) / 8 * 8;
  if (layout.dtype == KvDtype::kNone) return bytes;
  for (const PoolGeometry& p : layout.pools) bytes += (p.bytes_per_block + 7) / 8 * 8 + 8 + 8;
  return bytes;
}

}  // namespace kvfleet::transfer
