// ThreadPool: every item runs exactly once per loop, loops run back to back, and a loop
// returns only when its items are done.
#include <doctest/doctest.h>

#include <atomic>
#include <vector>

#include "worker/backend/cpu/thread_pool.h"

namespace kvfleet::backend::cpu {
namespace {

TEST_CASE("each item runs exactly once, whatever the thread count") {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (int64_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.ParallelFor(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
    }
  }
}

TEST_CASE("thousands of short loops in a row see all their writes") {
  ThreadPool pool(3);
  std::vector<int64_t> out(64);
  int64_t total = 0;
  for (int round = 0; round < 2000; ++round) {
    pool.ParallelFor(static_cast<int64_t>(out.size()), [&](int64_t i) { out[i] = i * round; });
    for (int64_t v : out) total += v;  // read after the loop returned: no race
  }
  CHECK(total == 2016LL * 1999 * 1000);  // sum(i) = 2016, sum(round) = 1999000
}

}  // namespace
}  // namespace kvfleet::backend::cpu
