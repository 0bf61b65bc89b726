// RankGroup: ranks run at once, and AllReduce gives every rank the sum in rank order.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "worker/backend/cpu/rank_group.h"

namespace kvfleet::backend::cpu {
namespace {

TEST_CASE("every rank gets the element-wise sum, added in rank order, over many calls") {
  for (int ranks : {1, 2, 3, 4, 8}) {
    RankGroup group(ranks);
    // Values whose float sum depends on the order: 1e8 + 1 - 1e8 + ... .
    auto value = [](int rank, int64_t i, int call) {
      return static_cast<float>((rank % 2 == 0 ? 1e8 : 1.0) * ((i + call) % 3 == 0 ? -1 : 1) + rank * 0.25 + i);
    };
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
      std::vector<std::vector<float>> data(ranks, std::vector<float>(n));
      std::atomic<int> mismatches{0};
      group.Run([&](int r) {
        for (int call = 0; call < 20; ++call) {
          for (int64_t i = 0; i < n; ++i) data[r][i] = value(r, i, call);
          group.AllReduce(r, data[r].data(), n);
          for (int64_t i = 0; i < n; ++i) {
            float want = value(0, i, call);
            for (int s = 1; s < ranks; ++s) want += value(s, i, call);
            if (data[r][i] != want) mismatches.fetch_add(1);
          }
        }
      });
      CAPTURE(ranks);
      CAPTURE(n);
      CHECK(mismatches.load() == 0);
    }
  }
}

TEST_CASE("Run runs each rank once, rank 0 on the caller's thread") {
  RankGroup group(4);
  std::vector<int> ran(4, 0);
  const auto caller = std::this_thread::get_id();
  bool rank0_on_caller = false;
  for (int step = 0; step < 50; ++step) {
    group.Run([&](int r) {
      ++ran[r];
      if (r == 0) rank0_on_caller = std::this_thread::get_id() == caller;
      group.Barrier();
    });
  }
  CHECK(ran == std::vector<int>{50, 50, 50, 50});
  CHECK(rank0_on_caller);
}

}  // namespace
}  // namespace kvfleet::backend::cpu
