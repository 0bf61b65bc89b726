// KvNccl: a backend's NCCL point-to-point transfers of whole device KV blocks to or from
// another worker's backend (Contract 4's `nccl` answer, schema/README.md): the transport for
// two workers whose GPUs cannot map each other's memory by CUDA IPC (another host, another
// IPC namespace). Each pair of workers shares a 2-rank communicator, made on demand from the
// unique id the holder creates (rank 0: the holder, which sends; rank 1: the receiver) and
// kept per peer until a transfer on it fails or the peer's side replaces it.
//
// Ordering: transfers run one at a time in the order they were submitted, so both sides of a
// communicator issue its sends and receives in the same order, the order of the holder's
// answers. A receiver that will not receive a run its holder sends must Forget the peer.
//
// Thread safety: thread-safe. The engine thread calls every method; `on_done` (given at
// creation) runs on the object's own thread and must not block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/kv/block_copier.h"

namespace kvfleet::backend {

class KvNccl {
 public:
  struct Transfer {
    uint64_t id = 0;        // the caller's, echoed in Done
    std::string peer;       // names the pair: one communicator per peer
    uint64_t comm = 0;      // the holder's number for the communicator (NcclRun::comm), non-zero
    std::string unique_id;  // non-empty: create `comm` from it, replacing the peer's old one
    bool send = false;      // true: this side holds the run and sends it (rank 0); false: receives (rank 1)
    // [pool][i]: this side's device blocks of the run, in run order; every pool the same count.
    std::vector<std::vector<kv::BlockId>> blocks;
    // From Submit: set-up and transfer not done by then abort the communicator.
    DurationNs timeout = 0;
  };
  struct Done {
    uint64_t id = 0;
    Status status;        // OK: every block moved
    uint64_t bytes = 0;   // moved, with an OK status
    double seconds = 0;   // from Submit to the end, communicator set-up included
  };

  virtual ~KvNccl() = default;
  // A new ncclUniqueId (transfer::config::kNcclUniqueIdBytes): the holder's, for a new communicator.
  virtual Result<std::string> NewUniqueId() = 0;
  // The communicator this side uses next for `peer`: the `comm` of the last transfer submitted
  // with a unique id, until a transfer on it fails or Forget; 0: none.
  virtual uint64_t CommFor(const std::string& peer) const = 0;
  // Queues `t`. A send's blocks hold their final bytes in the engine's stream order when
  // Submit is called; a receive's blocks are not read or written by the engine until its Done.
  // Exactly one Done follows.
  virtual void Submit(Transfer t) = 0;
  // Takes the transfers finished since the last call, in submission order.
  virtual std::vector<Done> TakeDone() = 0;
  // Stops using `peer`'s communicator: transfers queued on it fail, and it is aborted.
  virtual void Forget(const std::string& peer) = 0;
};

}  // namespace kvfleet::backend
