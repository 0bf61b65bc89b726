#include "router/routing/decision_log.h"

#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "router/routing/router.h"

namespace kvfleet::router {

Result<std::unique_ptr<DecisionLog>> DecisionLog::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    return InvalidArgument("--decision-log " + path + ": cannot open for appending: " + std::strerror(errno));
  }
  return std::unique_ptr<DecisionLog>(new DecisionLog(file));
}

DecisionLog::~DecisionLog() {
  if (file_ != nullptr) std::fclose(file_);
}

std::string DecisionLog::Line(const Decision& d, TimeNs now, double fleet_rate, const Picker& picker) {
  std::string line;
  char buf[1024];  // twice the longest field list with every number at its widest: nothing is cut
  std::snprintf(buf, sizeof(buf),
                R"({"t_s":%.6f,"policy":"%s","prompt_tokens":%u,"worker":%u,"estimated_ttft_s":%.6g,)"
                R"("predicted_cached_tokens":%u,"pull_from":%d,"pull_blocks":%u,"split":%s,"fleet_load":%.4g,)"
                R"("fleet_rate":%.6g,"candidates":[)",
                static_cast<double>(now) / kNsPerSec, std::string(PolicyName(d.policy)).c_str(), d.route.prompt_tokens,
                d.worker, d.estimated_ttft_s, d.predicted_cached_tokens,
                d.pull.source.empty() ? -1 : static_cast<int>(d.pull_from), d.pull.source.empty() ? 0 : d.pull.blocks,
                d.split ? "true" : "false", d.route.fleet_load, fleet_rate);
  line += buf;
  if (d.candidates != nullptr) {
    bool first = true;
    for (const Candidate& c : *d.candidates) {
      std::snprintf(buf, sizeof(buf),
                    R"(%s{"worker":%u,"device_blocks":%u,"host_blocks":%u,"pull_blocks":%u,"pull_s":%.6g,)"
                    R"("queued_prefill_tokens":%.10g,"prefill_tokens_per_s":%.6g,"admission_wait_s":%.6g,)"
                    R"("running_requests":%.6g,"waiting_requests":%.6g,"step_s":%.6g,"ttft_s":%.6g})",
                    first ? "" : ",", c.worker, c.device_blocks, c.host_blocks, c.pull_blocks, c.pull_s,
                    c.queued_prefill_tokens, c.prefill_tokens_per_s, c.admission_wait_s, c.running_requests,
                    c.waiting_requests, c.step_s, picker.EstimateTtft(d.route, c, fleet_rate));
      line += buf;
      first = false;
    }
  }
  line += "]}";
  return line;
}

void DecisionLog::Write(const Decision& d, TimeNs now, double fleet_rate, const Picker& picker) {
  std::string line = Line(d, now, fleet_rate, picker);
  line += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  if (file_ == nullptr) return;
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    Logger("router")->error("--decision-log: write failed ({}); no more decisions are logged", std::strerror(errno));
    std::fclose(file_);
    file_ = nullptr;
  }
}

}  // namespace kvfleet::router
