# KV transfer between workers: Contract 4 of docs/DESIGN.md. The prose spec is schema/README.md.
# A receiver (a worker missing a prefix) pulls a chain of cached KV blocks from a holder (a
# worker that has it) instead of recomputing it.
# Append-only: never renumber, retype or reuse a field; add new fields at the end.
@0xac7037c14fd37f79;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvfleet::schema");

# The element type of the KV cache's bytes.
enum KvDtype {
  bf16 @0;
  fp8e4m3 @1;  # with per-block scales, inside the block's bytes
  fp32 @2;
  none @3;     # the mock backend: no bytes, only their modelled size (bytesPerBlock)
}

# One KV pool's geometry: all blocks of a pool have the same size.
struct PoolGeometry {
  window @0 :UInt32;         # attention window; 0 = full attention (Contract 2's windowSize)
  layers @1 :UInt32;         # layers stored in this pool
  kvHeads @2 :UInt32;        # KV heads per layer (on this worker: all tensor-parallel ranks)
  headDim @3 :UInt32;
  bytesPerBlock @4 :UInt64;  # one block's bytes in this pool: K and V of every layer, scales included
}

# How a worker lays out its KV blocks; a holder serves only a receiver whose layout is equal.
struct Layout {
  dtype @0 :KvDtype;
  blockSize @1 :UInt32;          # tokens per KV block
  pools @2 :List(PoolGeometry);  # in the worker's pool order; Block.data follows it
}

# Contract 1's hash namespace.
struct HashNamespace {
  model @0 :Text;
  lora @1 :Text;       # empty: the base model
  cacheSalt @2 :Text;  # empty: none
}

# Receiver -> holder, one frame on the holder's transfer ROUTER.
struct PullRequest {
  transferId @0 :UInt64;           # chosen by the receiver, non-zero; echoed in every reply
  hashNamespace @1 :HashNamespace;
  blockSize @2 :UInt32;            # Contract 1's B, a power of two; equals layout.blockSize
  parentHash @3 :UInt64;           # seq hash of the block before hashes[0]; 0 = the root
  hashes @4 :List(UInt64);         # the chain of Contract 1 sequence hashes wanted, in order
  layout @5 :Layout;               # the receiver's; the holder's must be equal
  deadlineMs @6 :UInt32;           # the receiver gives up this long after sending
  hostId @7 :Text;                 # the receiver's host; non-empty: it can copy device blocks
                                   # from a holder on the same host, which may answer `device`
  release @8 :Bool;                # a release frame: the receiver has copied the `device` answer
                                   # of transferId and the holder may unpin; every other field
                                   # is unset and ignored
  nccl @9 :Bool;                   # the receiver can receive blocks by NCCL point-to-point; the
                                   # holder may answer `nccl` (used where `device` is not possible)
  ncclComm @10 :UInt64;            # the holder's number of the NCCL communicator this receiver
                                   # keeps with it, from an earlier `nccl` answer; 0: none
}

enum RefusalReason {
  notHeld @0;         # the holder has no block of the chain (any more)
  layoutMismatch @1;  # dtype, block size or pools differ
  unauthorized @2;
  malformed @3;       # the request did not decode or broke a rule
  busy @4;            # too many pulls in flight at the holder
  shuttingDown @5;
  tooLarge @6;        # over the limits (schema/limits.h)
}

# One KV block of the chain.
struct Block {
  index @0 :UInt32;            # position in the request's hashes
  hash @1 :UInt64;             # = hashes[index]
  tokens @2 :List(UInt32);     # the block's blockSize tokens: the receiver compares its own
  data @3 :List(Data);         # one per pool of the layout, bytesPerBlock each; empty for dtype none
  checksums @4 :List(UInt64);  # XXH3_64 (seed 0) of each data[i]
}

# Holder -> receiver, one or more frames per pull: `blocks` frames, then `done`; or one `refused`.
struct PullReply {
  transferId @0 :UInt64;
  union {
    refused @1 :Refused;
    blocks @2 :List(Block);  # the next blocks of the chain, indexes contiguous across frames
    done @3 :UInt32;         # the last frame: how many blocks were sent in all (the leading run held)
    device @4 :DeviceRun;    # the only frame: same host, the run stays in the holder's device pools
    nccl @5 :NcclRun;        # the only frame: the run follows by NCCL send/recv (PullRequest.nccl)
  }

  struct Refused {
    reason @0 :RefusalReason;
    message @1 :Text;
  }
}

# A holder's answer to a receiver on the same host (PullRequest.hostId equal to the holder's):
# the leading run of the chain it holds stays in its device KV pools, pinned until the
# receiver's release frame (or the request's deadline plus a grace); the receiver copies it
# device to device.
struct DeviceRun {
  handles @0 :List(Data);          # one per pool of the layout: the holder process's IPC handle
                                   # of that pool's device memory (opaque, at most 256 bytes each)
  blocks @1 :List(DeviceBlock);    # the leading run, indexes 0..n-1
}

struct DeviceBlock {
  index @0 :UInt32;                # position in the request's hashes
  hash @1 :UInt64;                 # = hashes[index]
  tokens @2 :List(UInt32);         # the block's blockSize tokens
  slots @3 :List(UInt32);          # per pool, the block's index in the holder's device pool
}

# A holder's answer to a receiver that offered NCCL (PullRequest.nccl): the leading run of the
# chain it holds in its device pools, which it sends right after this frame with ncclSend on
# the pair's communicator, block after block and pool after pool (bytesPerBlock bytes each);
# the receiver posts the matching ncclRecv into blocks of its own. Both sides issue their
# transfers on one communicator in the order of these frames.
struct NcclRun {
  comm @0 :UInt64;                 # the holder's number for the communicator, non-zero
  uniqueId @1 :Data;               # non-empty (an ncclUniqueId, 128 bytes): a new communicator of
                                   # 2 ranks, holder rank 0, receiver rank 1, replacing the pair's
                                   # old one; empty: `comm` is the one the request named (ncclComm)
  blocks @2 :List(DeviceBlock);    # the leading run, indexes 0..n-1; slots empty
}
