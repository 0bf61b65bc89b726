// Logging: spdlog loggers named by component, one shared sink, a text or JSON format.
//
//   text: 2026-11-21T10:00:00.123Z info  [kv] pool 0: 4096 blocks (131072 tokens)
//   json: {"ts":"2026-11-21T10:00:00.123Z","level":"info","component":"kv","msg":"..."}
//
// Thread safety: InitLogging once at start-up; Logger() from any thread afterwards.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace kvfleet {

struct LogOptions {
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  std::string format = "text";  // text or json
};

// Validates the options and installs the shared sink (stderr) and format.
Status InitLogging(const LogOptions& options);

// The logger for a component ("kv", "router", "events", ...), created on first use.
std::shared_ptr<spdlog::logger> Logger(std::string_view component);

// `text` in double quotes with its control bytes escaped as in C (a CR logs as \r), cut to
// its first `max_bytes` with its size noted: for every logged string a client or a worker chose (a
// model, a worker's name, a path), which must neither forge a line nor flood the log.
std::string EscapeForLog(std::string_view text, size_t max_bytes = 128);

// A guard for messages that may repeat fast (malformed input): true at most once per
// `interval_ms` per instance; counts what it suppressed.
class RateLimit {
 public:
  explicit RateLimit(int64_t interval_ms = 1000) : interval_ns_(interval_ms * 1'000'000) {}
  // Returns true when a message may be logged now; `suppressed` gets the number skipped since.
  bool Allow(uint64_t* suppressed);

 private:
  int64_t interval_ns_;
  std::atomic<int64_t> last_ns_{0};
  std::atomic<uint64_t> skipped_{0};
};

}  // namespace kvfleet
