// The HTTP server's own metrics and its count of open connections, shared by the listener
// (server.cc) and the connections (connection.cc). Private to common/http; server.h lists
// the metrics.
//
// Thread safety: thread-safe (prometheus-cpp's counters and gauges are; the count is atomic).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <boost/system/error_code.hpp>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

namespace kvfleet::http {

namespace config {
// Log lines that a peer (or a lack of descriptors) can repeat fast are written at most once
// per this interval, with the count skipped: enough to see a condition, never a flood.
inline constexpr int64_t kLogIntervalMs = 5000;
}  // namespace config

class ServerMetrics {
 public:
  // Registers the metrics in `registry`; null: in a registry of their own (not exported).
  explicit ServerMetrics(std::shared_ptr<prometheus::Registry> registry);

  // Counts a failed accept by its reason: emfile, enfile, enobufs, enomem, other.
  void CountAcceptError(const boost::system::error_code& ec);
  // A connection accepted: true when fewer than `cap` are open (it is then counted open
  // until Closed()), false when it is over the cap (counted refused).
  bool TryOpen(size_t cap);
  void Closed();
  void CountSlowReader() { slow_readers_.Increment(); }
  // An exchange its handler dropped unanswered while its client waited (answered 500).
  void CountDropped() { dropped_.Increment(); }
  // A request the server answered itself before any handler (400, 413, 431, 501).
  void CountRefusedRequest(int status);
  size_t open() const { return open_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;  // keeps the metrics below alive
  prometheus::Family<prometheus::Counter>& accept_errors_;
  prometheus::Counter& refused_connections_;
  prometheus::Gauge& open_connections_;
  prometheus::Counter& slow_readers_;
  prometheus::Counter& dropped_;
  prometheus::Family<prometheus::Counter>& refused_requests_;
  std::atomic<size_t> open_{0};
};

}  // namespace kvfleet::http
