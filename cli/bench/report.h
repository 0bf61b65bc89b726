// The figures of one replay run, the JSON results file, the comparison table, and the
// gnuplot rendering of TTFT CDFs and hit rates per policy.
//
// Thread safety: plain values and functions; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench/ideal_cache.h"
#include "cli/bench/replay.h"
#include "cli/bench/trace.h"
#include "common/status.h"

namespace kvfleet::bench {

struct LatencySummary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;  // seconds
  size_t count = 0;
};

struct RunReport {
  std::string policy;  // "default" when the router chose
  size_t requests = 0, completed = 0, failed = 0;
  std::map<std::string, size_t> errors;            // kind -> count
  // Failed requests by HTTP status: "429" and "503" (refused: overload, no worker), "504"
  // (timed out at the router), "other" (other statuses, and failures without one: a
  // broken or timed-out connection, a stream that ended in an error).
  std::map<std::string, size_t> errors_by_status;
  // Goodput: completed requests whose TTFT met the SLO, per second of the run's wall time.
  double ttft_slo_s = 0;  // 0: no SLO, every completed request counts
  size_t slo_met = 0;
  double goodput_rps = 0;
  LatencySummary refusal;  // send to the end of a 429 or 503 answer: how fast a refusal came
  std::map<std::string, size_t> requests_by_worker;  // completed and failed; "" -> "unknown"
  LatencySummary ttft, itl, e2e, queue;
  double wall_s = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;  // from usage, completed requests
  double output_tokens_per_s = 0;
  double cached_ratio = 0;  // cached_tokens / prompt_tokens
  IdealReuse ideal;
  std::vector<double> ttft_sorted;  // every completed request's TTFT, ascending (for CDFs)
  std::vector<std::string> error_examples;  // the first few error details
  // From the router's kvfleet_router_requests_total, scraped before and after the run
  // (empty when /metrics could not be read). Counts every request the router saw.
  std::map<std::string, double> requests_by_worker_metrics;
  // From kvfleet_router_pulls_total and pulled_blocks_total the same way: requests the routers
  // sent with a pull hint, and the blocks those named (-1: /metrics could not be read).
  double router_pulls = -1;
  double router_pulled_blocks = -1;
  // kvfleet_router_gossip_frames_total{direction="sent"} and gossip_sent_bytes_total the same
  // way, summed over the routers: what their gossip cost (-1: /metrics could not be read).
  double router_gossip_frames = -1;
  double router_gossip_bytes = -1;
};

// Summarizes a run. Failed requests count in `requests`, `errors` and per worker, never
// in latencies or token counts. `ttft_slo_s` (0: none) decides which completed requests
// count toward goodput. Requests sent before `warmup_s` (TraceScale::warmup_s) count nowhere,
// and the rates are per second of the run after it.
RunReport Summarize(std::string policy, ReplayRun& run, const IdealReuse& ideal, double ttft_slo_s = 0,
                    double warmup_s = 0);

struct BenchSettings {
  std::string router_url, trace_path, model;
  TraceScale scale;
  uint32_t vocab_size = 0;
  uint32_t concurrency_limit = 0;
  double ttft_slo_s = 0;  // 0: none
};

// {"settings": ..., "runs": [...]} with percentiles in milliseconds.
nlohmann::json ResultsJson(const BenchSettings& settings, const std::vector<RunReport>& runs);

// One row per run: requests, errors (429, 503, 504, other), TTFT mean/p50/p90/p99, ITL
// p50/p99, E2E p50/p99, output tok/s, goodput, cached ratio and the ideal. Times in ms.
void PrintTable(std::ostream& out, const std::vector<RunReport>& runs);

// Writes a PNG with two panels: the TTFT CDF of every run, and each run's cached-token
// ratio beside the trace's ideal. Runs `plotter` (gnuplot; a bare name is looked up on
// PATH). Returns NotFound, with the install hint, when there is no such program, and
// Internal when it runs and fails.
Status WritePlot(const std::string& png_path, const std::vector<RunReport>& runs, const std::string& title,
                 const std::string& plotter = "gnuplot");

}  // namespace kvfleet::bench
