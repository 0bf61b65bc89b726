# KV events: Contract 2 of docs/DESIGN.md. The prose spec is schema/README.md.
# Append-only: never renumber, retype or reuse a field; add new fields at the end.
@0xeeef072a2910b1bd;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvfleet::schema");

enum Tier {
  device @0;  # GPU (or the cpu backend's primary) memory
  host @1;    # the secondary tier: pinned host memory
}

struct StoredBlock {
  hash @0 :UInt64;          # Contract 1 sequence hash
  tokens @1 :List(UInt32);  # the block's tokens; empty unless the worker's events.include_tokens is on
  tier @2 :Tier;
  priority @3 :UInt8;       # retention priority 0..100
  loraId @4 :UInt64;        # the adapter the block's KV was computed with: XXH3_64 of the request's
                            # loraName (a digest of 0 is sent as 1); 0 = the base model
}

struct KvEvent {
  windowSize @0 :UInt32;    # attention window of the pool the event concerns; 0 = full attention

  union {
    stored @1 :Stored;
    removed @2 :Removed;
    updated @3 :Updated;
    cleared @4 :Void;       # every block of every tier is gone
    created @5 :Created;
  }

  eventId @6 :UInt64;       # 1 for the first event of an epoch, +1 per event the KV manager made,
                            # lost ones included; 0 = none (a snapshot's events, an older worker)

  struct Stored {
    parentHash @0 :UInt64;          # hash of the block before blocks[0]; 0 = the root
    blocks @1 :List(StoredBlock);   # a chain: blocks[i] is the parent of blocks[i+1]
  }

  struct Removed {
    hashes @0 :List(UInt64);
    tier @1 :Tier;
  }

  struct Updated {
    hash @0 :UInt64;
    hasTier @1 :Bool;       # the block moved to `tier` (offload or onboard)
    tier @2 :Tier;
    hasPriority @3 :Bool;   # the block's retention priority changed to `priority`
    priority @4 :UInt8;
  }

  struct Created {
    blocksPerTier @0 :List(UInt64);  # indexed by Tier ordinal
    blockSize @1 :UInt32;
  }
}

struct Load {
  activeRequests @0 :UInt32;
  queuedRequests @1 :UInt32;
  activePrefillTokens @2 :UInt64;      # prompt tokens still to compute, queued requests included
  activeDecodeBlocks @3 :UInt64;
  freeBlocks @4 :List(UInt64);         # per tier, indexed by Tier ordinal
  totalBlocks @5 :List(UInt64);
  prefillTokensPerSecond @6 :Float32;  # measured, smoothed
  decodeTokensPerSecond @7 :Float32;
  # How long a request arriving now would wait before its prefill starts, in µs:
  # activePrefillTokens / prefillTokensPerSecond (0 while that rate is unmeasured) plus the
  # wait for running requests to finish when the batch or the KV cache is full (README.md).
  # 0 from a worker older than the field.
  predictedWaitUs @8 :UInt64;
  residentLoras @9 :List(UInt64);      # loraIds of the adapters on the device now (Hello.loras)
  # What this worker's KV pulls (Contract 4) took, by holder: totals since the worker started,
  # for the holders whose totals changed since its previous batch (README.md, "Load"). Empty
  # from older workers.
  pulls @10 :List(PullTotals);
  # How long a prompt that arrives with all but at most a block of it pulled (a split's, P/D)
  # would wait to be admitted, in µs. A worker that admits such prompts ahead of its queue
  # (--role decode) waits only for a batch slot and a KV block; others admit it in order, so
  # this equals predictedWaitUs there (README.md, "Load"). All ones (the default) from older
  # workers: not known.
  pulledWaitUs @11 :UInt64 = 0xffffffffffffffff;
}

struct PullTotals {
  source @0 :Text;      # the holder's transfer endpoint, as its Hello gives it
  pulls @1 :UInt64;     # pulls from it that brought blocks
  bytes @2 :UInt64;     # their blocks' bytes
  seconds @3 :Float64;  # their time, each from the request to the blocks in place here
  # Pulls from it that brought no block (the holder refused, failed or went silent past the
  # deadline, or the first frame failed its checksum): the request computed its whole prefix.
  # 0 from older workers.
  failed @4 :UInt64;
  failedSeconds @5 :Float64;  # their time, each from the request to the fallback
}

struct EventBatch {
  workerId @0 :Text;
  epoch @1 :UInt64;         # random, chosen at worker process start
  seq @2 :UInt64;           # +1 per batch within an epoch; the first batch is 1
  events @3 :List(KvEvent); # empty for a heartbeat
  load @4 :Load;
  createdNs @5 :Int64;      # worker wall clock (Unix ns) when sealed, for the lag metric
}

# Sent by a router's DEALER to a worker's replay ROUTER.
struct ReplayRequest {
  epoch @0 :UInt64;         # the epoch the router knows; 0 = none
  fromSeq @1 :UInt64;       # the first seq the router is missing
  requestId @2 :UInt64;     # echoed in every ReplayReply, so late answers to an old request are ignored
}

# The answer to a ReplayRequest: one or more messages; the final one has `last` set.
struct ReplayReply {
  workerId @0 :Text;
  epoch @1 :UInt64;         # the worker's current epoch
  last @2 :Bool;

  union {
    batches @3 :List(EventBatch);  # replay: consecutive batches from fromSeq on
    snapshot @4 :Snapshot;         # the range is gone or the epoch is old
    error @5 :Text;
  }

  requestId @6 :UInt64;     # the ReplayRequest's requestId

  struct Snapshot {
    consistentSeq @0 :UInt64;      # reflects every batch with seq <= this, and none after
    events @1 :List(KvEvent);      # `stored` events, parents before children
    consistentEventId @2 :UInt64;  # reflects every event with eventId <= this, and none after;
                                   # 0 = no event yet, or an older worker
  }
}
