#include "router/fleet/gossip_faults.h"

#include <charconv>
#include <cmath>
#include <string>

namespace kvfleet::router {

namespace {

bool ParseSeconds(std::string_view text, double* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && std::isfinite(*out) && *out >= 0 && *out <= 86'400;
}

}  // namespace

Result<GossipOutage> ParseGossipOutage(std::string_view text) {
  const size_t colon = text.find(':');
  double at = 0, length = 0;
  if (colon == std::string_view::npos || !ParseSeconds(text.substr(0, colon), &at) ||
      !ParseSeconds(text.substr(colon + 1), &length) || length <= 0) {
    return InvalidArgument("--debug-drop-gossip takes AT_S:FOR_S (seconds after start-up, then the outage's "
                           "length, > 0; each at most a day), got '" + std::string(text) + "'");
  }
  return GossipOutage{static_cast<DurationNs>(at * kNsPerSec), static_cast<DurationNs>(length * kNsPerSec)};
}

}  // namespace kvfleet::router
