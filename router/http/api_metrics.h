// The router API's Prometheus metrics (router/README.md lists them): one struct of
// references into the registry, made once per Api.
//
// Thread safety: thread-safe (prometheus-cpp's counters and histograms are).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace kvfleet::router {

// The `model` label of requests for a model the fleet does not know.
inline constexpr std::string_view kOtherModelLabel = "other";

struct ApiMetrics {
  // Registers every metric in `r`, kvfleet_build_info included.
  explicit ApiMetrics(prometheus::Registry& r);

  prometheus::Family<prometheus::Counter>& requests;  // kvfleet_router_requests_total{model,worker,status}
  prometheus::Histogram& routing;                     // kvfleet_router_routing_seconds
  prometheus::Histogram& matched;                     // kvfleet_router_matched_blocks
  prometheus::Family<prometheus::Counter>& cached;    // kvfleet_router_cached_tokens_total{kind}
  prometheus::Counter& predicted;                     // kind="predicted"
  prometheus::Counter& actual;                        // kind="actual"
  prometheus::Histogram& ttft;                        // kvfleet_router_time_to_first_token_seconds
  prometheus::Histogram& itl;                         // kvfleet_router_inter_token_seconds
  prometheus::Family<prometheus::Counter>& refused;   // kvfleet_router_requests_refused_total{model,reason}
  prometheus::Histogram& duration;                    // kvfleet_router_request_duration_seconds
  prometheus::Histogram& queue_time;                  // kvfleet_router_queue_time_seconds
  prometheus::Family<prometheus::Counter>& prompt_tokens;      // kvfleet_router_prompt_tokens_total{model}
  prometheus::Family<prometheus::Counter>& generation_tokens;  // kvfleet_router_generation_tokens_total{model}
  prometheus::Counter& unknown_fields;                // kvfleet_router_unknown_fields_total
  prometheus::Counter& pulls;                         // kvfleet_router_pulls_total: requests sent with a PullHint
  prometheus::Counter& pulled_blocks;                 // kvfleet_router_pulled_blocks_total: the blocks they name
  prometheus::Counter& passed_over_blocks;  // kvfleet_router_passed_over_blocks_total: reuse given up for load
  prometheus::Counter& pulls_of_computing;  // kvfleet_router_pulls_of_computing_total: of pulls, from a holder still computing
  prometheus::Counter& split;                         // kvfleet_router_split_requests_total: prefilled elsewhere (P/D)
  prometheus::Counter& abandoned;  // kvfleet_router_requests_abandoned_total: the client left before the answer ended
  // kvfleet_router_ttft_coefficient{term}: the kv estimate's calibrated coefficients
  // (router/routing/ttft_calibration.h), 1 until calibrated.
  prometheus::Family<prometheus::Gauge>& ttft_coefficient;
  prometheus::Gauge& coefficient_queue;
  prometheus::Gauge& coefficient_own;
  prometheus::Gauge& coefficient_step;
  // kvfleet_router_prefill_ttft_coefficient{term}: the same for --role prefill workers, fitted
  // to split requests' prefill stages (Router::ObservePrefillStage); 1 until calibrated.
  prometheus::Family<prometheus::Gauge>& prefill_ttft_coefficient;
  prometheus::Gauge& prefill_coefficient_queue;
  prometheus::Gauge& prefill_coefficient_own;
  prometheus::Gauge& prefill_coefficient_step;
  // kvfleet_router_pull_bias_seconds: added to a pull's estimate, how much later than estimated
  // pulls' first tokens came beyond the others' (TtftCalibration::pull_bias_s); 0 until known.
  prometheus::Gauge& pull_bias;

  // Counts a request's tokens once it ends (a generation cut short counts what it made).
  void CountTokens(const std::string& model, uint32_t prompt, uint32_t generated);
  // Counts an answer in `requests`, remembering the series under `worker`.
  void CountRequest(const std::string& model, const std::string& worker, const std::string& status);
  // Removes `worker`'s series of `requests`: the fleet forgot it.
  void ForgetWorker(const std::string& worker);

 private:
  std::mutex series_mu_;  // a series is not removed between its Add and its Increment
  std::map<std::string, std::set<prometheus::Counter*>> series_;  // GUARDED_BY(series_mu_); by worker
};

}  // namespace kvfleet::router
