#include "router/routing/decision_log.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

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
  const bool pulls = !d.pull.source.empty();
  nlohmann::ordered_json line = {{"t_s", static_cast<double>(now) / kNsPerSec},
                                 {"policy", std::string(PolicyName(d.policy))},
                                 {"prompt_tokens", d.route.prompt_tokens},
                                 {"worker", d.worker},
                                 {"estimated_ttft_s", d.estimated_ttft_s},
                                 {"predicted_cached_tokens", d.predicted_cached_tokens},
                                 {"pull_from", pulls ? static_cast<int64_t>(d.pull_from) : -1},
                                 {"pull_blocks", pulls ? d.pull.blocks : 0},
                                 {"split", d.split.has_value()},
                                 {"fleet_load", d.route.fleet_load},
                                 {"fleet_rate", fleet_rate}};
  const TtftCoefficients k = picker.Coefficients();
  line["ttft_coefficients"] = {{"queue", k.queue}, {"own", k.own}, {"step", k.step}};
  nlohmann::ordered_json& candidates = line["candidates"] = nlohmann::ordered_json::array();
  if (d.candidates != nullptr) {
    for (const Candidate& c : *d.candidates) {
      candidates.push_back({{"worker", c.worker},
                            {"device_blocks", c.device_blocks},
                            {"host_blocks", c.host_blocks},
                            {"pull_blocks", c.pull_blocks},
                            {"pull_s", c.pull_s},
                            {"queued_prefill_tokens", c.queued_prefill_tokens},
                            {"prefill_tokens_per_s", c.prefill_tokens_per_s},
                            {"admission_wait_s", c.admission_wait_s},
                            {"running_requests", c.running_requests},
                            {"waiting_requests", c.waiting_requests},
                            {"step_s", c.step_s},
                            {"ttft_s", picker.EstimateTtft(d.route, c, fleet_rate)}});
    }
  }
  return line.dump();
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
