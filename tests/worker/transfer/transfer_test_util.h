// Helpers of the TransferService tests (transfer_service_test.cc, serving_test.cc,
// streamed_pull_test.cc, nccl_path_test.cc): two services in one process over loopback TCP, a
// run served the way the engine streams it, and bounded waits for what they hand over.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "worker/transfer/transfer_service.h"

namespace kvfleet::transfer::testing {

// The longest any one wait here may take before the test fails: a minute, for sanitizer
// builds moving the 72 MiB chain.
constexpr int kWaitRounds = 1200;                   // × kWaitStep
constexpr DurationNs kWaitStep = 50 * kNsPerMs;

inline PullRequest Chain(size_t n, uint64_t bytes_per_block = 256, KvDtype dtype = KvDtype::kBf16) {
  PullRequest r;
  r.model = "m";
  r.block_size = 4;
  for (size_t i = 0; i < n; ++i) r.hashes.push_back(0x1000 + i);
  r.layout.dtype = dtype;
  r.layout.block_size = 4;
  r.layout.pools = {PoolGeometry{0, 2, 1, 8, bytes_per_block}};
  r.deadline_ms = 30'000;
  return r;
}

// Block `i` of `r`'s chain as a holder's engine would read it: tokens i * 100 + t, every
// byte i * 7 + 1 (none for dtype none).
inline Block MakeBlock(const PullRequest& r, uint32_t i) {
  Block b;
  b.index = i;
  b.hash = r.hashes[i];
  for (uint32_t t = 0; t < r.block_size; ++t) b.tokens.push_back(static_cast<TokenId>(i * 100 + t));
  if (r.layout.dtype != KvDtype::kNone) {
    for (const PoolGeometry& p : r.layout.pools) {
      b.data.emplace_back(p.bytes_per_block, static_cast<std::byte>(i * 7 + 1));
    }
  }
  return b;
}

// The first `n` blocks of `r`'s chain (MakeBlock).
inline std::vector<Block> Blocks(const PullRequest& r, size_t n) {
  std::vector<Block> out;
  for (size_t i = 0; i < n; ++i) out.push_back(MakeBlock(r, static_cast<uint32_t>(i)));
  return out;
}

// `blocks` (blocks first.. of a run) as one FrameChunk, as ServeStreams reads a frame: their
// bytes pool after pool, each pool's blocks back to back.
inline FrameChunk ToChunk(std::span<const Block> blocks, uint32_t first, bool last) {
  FrameChunk c;
  c.first = first;
  c.last = last;
  for (const Block& b : blocks) {
    c.hashes.push_back(b.hash);
    c.tokens.push_back(b.tokens);
  }
  const size_t pools = blocks.empty() ? 0 : blocks[0].data.size();
  for (size_t p = 0; p < pools; ++p) {
    for (const Block& b : blocks) c.bytes.insert(c.bytes.end(), b.data[p].begin(), b.data[p].end());
  }
  return c;
}

// Blocks [first, first + n) of `r`'s chain (MakeBlock) as one FrameChunk.
inline FrameChunk Chunk(const PullRequest& r, uint32_t first, uint32_t n, bool last) {
  std::vector<Block> blocks;
  for (uint32_t i = first; i < first + n; ++i) blocks.push_back(MakeBlock(r, i));
  return ToChunk(blocks, first, last);
}

// Serves `blocks`, a leading run of `in`'s chain, the way the engine streams it: FrameChunks of
// at most BlocksPerFrame blocks, the last marked (no blocks: one empty last chunk). Then waits
// for the stream's end as the engine does, taking every chunk's buffer back, and returns its
// release (expired: cut, or stale at its first chunk). The receiver's queues hold what it
// does not read meanwhile: a few frames here.
inline Released ServeRun(TransferService& holder, const IncomingPull& in, const std::vector<Block>& blocks) {
  const uint64_t id = in.request.transfer_id;
  const size_t per_frame = BlocksPerFrame(in.request.layout);
  size_t first = 0, chunks = 0;
  do {
    const size_t n = std::min(per_frame, blocks.size() - first);
    const bool last = first + n == blocks.size();
    FrameChunk chunk = ToChunk(std::span(blocks).subspan(first, n), static_cast<uint32_t>(first), last);
    holder.ServeFrame(in.peer_token, id, std::move(chunk));
    first += n;
    ++chunks;
  } while (first < blocks.size());
  size_t spent = 0;
  std::optional<Released> end;
  for (int i = 0; i < kWaitRounds && (spent < chunks || !end); ++i) {
    for (const SpentFrame& f : holder.TakeSpentFrames()) spent += f.transfer_id == id ? 1 : 0;
    for (const Released& r : holder.TakeReleases()) {
      if (r.stream && r.transfer_id == id) end = r;
    }
    if (spent < chunks || !end) holder.WaitForWork(kWaitStep);
  }
  REQUIRE(end.has_value());
  CHECK(spent == chunks);
  return *end;
}

inline std::unique_ptr<TransferService> Make(TransferOptions options = {}, const Clock* clock = SystemClock::Default()) {
  auto s = TransferService::Start(std::move(options), clock);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return std::move(*s);
}

inline IncomingPull AwaitPull(TransferService& holder) {
  for (int i = 0; i < kWaitRounds; ++i) {
    auto pulls = holder.TakePulls();
    if (!pulls.empty()) {
      REQUIRE(pulls.size() == 1);
      return std::move(pulls[0]);
    }
    holder.WaitForWork(kWaitStep);
  }
  FAIL("no pull reached the holder");
  return {};
}

// A pull's end: its result, and the blocks that arrived for it (the run's, with kOk; only
// leftovers otherwise), copied out of the frames.
struct Pulled {
  PullResult result;
  std::vector<Block> blocks;
};

// Waits for pull `id`'s result, taking every arrival meanwhile (the receiver reads no further
// than config::kArrivalsAhead frames the engine has not taken); `id`'s must come in order with
// no gap. `clock`, when given, moves on 500 ms a round.
inline Pulled AwaitPulled(TransferService& receiver, uint64_t id, ManualClock* clock = nullptr) {
  Pulled out;
  for (int i = 0; i < kWaitRounds; ++i) {
    // Results first: the arrivals taken after them hold every block of those results.
    std::vector<PullResult> results = receiver.TakeResults();
    for (const Arrival& a : receiver.TakeArrivals()) {
      if (a.transfer_id != id) continue;
      CHECK(a.first == out.blocks.size());
      for (const BlockView& b : a.blocks) out.blocks.push_back(ToBlock(b));
    }
    for (PullResult& r : results) {
      if (r.transfer_id != id) continue;
      out.result = std::move(r);
      if (out.result.outcome == PullOutcome::kOk && !out.result.device && !out.result.nccl) {
        CHECK(out.blocks.size() == out.result.streamed_blocks);
      }
      return out;
    }
    if (clock != nullptr) clock->AdvanceMs(500);
    receiver.WaitForWork(kWaitStep);
  }
  FAIL("pull " << id << " never ended");
  return {};
}

inline PullResult AwaitResult(TransferService& receiver, uint64_t id, ManualClock* clock = nullptr) {
  return AwaitPulled(receiver, id, clock).result;
}

template <typename F>
void AwaitStats(TransferService& s, F done) {
  for (int i = 0; i < kWaitRounds && !done(s.Stats()); ++i) s.WaitForWork(kWaitStep);
  REQUIRE(done(s.Stats()));
}

inline std::vector<Released> AwaitReleases(TransferService& holder, ManualClock* clock = nullptr) {
  for (int i = 0; i < kWaitRounds; ++i) {
    auto released = holder.TakeReleases();
    if (!released.empty()) return released;
    if (clock != nullptr) clock->AdvanceMs(100);
    holder.WaitForWork(kWaitStep);
  }
  FAIL("nothing was released");
  return {};
}

}  // namespace kvfleet::transfer::testing
