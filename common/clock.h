// Clock: every component that needs time takes one, so eviction durations,
// heartbeats and TTLs can be tested without sleeping.
//
// Times are nanoseconds on a monotonic clock (TimeNs). WallNs() is Unix time, used
// only for timestamps that cross processes (event creation time for lag metrics).
//
// Thread safety: SystemClock and ManualClock are safe to call from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvfleet {

using TimeNs = int64_t;      // monotonic nanoseconds
using DurationNs = int64_t;  // nanoseconds

constexpr DurationNs kNsPerUs = 1'000;
constexpr DurationNs kNsPerMs = 1'000'000;
constexpr DurationNs kNsPerSec = 1'000'000'000;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time: never goes backwards.
  virtual TimeNs Now() const = 0;
  // Wall-clock Unix time in nanoseconds.
  virtual TimeNs WallNs() const = 0;
};

class SystemClock final : public Clock {
 public:
  TimeNs Now() const override;
  TimeNs WallNs() const override;
  // A process-wide instance.
  static SystemClock* Default();
};

// A clock that moves only when told to. Starts at `start`.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimeNs start = 1'000'000'000) : now_(start) {}
  TimeNs Now() const override { return now_.load(std::memory_order_acquire); }
  TimeNs WallNs() const override { return Now(); }
  // REQUIRES: d >= 0.
  void Advance(DurationNs d) { now_.fetch_add(d, std::memory_order_acq_rel); }
  void AdvanceMs(int64_t ms) { Advance(ms * kNsPerMs); }
  // REQUIRES: t >= Now().
  void Set(TimeNs t) { now_.store(t, std::memory_order_release); }

 private:
  std::atomic<TimeNs> now_;
};

}  // namespace kvfleet
