// Transfer codec: Contract 4's messages (schema/transfer.capnp) <-> C++ values. A receiver
// sends a PullRequest for a chain of KV blocks; the holder answers with `blocks` frames and a
// `done`, or one `refused`, or (same host) one `device` frame of IPC handles and slots, which
// the receiver later releases with a release frame.
//
// The one encoder and decoder of every Contract 4 message, used by both sides
// (worker/transfer). Decoding never trusts its input: a frame that does not decode, or breaks
// a rule of schema/README.md (Contract 4), is a Status, never a crash. The codes say which
// refusal a holder answers with: OutOfRange for a request over the limits (tooLarge), every
// other error malformed.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"

namespace kvfleet::transfer {

namespace config {
// Tokens per KV block on the wire; block sizes are far smaller (Contract 1: 16 to 64).
constexpr uint32_t kMaxBlockTokens = 1 << 16;
// An IPC handle of one device pool: opaque bytes (cudaIpcMemHandle_t is 64), with room for
// larger handle kinds.
constexpr size_t kMaxDeviceHandleBytes = 256;
// PullRequest::host_id: a host name or machine id.
constexpr size_t kMaxHostIdBytes = 256;
// NcclRun::unique_id: an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
constexpr size_t kNcclUniqueIdBytes = 128;
}  // namespace config

enum class KvDtype : uint8_t { kBf16, kFp8E4M3, kFp32, kNone };
std::string_view KvDtypeName(KvDtype dtype);
// The dtype KvDtypeName names `name`; nullopt for any other string.
std::optional<KvDtype> ParseKvDtype(std::string_view name);

struct PoolGeometry {
  uint32_t window = 0;  // 0 = full attention
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint64_t bytes_per_block = 0;  // K and V of every layer of one block, scales included
  bool operator==(const PoolGeometry&) const = default;
};

struct Layout {
  KvDtype dtype = KvDtype::kBf16;
  uint32_t block_size = 0;            // tokens per block
  std::vector<PoolGeometry> pools;    // Block::data follows this order
  bool operator==(const Layout&) const = default;
  // Bytes one block takes over every pool (modelled ones for kNone).
  uint64_t BytesPerBlock() const;
};

// Why a holder refused; ordinals are the wire's.
enum class RefusalReason : uint8_t {
  kNotHeld,
  kLayoutMismatch,
  kUnauthorized,
  kMalformed,
  kBusy,
  kShuttingDown,
  kTooLarge,
};
inline constexpr size_t kNumRefusalReasons = 7;
std::string_view RefusalReasonName(RefusalReason reason);

struct PullRequest {
  uint64_t transfer_id = 0;  // chosen by the receiver, non-zero
  std::string model;         // the Contract 1 namespace
  std::string lora;
  std::string cache_salt;
  uint32_t block_size = 0;           // Contract 1's B; equals layout.block_size
  BlockHash parent_hash = 0;         // the block before hashes[0]; 0 = the root
  std::vector<BlockHash> hashes;     // the chain wanted, in order; none is 0
  Layout layout;                     // the receiver's
  uint32_t deadline_ms = 0;          // the receiver gives up this long after sending; > 0
  // The receiver's host; non-empty: it can copy device blocks from a holder on the same host,
  // which may then answer with a DeviceRun. Empty: blocks over the wire only.
  std::string host_id;
  // A release frame: the receiver has copied the DeviceRun of transfer_id and the holder may
  // unpin it. Every other field is unset and ignored.
  bool release = false;
  // The receiver can receive blocks by NCCL send/recv: the holder may answer with an NcclRun.
  bool nccl = false;
  // The holder's number (NcclRun::comm) of the communicator this receiver keeps with it; 0: none.
  uint64_t nccl_comm = 0;
  bool operator==(const PullRequest&) const = default;
};

struct Block {
  uint32_t index = 0;                        // position in the request's hashes
  BlockHash hash = 0;                        // = hashes[index]
  std::vector<TokenId> tokens;               // the block's block_size tokens
  std::vector<std::vector<std::byte>> data;  // one per pool; none for KvDtype::kNone
  std::vector<uint64_t> checksums;           // Checksum(data[i])
  bool operator==(const Block&) const = default;
};

// A block as EncodeBlocks reads it, its tokens and bytes in memory the caller keeps (a
// holder's frame buffer, reused frame after frame): no copy into a Block first. Encodes to
// the same bytes as a Block with the same contents.
struct BlockView {
  uint32_t index = 0;
  BlockHash hash = 0;
  std::span<const TokenId> tokens;
  std::vector<std::span<const std::byte>> data;  // one per pool; none for KvDtype::kNone
  std::vector<uint64_t> checksums;               // Checksum(data[i])
};

// A `blocks` frame's blocks as views over the frame itself (DecodePullReply with a
// BlockFrame): a receiver checks them and copies each block's bytes once, where they go, with
// no Block of its own in between. Each view's data points into the frame's bytes (or into
// `message`'s aligned copy of them), so the views are valid while both live unchanged.
struct BlockFrame {
  std::vector<BlockView> blocks;
  std::vector<TokenId> tokens;           // every block's tokens, back to back: the views' tokens
  std::shared_ptr<const void> message;   // the decoded message the views read
};

// A Block holding copies of `v`'s tokens and bytes.
Block ToBlock(const BlockView& v);

struct Refusal {
  RefusalReason reason = RefusalReason::kMalformed;
  std::string message;
};

// The last frame of a pull that was served: how many blocks were sent in all.
struct Done {
  uint32_t count = 0;
};

// One block of a DeviceRun: where it lies in each of the holder's device pools.
struct DeviceBlock {
  uint32_t index = 0;            // position in the request's hashes
  BlockHash hash = 0;            // = hashes[index]
  std::vector<TokenId> tokens;   // the block's block_size tokens
  std::vector<uint32_t> slots;   // per pool, the block's index in the holder's device pool
  bool operator==(const DeviceBlock&) const = default;
};

// A same-host answer: the leading run stays in the holder's device pools, pinned until the
// receiver releases it; the receiver copies it device to device through the handles. No
// checksums: the bytes never leave the host's device memory.
struct DeviceRun {
  std::vector<std::string> handles;  // per pool of the layout: the holder's IPC handle of its memory (opaque)
  std::vector<DeviceBlock> blocks;   // indexes 0..n-1
  bool operator==(const DeviceRun&) const = default;
};

// An answer by NCCL: the holder sends the run with ncclSend right after this frame, on the
// pair's communicator `comm` (a new one when unique_id is set: holder rank 0, receiver rank
// 1), each block's pools in order; the receiver receives them into blocks of its own.
struct NcclRun {
  uint64_t comm = 0;                // the holder's number for the communicator, non-zero
  std::string unique_id;            // empty, or kNcclUniqueIdBytes: create `comm` from it
  std::vector<DeviceBlock> blocks;  // indexes 0..n-1, slots empty
  bool operator==(const NcclRun&) const = default;
};

struct PullReply {
  uint64_t transfer_id = 0;
  std::variant<Refusal, std::vector<Block>, Done, DeviceRun, NcclRun> body;
};

// XXH3_64 (seed 0) of a block's bytes in one pool.
uint64_t Checksum(std::span<const std::byte> bytes);

// A request without host_id, release and nccl is written exactly as before they existed (the
// struct at its first size), so old frames and transfer_vectors.txt stay byte for byte.
std::string EncodePullRequest(const PullRequest& request);
// A release frame for `transfer_id` (PullRequest::release).
std::string EncodeRelease(uint64_t transfer_id);
// Decodes and validates one PullRequest frame: a non-zero transfer id; a non-empty model and
// names within limits; a power-of-two block size equal to the layout's; 1 to
// limits::kMaxPullBlocks hashes, none 0; 1 to kMaxKvPools pools, each block within a frame
// (limits::kMaxTransferBytes less slack); a non-zero deadline; a host id of at most
// kMaxHostIdBytes. Over a limit: OutOfRange. A release frame needs only its non-zero transfer
// id: it comes back with release set and nothing else read.
Result<PullRequest> DecodePullRequest(const void* data, size_t size);
// The transfer id of a PullRequest frame that DecodePullRequest refuses, so the refusal can
// name it; 0 when not even that can be read.
uint64_t ReadTransferId(const void* data, size_t size);

std::string EncodeRefused(uint64_t transfer_id, RefusalReason reason, std::string_view message);
// REQUIRES: each block's data and checksums agree in count.
std::string EncodeBlocks(uint64_t transfer_id, std::span<const Block> blocks);
std::string EncodeBlocks(uint64_t transfer_id, std::span<const BlockView> blocks);
std::string EncodeDone(uint64_t transfer_id, uint32_t count);
std::string EncodeDeviceRun(uint64_t transfer_id, const DeviceRun& run);
std::string EncodeNcclRun(uint64_t transfer_id, const NcclRun& run);
// Decodes one PullReply frame: a non-zero transfer id, a known refusal reason, and blocks
// whose token, data and checksum lists are within limits and data and checksums agree in
// count; a device run of 1 to kMaxKvPools handles of 1 to kMaxDeviceHandleBytes bytes, at
// most limits::kMaxPullBlocks blocks of at most kMaxBlockTokens tokens and one slot per
// handle; an nccl run with a non-zero comm, a unique id empty or of kNcclUniqueIdBytes, and
// blocks as a device run's without slots. What a block or run must be for the request it
// answers is CheckBlock's, CheckDeviceRun's and CheckNcclRun's.
Result<PullReply> DecodePullReply(const void* data, size_t size);
// The same, reading a `blocks` frame in place: its blocks go to *frame as views over `data`
// (which must outlive them unchanged) and the body's vector of Blocks stays empty. Any other
// reply decodes as above and leaves *frame untouched.
Result<PullReply> DecodePullReply(const void* data, size_t size, BlockFrame* frame);

// Checks block `b` as the `index`-th block answering `request`: its index, its hash
// (= request.hashes[index]), block_size tokens, one data per pool of bytes_per_block bytes
// (none for kNone) and, when `verify_checksums`, every checksum. A checksum mismatch is
// DataLoss; any other fault InvalidArgument.
Status CheckBlock(const PullRequest& request, const Block& b, uint32_t index, bool verify_checksums);
Status CheckBlock(const PullRequest& request, const BlockView& b, uint32_t index, bool verify_checksums);

// Checks `run` as the answer to `request`: one handle per pool of the layout, at most as many
// blocks as hashes, block i with index i, hash hashes[i], block_size tokens and one slot per
// pool. InvalidArgument otherwise.
Status CheckDeviceRun(const PullRequest& request, const DeviceRun& run);

// Checks `run` as the answer to `request`: a request that offered NCCL, a non-zero comm, a
// unique id only where the request named no communicator or another one, at most as many
// blocks as hashes, block i with index i, hash hashes[i], block_size tokens and no slots.
// InvalidArgument otherwise.
Status CheckNcclRun(const PullRequest& request, const NcclRun& run);

// An upper bound on the bytes `b` adds to an EncodeBlocks frame.
uint64_t EncodedBlockBytes(const Block& b);
// The same bound for a block of `layout` (block_size tokens, one data per pool but for kNone).
uint64_t EncodedBlockBytes(const Layout& layout);

}  // namespace kvfleet::transfer
