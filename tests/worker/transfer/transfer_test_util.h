// Helpers of the TransferService tests (transfer_service_test.cc, nccl_path_test.cc): two
// services in one process over loopback TCP, and bounded waits for what they hand over.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <string>
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

// The first `n` blocks of `r`'s chain as a holder's engine would read them.
inline std::vector<Block> Blocks(const PullRequest& r, size_t n) {
  std::vector<Block> out;
  for (size_t i = 0; i < n; ++i) {
    Block b;
    b.index = static_cast<uint32_t>(i);
    b.hash = r.hashes[i];
    for (uint32_t t = 0; t < r.block_size; ++t) b.tokens.push_back(static_cast<TokenId>(i * 100 + t));
    if (r.layout.dtype != KvDtype::kNone) {
      for (const PoolGeometry& p : r.layout.pools) {
        b.data.emplace_back(p.bytes_per_block, static_cast<std::byte>(i * 7 + 1));
      }
    }
    out.push_back(std::move(b));
  }
  return out;
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

inline PullResult AwaitResult(TransferService& receiver, uint64_t id, ManualClock* clock = nullptr) {
  for (int i = 0; i < kWaitRounds; ++i) {
    for (PullResult& r : receiver.TakeResults()) {
      if (r.transfer_id == id) return std::move(r);
    }
    if (clock != nullptr) clock->AdvanceMs(500);
    receiver.WaitForWork(kWaitStep);
  }
  FAIL("pull " << id << " never ended");
  return {};
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
