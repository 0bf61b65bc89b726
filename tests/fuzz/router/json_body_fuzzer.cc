// Differential fuzzer for the router's JSON front end: ParseJsonBody (simdjson, with
// nlohmann for the bytes the two read differently) must give exactly what the depth check
// then nlohmann::json::parse give: the same verdict and message, the same value with the
// same number types, and DumpJson must write nlohmann's dump. Any difference aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "router/http/json_body.h"
#include "tests/router/http/json_same.h"

namespace {

using nlohmann::json;

using kvfleet::router::testing::SameJson;

[[noreturn]] void Differ(const char* what) {
  std::fprintf(stderr, "json_body_fuzzer: ParseJsonBody and nlohmann differ: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  auto got = kvfleet::router::ParseJsonBody(body);
  bool shallow = kvfleet::router::JsonDepthWithin(body, kvfleet::router::config::kMaxJsonBodyDepth);
  json want = shallow ? json::parse(body, nullptr, false) : json(json::value_t::discarded);
  if (!shallow || want.is_discarded()) {
    if (got.ok()) Differ("only ParseJsonBody accepted the body");
    if (got.status().message() != (shallow ? kvfleet::router::kJsonInvalid : kvfleet::router::kJsonTooDeep)) {
      Differ("the refusals' messages");
    }
    return 0;
  }
  if (!got.ok()) Differ("only nlohmann accepted the body");
  if (!SameJson(*got, want)) Differ("the values");
  if (kvfleet::router::DumpJson(*got) != want.dump()) Differ("the dumps");
  return 0;
}
