#include "worker/kv/retention.h"

#include <doctest/doctest.h>

namespace kvfleet::kv {
namespace {

TEST_CASE("a block takes the highest priority among the ranges covering its tokens") {
  KvCacheRetentionConfig c;
  c.token_ranges.push_back({0, 10, 80, std::nullopt});
  c.token_ranges.push_back({10, std::nullopt, 20, 5 * kNsPerSec});
  // Tokens 8..15 straddle both ranges: 80 wins.
  CHECK(RetentionForBlock(c, 100, 8, 16).priority == 80);
  const BlockRetention late = RetentionForBlock(c, 100, 16, 24);
  CHECK(late.priority == 20);
  CHECK(late.duration == 5 * kNsPerSec);
}

TEST_CASE("earlier ranges win where ranges overlap") {
  KvCacheRetentionConfig c;
  c.token_ranges.push_back({0, 100, 10, std::nullopt});
  c.token_ranges.push_back({0, 100, 90, std::nullopt});
  CHECK(RetentionForBlock(c, 200, 0, 16).priority == 10);
}

TEST_CASE("tokens no range covers count at the default priority") {
  KvCacheRetentionConfig c;
  c.token_ranges.push_back({0, 4, 0, std::nullopt});
  CHECK(RetentionForBlock(c, 100, 0, 4).priority == 0);
  CHECK(RetentionForBlock(c, 100, 0, 8).priority == kDefaultPriority);
}

TEST_CASE("blocks holding generated tokens take the decode priority and duration") {
  KvCacheRetentionConfig c;
  c.token_ranges.push_back({0, std::nullopt, 0, std::nullopt});
  c.decode_priority = 70;
  c.decode_duration = kNsPerSec;
  const BlockRetention r = RetentionForBlock(c, 10, 8, 16);
  CHECK(r.priority == 70);
  CHECK(r.duration == kNsPerSec);
  CHECK(RetentionForBlock(c, 10, 0, 8).priority == 0);
}

TEST_CASE("retention configs outside 0-100 or with empty ranges are refused") {
  KvCacheRetentionConfig c;
  c.token_ranges.push_back({5, 5, 10, std::nullopt});
  CHECK_FALSE(c.Validate().ok());
  KvCacheRetentionConfig d;
  d.decode_priority = 101;
  CHECK_FALSE(d.Validate().ok());
}

}  // namespace
}  // namespace kvfleet::kv
