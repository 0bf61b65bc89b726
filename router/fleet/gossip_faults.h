// GossipFaults: takes the gossip channel down, as a partition between the routers would.
// While it is down the router sends nothing and applies nothing it reads (frames are read and
// discarded, so nothing is left queued for the end of the outage); its peers expire after the
// ttl, and it routes as a router alone does (router/README.md, "Several routers", Expiry).
// Set through GossipOptions::faults by tests, and by the router's --debug-drop-gossip
// AT_S:FOR_S (one outage, FOR_S seconds long, from AT_S seconds after start-up); null
// otherwise. Testing only: never set in production.
//
// Thread safety: thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"

namespace kvfleet::router {

// --debug-drop-gossip's outage: its start after start-up and its length.
struct GossipOutage {
  DurationNs after = 0;
  DurationNs length = 0;
};
// Parses "AT_S:FOR_S" (seconds, FOR_S > 0); the error names the flag.
Result<GossipOutage> ParseGossipOutage(std::string_view text);

class GossipFaults {
 public:
  GossipFaults() = default;
  // Down from `from` for `length`.
  GossipFaults(TimeNs from, DurationNs length) : from_(from), until_(from + length) {}

  // Down (or up) from now until told otherwise, whatever the scheduled outage says.
  void SetDown(bool down) { forced_.store(down ? kDown : kUp, std::memory_order_release); }
  bool Down(TimeNs now) const {
    const int forced = forced_.load(std::memory_order_acquire);
    if (forced != kScheduled) return forced == kDown;
    return now >= from_ && now < until_;
  }
  // Frames not sent or not applied because the channel was down.
  void CountDropped() { dropped_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kScheduled = 0, kDown = 1, kUp = 2;
  TimeNs from_ = 0, until_ = 0;  // the scheduled outage, [from_, until_)
  std::atomic<int> forced_{kScheduled};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace kvfleet::router
