// The router's decision log (--decision-log FILE): one JSON line per routing decision, with
// every candidate as the kv cost saw it, for finding out why a request went where it went
// (router/README.md, "--decision-log").
//
// Thread safety: Write may be called from any thread; lines are written whole, in call order.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/status.h"
#include "router/routing/policy.h"

namespace kvfleet::router {

struct Decision;

class DecisionLog {
 public:
  // Appends to `path`, created if absent. An error when it cannot be opened for writing.
  static Result<std::unique_ptr<DecisionLog>> Open(const std::string& path);
  ~DecisionLog();
  DecisionLog(const DecisionLog&) = delete;
  DecisionLog& operator=(const DecisionLog&) = delete;

  // One line for `d`, decided at `now`: the request, the choice, and each candidate's load
  // view with its estimated TTFT at `fleet_rate` (Picker::EstimateTtft). A write error stops
  // the log (the first one is logged); routing goes on.
  // `request_id`: the client's X-Request-Id (Prompt::request_id; empty: none).
  void Write(const Decision& d, std::string_view request_id, TimeNs now, double fleet_rate, const Picker& picker);

  // The line Write appends, without its newline.
  static std::string Line(const Decision& d, std::string_view request_id, TimeNs now, double fleet_rate,
                          const Picker& picker);

 private:
  explicit DecisionLog(std::FILE* file) : file_(file) {}

  std::mutex mu_;
  std::FILE* file_;  // GUARDED_BY(mu_); null once a write failed
};

}  // namespace kvfleet::router
