#include "router/routing/decision_log.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "router/routing/router.h"

namespace kvfleet::router {

namespace {

nlohmann::ordered_json TermsJson(const TtftTerms& t) {
  return {{"queue_s", t.queue_s}, {"own_s", t.own_s}, {"step_s", t.step_s}, {"rest_s", t.rest_s}};
}

nlohmann::ordered_json CandidatesJson(const RouteRequest& route, const std::vector<Candidate>* candidates,
                                      double fleet_rate, const Picker& picker) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  if (candidates == nullptr) return out;
  for (const Candidate& c : *candidates) {
    out.push_back({{"worker", c.worker},
                   {"device_blocks", c.device_blocks},
                   {"host_blocks", c.host_blocks},
                   {"pull_blocks", c.pull_blocks},
                   {"pull_s", c.pull_s},
                   {"pull_failed_share", c.pull_failed_share},
                   {"queued_prefill_tokens", c.queued_prefill_tokens},
                   {"prefill_tokens_per_s", c.prefill_tokens_per_s},
                   {"admission_wait_s", c.admission_wait_s},
                   {"pulled_wait_s", c.pulled_wait_s},
                   {"running_requests", c.running_requests},
                   {"waiting_requests", c.waiting_requests},
                   {"step_s", c.step_s},
                   {"ttft_s", picker.EstimateTtft(route, c, fleet_rate)}});
  }
  return out;
}

}  // namespace

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

std::string DecisionLog::Line(const Decision& d, std::string_view request_id, TimeNs now, double fleet_rate,
                              const Picker& picker) {
  const bool pulls = !d.pull.source.empty();
  nlohmann::ordered_json line = {{"t_s", static_cast<double>(now) / kNsPerSec},
                                 {"request_id", request_id},
                                 {"policy", std::string(PolicyName(d.policy))},
                                 {"prompt_tokens", d.route.prompt_tokens},
                                 {"worker", d.worker},
                                 {"estimated_ttft_s", d.estimated_ttft_s},
                                 {"predicted_cached_tokens", d.predicted_cached_tokens},
                                 {"pull_from", pulls ? static_cast<int64_t>(d.pull_from) : -1},
                                 {"pull_blocks", pulls ? d.pull.blocks : 0},
                                 {"split", d.split.has_value()},
                                 {"fleet_load", d.route.fleet_load},
                                 {"follow_ups", d.route.follow_ups},
                                 {"pull_bias_s", d.pull_bias_s},
                                 {"fleet_rate", fleet_rate}};
  const TtftCoefficients k = picker.Coefficients();
  line["ttft_coefficients"] = {{"queue", k.queue}, {"own", k.own}, {"step", k.step}};
  if (d.ttft_terms) line["ttft_terms"] = TermsJson(*d.ttft_terms);  // what the calibration will check
  line["candidates"] = CandidatesJson(d.route, d.candidates.get(), fleet_rate, picker);
  if (d.split) {  // the prefill stage: its worker, estimate and pool, as the split saw them
    const SplitPrefill& s = *d.split;
    nlohmann::ordered_json& prefill = line["prefill"] = {{"worker", s.worker},
                                                         {"estimated_ttft_s", s.estimated_ttft_s},
                                                         {"predicted_cached_tokens", s.predicted_cached_tokens},
                                                         {"pull_s", s.pull_s}};
    if (s.candidates != nullptr && !s.candidates->empty()) {
      const TtftCoefficients p = picker.Coefficients(s.candidates->front());
      prefill["ttft_coefficients"] = {{"queue", p.queue}, {"own", p.own}, {"step", p.step}};
      if (s.ttft_terms) prefill["ttft_terms"] = TermsJson(*s.ttft_terms);
      prefill["candidates"] =
          CandidatesJson(d.route, s.candidates.get(), picker.FleetRate(*s.candidates), picker);
    }
  }
  return line.dump();
}

void DecisionLog::Write(const Decision& d, std::string_view request_id, TimeNs now, double fleet_rate,
                        const Picker& picker) {
  std::string line = Line(d, request_id, now, fleet_rate, picker);
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
