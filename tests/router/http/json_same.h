// Strict equality of nlohmann values for the JSON front end's tests and fuzzer: equal values
// of equal types all the way down (nlohmann's == calls 1u and 1 equal, and 0.0 and -0.0),
// floats compared bit for bit, object keys in order.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace kvfleet::router::testing {

inline bool SameJson(const nlohmann::json& a, const nlohmann::json& b) {
  using nlohmann::json;
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case json::value_t::object: {
      if (a.size() != b.size()) return false;
      for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
        if (ia.key() != ib.key() || !SameJson(*ia, *ib)) return false;
      }
      return true;
    }
    case json::value_t::array: {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!SameJson(a[i], b[i])) return false;
      }
      return true;
    }
    case json::value_t::number_float:
      return std::bit_cast<uint64_t>(a.get<double>()) == std::bit_cast<uint64_t>(b.get<double>());
    default:
      return a == b;
  }
}

}  // namespace kvfleet::router::testing
