#include "common/log.h"

#include <chrono>
#include <mutex>

#include <nlohmann/json.hpp>
#include <spdlog/fmt/fmt.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "common/clock.h"

namespace kvfleet {
namespace {

// One JSON object per line. nlohmann does the string escaping.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    auto ms = duration_cast<milliseconds>(msg.time.time_since_epoch()).count();
    std::time_t secs = static_cast<std::time_t>(ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char ts[64];
    std::snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
    nlohmann::json j;
    j["ts"] = ts;
    auto level = spdlog::level::to_string_view(msg.level);
    j["level"] = std::string(level.data(), level.size());
    j["component"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    j["msg"] = std::string(msg.payload.data(), msg.payload.size());
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line.push_back('\n');
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

struct LogState {
  std::mutex mu;
  spdlog::sink_ptr sink;
  spdlog::level::level_enum level = spdlog::level::info;
};

LogState& State() {
  static LogState state;
  return state;
}

void ApplyFormat(const spdlog::sink_ptr& sink, bool json) {
  if (json) {
    sink->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    sink->set_formatter(std::make_unique<spdlog::pattern_formatter>("%Y-%m-%dT%H:%M:%S.%eZ %-5l [%n] %v",
                                                                    spdlog::pattern_time_type::utc));
  }
}

spdlog::sink_ptr SharedSink() {
  auto& st = State();
  if (!st.sink) {
    st.sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    ApplyFormat(st.sink, false);
  }
  return st.sink;
}

}  // namespace

Status InitLogging(const LogOptions& options) {
  auto level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return InvalidArgument("unknown --log-level '" + options.level +
                           "' (expected trace, debug, info, warn, error, critical or off)");
  }
  if (options.format != "text" && options.format != "json") {
    return InvalidArgument("unknown --log-format '" + options.format + "' (expected text or json)");
  }
  auto& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  ApplyFormat(SharedSink(), options.format == "json");
  st.level = level;
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) { l->set_level(level); });
  return Status::Ok();
}

std::shared_ptr<spdlog::logger> Logger(std::string_view component) {
  std::string name(component);
  if (auto existing = spdlog::get(name)) return existing;
  auto& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = std::make_shared<spdlog::logger>(name, SharedSink());
  logger->set_level(st.level);
  logger->flush_on(spdlog::level::warn);
  spdlog::register_logger(logger);
  return logger;
}

std::string EscapeForLog(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return fmt::format("{:?}", text);
  return fmt::format("{:?}... ({} bytes)", text.substr(0, max_bytes), text.size());
}

bool RateLimit::Allow(uint64_t* suppressed) {
  int64_t now = SystemClock::Default()->Now();
  int64_t last = last_ns_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < interval_ns_) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (!last_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    skipped_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  uint64_t s = skipped_.exchange(0, std::memory_order_relaxed);
  if (suppressed) *suppressed = s;
  return true;
}

}  // namespace kvfleet
