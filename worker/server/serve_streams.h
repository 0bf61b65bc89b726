// ServeStreams: a holder's bytes answers to KV pulls (Contract 4's `blocks` frames), read out
// of its cache a frame at a time on the engine thread, between steps.
//
// Start pins the leading run of a pull's chain that this worker holds (KvCacheManager::
// PinChain: no eviction or reuse changes its bytes) and keeps it pinned for the length of the
// transfer. Each Pump reads at most one frame's worth of each run (BlocksPerFrame blocks, one
// ReadKvBlocks call per pool) into a buffer reused from frame to frame, and hands it to the
// service (TransferService::ServeFrame), which encodes and sends it and gives the buffer back
// (TakeSpentFrames). A run has at most transfer::config::kFramesAhead frames with the service
// at a time: a slow receiver holds the engine's reads back, not its memory. The service says
// when the run may be unpinned (a Released with `stream` set): its `done` left, or it was cut
// short (the receiver gone, its deadline passed, Stop); Ended then unpins it.
//
// What this replaces read a whole run at once into a fresh buffer per block (a 1 GB pull was
// 1 GB of newly mapped pages, ~850 ms of page faults on an H200 host, and a step-long stall),
// tests/bench/results/2026-12-01-nvidia-h200-kv-transfer-tcp-frames.txt.
//
// Invariants (CheckInvariants):
//   1. Every stream's run is pinned from Start until Ended: exactly the blocks of runs_.
//   2. A stream has at most kFramesAhead frames with the service, and has handed over
//      blocks [0, next) of its run, in order.
//   3. Buffers kept for reuse are at most config::kSpareFrames.
//
// Thread safety: thread-compatible; the engine thread calls every method.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/backend/backend.h"
#include "worker/kv/kv_cache_manager.h"
#include "worker/transfer/transfer_service.h"

namespace kvfleet::server {

namespace config {
// Frame buffers kept between streams (each up to transfer::config::kFrameTargetBytes): the
// next pull reads into memory already mapped; more would only hold memory while idle.
constexpr size_t kSpareFrames = 4;
}  // namespace config

struct ServeStreamStats {
  uint64_t frames = 0;      // frames read and handed to the service
  uint64_t blocks = 0;      // blocks read
  uint64_t read_calls = 0;  // ReadKvBlocks calls (one per pool per frame)
  uint64_t completed = 0;   // streams whose `done` left
  uint64_t cut = 0;         // streams ended before their `done`
  uint64_t read_failures = 0;
};

class ServeStreams {
 public:
  // The pointers outlive this object; `layout` is this worker's (KvPulls::layout()).
  ServeStreams(transfer::TransferService* service, kv::KvCacheManager* kv, backend::ModelBackend* backend,
               transfer::Layout layout);
  ServeStreams(const ServeStreams&) = delete;
  ServeStreams& operator=(const ServeStreams&) = delete;

  // Pins the leading run of `pull`'s chain held here and starts streaming it; false (nothing
  // pinned) when none of it is held. REQUIRES: the pull's layout is this worker's.
  bool Start(const transfer::IncomingPull& pull);
  // A Released with `stream` set: unpins its run. Others are ignored.
  void Ended(const transfer::Released& r);
  // Takes the service's spent buffers, then reads at most one frame of each stream with room
  // and hands it over.
  void Pump();
  // Whether a Pump now would read a frame: the worker loop should not idle.
  bool ready() const;

  size_t streams() const { return runs_.size(); }
  // Blocks pinned by streams now.
  size_t pinned_blocks() const;
  const ServeStreamStats& stats() const { return stats_; }
  Status CheckInvariants() const;

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (peer token, transfer id)
  struct Run {
    std::vector<kv::ExportedBlock> blocks;  // pinned
    size_t next = 0;                        // the first block not yet read
    uint32_t ahead = 0;                     // frames with the service
  };
  bool HasRoom(const Run& run) const;
  // Reads `run`'s next frame and hands it over; a failed read ends the run with the blocks
  // already handed over. False when the run is over here: nothing was handed over, the pull
  // is refused and the run unpinned.
  bool ReadFrame(const Key& key, Run& run);
  std::vector<std::byte> TakeBuffer();

  transfer::TransferService* service_;
  kv::KvCacheManager* kv_;
  backend::ModelBackend* backend_;
  const transfer::Layout layout_;
  const bool bytes_;             // the layout carries bytes (dtype none: only tokens)
  const uint32_t frame_blocks_;  // BlocksPerFrame(layout_)
  std::map<Key, Run> runs_;
  std::vector<std::vector<std::byte>> spare_;  // buffers back from the service
  std::vector<kv::BlockLocation> where_;       // ReadFrame's scratch: one pool's locations
  ServeStreamStats stats_;
};

}  // namespace kvfleet::server
