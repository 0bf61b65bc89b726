#include "common/log.h"

#include <doctest/doctest.h>

using namespace kvfleet;

TEST_CASE("logging accepts the documented levels and formats and rejects others") {
  CHECK(InitLogging({"debug", "text"}).ok());
  CHECK(InitLogging({"info", "json"}).ok());
  CHECK(InitLogging({"off", "text"}).ok());
  CHECK(InitLogging({"verbose", "text"}).code() == StatusCode::kInvalidArgument);
  CHECK(InitLogging({"info", "xml"}).code() == StatusCode::kInvalidArgument);
  CHECK(InitLogging({"warn", "text"}).ok());
}

TEST_CASE("a component logger is created once and shared") {
  auto a = Logger("kv");
  auto b = Logger("kv");
  CHECK(a.get() == b.get());
  CHECK(a->name() == "kv");
  CHECK(Logger("router").get() != a.get());
}

TEST_CASE("a rate limit lets the first message through and suppresses a burst") {
  RateLimit limit(60'000);
  uint64_t suppressed = 99;
  CHECK(limit.Allow(&suppressed));
  CHECK(suppressed == 0);
  for (int i = 0; i < 10; ++i) CHECK_FALSE(limit.Allow(&suppressed));
}
