#include "common/status.h"

#include <memory>

#include <doctest/doctest.h>

using namespace kvfleet;

namespace {
Result<int> ParsePositive(int v) {
  if (v <= 0) return InvalidArgument("not positive: " + std::to_string(v));
  return v;
}
Result<int> Doubled(int v) {
  KVF_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  return 2 * x;
}
Status Check(int v) {
  KVF_RETURN_IF_ERROR(ParsePositive(v).status());
  return Status::Ok();
}
}  // namespace

TEST_CASE("a default Status is OK and prints as OK") {
  Status s;
  CHECK(s.ok());
  CHECK(s.ToString() == "OK");
}

TEST_CASE("an error Status carries its code, message and added context") {
  Status s = NotFound("tensor model.norm.weight");
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.ToString() == "NotFound: tensor model.norm.weight");
  CHECK(s.WithContext("loading /m").message() == "loading /m: tensor model.norm.weight");
  CHECK(Status::Ok().WithContext("x").ok());
}

TEST_CASE("Result holds a value or the error, and the macros propagate errors") {
  CHECK(Doubled(21).value() == 42);
  auto bad = Doubled(-1);
  CHECK_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message() == "not positive: -1");
  CHECK(Check(3).ok());
  CHECK(Check(0).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Result works with move-only values") {
  Result<std::unique_ptr<int>> r(std::make_unique<int>(7));
  REQUIRE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  CHECK(*p == 7);
}

TEST_CASE("NumberText writes a number as a person does") {
  CHECK(NumberText(0.0) == "0");
  CHECK(NumberText(1048576.0) == "1048576");
  CHECK(NumberText(2.5) == "2.5");
  CHECK(NumberText(-2.0) == "-2");
  CHECK(NumberText(0.7f) == "0.7");  // a float as a float: not 0.699999988079071
  CHECK(NumberText(0.7) == "0.7");
  CHECK(NumberText(1e15) == "1e+15");
}
