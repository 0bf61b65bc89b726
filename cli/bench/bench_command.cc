// kvfleet bench: replays a Mooncake-format trace against a router and reports latency,
// throughput and prefix reuse; --compare runs it once per routing policy.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/bench/fleet_process.h"
#include "cli/bench/ideal_cache.h"
#include "cli/bench/prompt_builder.h"
#include "cli/bench/replay.h"
#include "cli/bench/report.h"
#include "cli/bench/trace.h"
#include "cli/commands.h"

namespace kvfleet::cli {

namespace {

namespace config {
// Default vocabulary for prompt tokens: fits every supported tokenizer (Llama 2 has the
// smallest, 32,000) and stays below Llama 3's special tokens.
inline constexpr uint32_t kDefaultVocabSize = 32000;
// How long --fleet-cmd may take to bring the router to /ready (model loads included).
inline constexpr double kDefaultReadyTimeoutS = 120;
}  // namespace config

struct BenchArgs {
  bench::ReplayOptions replay;
  bench::TraceScale scale;
  std::string trace_path;
  uint32_t vocab_size = config::kDefaultVocabSize;
  std::string compare;     // comma-separated policies; empty: one run
  bool compare_retention = false;  // each policy without, then with, replay.retention
  std::string fleet_cmd;   // restarts the fleet before each --compare run
  double ready_timeout_s = config::kDefaultReadyTimeoutS;
  int fleet_workers = 0;   // with --fleet-cmd: routable workers to wait for before each run
  std::string out_path;
  std::string plot_path;
  std::string requests_out_path;  // one JSON line per request (chaos tests read it)
  double ttft_slo_ms = 0;  // goodput counts completed requests with TTFT within it; 0: all
  bool quiet = false;
  bool dry_run = false;  // print the trace's figures and stop
};

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// One connection per in-flight request: lift the soft open-file limit to the hard one.
void RaiseOpenFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// One JSON object per request of one run: when it left, where it went, how it ended.
void WriteRequestLines(std::ostream& out, const std::string& policy, const bench::ReplayRun& run) {
  for (size_t i = 0; i < run.outcomes.size(); ++i) {
    const bench::RequestOutcome& o = run.outcomes[i];
    nlohmann::json j = {{"policy", policy},       {"index", i}, {"request_id", o.request_id},
                        {"arrival_s", o.arrival_s}, {"sent_unix_s", o.sent_unix_s},
                        {"ok", o.ok},              {"error", o.error},
                        {"http_status", o.http_status}, {"router", o.router}, {"worker", o.worker},
                        {"ttft_s", o.ttft_s},      {"e2e_s", o.e2e_s},
                        {"prompt_tokens", o.prompt_tokens}, {"cached_tokens", o.cached_tokens}};
    if (!o.token_gaps_s.empty()) {  // inter-token gaps: their mean (TPOT) and the longest
      double sum = 0, longest = 0;
      for (double g : o.token_gaps_s) {
        sum += g;
        longest = std::max(longest, g);
      }
      j["itl_mean_s"] = sum / static_cast<double>(o.token_gaps_s.size());
      j["itl_max_s"] = longest;
    }
    if (!o.error_detail.empty()) j["error_detail"] = o.error_detail;
    if (o.connect_retries > 0) j["connect_retries"] = o.connect_retries;
    out << j.dump() << "\n";
  }
}

// Every router's counters, summed (each router counts its own requests and pulls).
Result<bench::RouterCounters> ScrapeAll(const bench::ReplayOptions& options) {
  bench::RouterCounters sum;
  for (const std::string& url : options.RouterUrls()) {
    KVF_ASSIGN_OR_RETURN(auto counts, bench::ScrapeRouterCounters(url));
    for (const auto& [worker, n] : counts.requests_by_worker) sum.requests_by_worker[worker] += n;
    sum.pulls += counts.pulls;
    sum.pulled_blocks += counts.pulled_blocks;
    sum.gossip_frames += counts.gossip_frames;
    sum.gossip_bytes += counts.gossip_bytes;
  }
  return sum;
}

int RunBench(const BenchArgs& args) {
  auto fail = [](const Status& s) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  };
  if (Status s = args.scale.Validate(); !s.ok()) return fail(s);
  if (Status s = args.replay.Validate(); !s.ok()) return fail(s);
  if (args.vocab_size < 2) return fail(InvalidArgument("--vocab-size must be >= 2"));
  if (!(args.ttft_slo_ms >= 0)) return fail(InvalidArgument("--ttft-slo-ms must be >= 0 (0: no SLO)"));
  const double ttft_slo_s = args.ttft_slo_ms / 1e3;
  auto trace = bench::LoadTrace(args.trace_path);
  if (!trace.ok()) return fail(trace.status());
  const auto requests = bench::ScaleTrace(*trace, args.scale);
  if (args.scale.warmup_s > 0 && (requests.empty() || requests.back().arrival_s < args.scale.warmup_s)) {
    std::ostringstream message;
    message << "--warmup-s " << args.scale.warmup_s << " is past the last arrival ("
            << (requests.empty() ? 0.0 : requests.back().arrival_s) << " s): nothing would be measured";
    return fail(InvalidArgument(message.str()));
  }
  const bench::PromptBuilder prompts(args.vocab_size, args.scale.block_tokens());
  const bench::IdealReuse ideal =
      bench::ComputeIdealReuse(requests, args.scale.block_tokens(), args.scale.warmup_s);
  RaiseOpenFileLimit();

  if (args.compare_retention && args.replay.retention.prefix_tokens == 0)
    return fail(InvalidArgument("--compare-retention needs --retain-prefix-tokens (the range to retain)"));
  std::vector<std::string> policies = SplitList(args.compare);
  if (policies.empty()) policies.push_back(args.replay.policy);
  // One run per policy, or two with --compare-retention: without kv_retention, then with it.
  struct Run {
    std::string policy;
    bool retain = false;
    std::string label;
  };
  std::vector<Run> runs;
  for (const std::string& policy : policies) {
    const std::string name = policy.empty() ? "default" : policy;
    const bool retain = args.replay.retention.prefix_tokens > 0;
    if (args.compare_retention) runs.push_back({policy, false, name});
    runs.push_back({policy, retain, retain ? name + "+retain" : name});
  }
  const bool comparing = runs.size() > 1;
  std::cerr << "bench: " << requests.size() << " requests from " << args.trace_path << " (time scale "
            << args.scale.time_scale << ", length scale " << args.scale.length_scale << ", block "
            << args.scale.block_tokens() << " tokens";
  if (args.scale.warmup_s > 0) std::cerr << "; arrivals before " << args.scale.warmup_s << " s a warm-up";
  std::cerr << "); ideal cached-token ratio " << ideal.token_ratio()
            << " (blocks " << ideal.block_ratio() << ")\n";
  if (args.dry_run) {
    uint64_t output_tokens = 0;
    for (const auto& r : requests) output_tokens += r.output_length;
    std::cout << "requests " << requests.size() << "\nspan_s " << (requests.empty() ? 0 : requests.back().arrival_s)
              << "\nprompt_tokens " << ideal.prompt_tokens << "\noutput_tokens " << output_tokens
              << "\nblock_tokens " << args.scale.block_tokens() << "\nideal_cached_token_ratio "
              << ideal.token_ratio() << "\nideal_cached_block_ratio " << ideal.block_ratio() << "\n";
    return 0;
  }

  std::ofstream request_lines;
  if (!args.requests_out_path.empty()) {
    request_lines.open(args.requests_out_path);
    if (!request_lines) return fail(Internal("cannot write " + args.requests_out_path));
  }
  std::vector<bench::RunReport> reports;
  std::string model = args.replay.model;
  const auto run_id = std::chrono::system_clock::now().time_since_epoch().count();
  // One run: its fleet started and ready, the trace replayed, its report appended. An error
  // leaves `reports` as it was.
  auto measure = [&](const Run& spec) -> Status {
    const std::string& policy = spec.policy;
    bench::ReplayOptions options = args.replay;
    options.policy = policy;
    options.progress = !args.quiet;
    if (!spec.retain) options.retention = {};
    // A fresh salt per run: blocks cached by an earlier run hash differently, so they
    // cannot help this one even when the fleet is not restarted.
    if (comparing) options.cache_salt = "kvfleet-bench-" + std::to_string(run_id) + "-" + spec.label;
    bench::FleetProcess fleet;
    if (!args.fleet_cmd.empty()) {
      KVF_RETURN_IF_ERROR(fleet.Start(args.fleet_cmd));
      for (const std::string& url : options.RouterUrls()) {
        KVF_RETURN_IF_ERROR(fleet.WaitReady(url, args.ready_timeout_s, args.fleet_workers));
      }
    }
    if (options.model.empty()) {
      KVF_ASSIGN_OR_RETURN(options.model, bench::OnlyModel(options.RouterUrls().front()));
      std::cerr << "bench: model " << options.model << "\n";
    }
    model = options.model;
    std::cerr << "bench: run " << (policy.empty() ? "(router's default policy)" : policy);
    if (spec.retain) {
      std::cerr << " with kv_retention: tokens [0, " << options.retention.prefix_tokens << ") at priority "
                << options.retention.priority;
      if (options.retention.duration_ms > 0) std::cerr << " for " << options.retention.duration_ms << " ms";
    }
    std::cerr << "\n";
    auto before = ScrapeAll(options);
    auto run = bench::Replay(requests, prompts, options);
    auto after = ScrapeAll(options);
    // A worker lost during the run leaves its results those of a smaller fleet: not reported as the whole.
    Status whole = Status::Ok();
    if (!args.fleet_cmd.empty() && args.fleet_workers > 0) {
      for (const std::string& url : options.RouterUrls()) {
        auto routable = bench::RoutableWorkers(url);
        if (!routable.ok() || *routable < args.fleet_workers) {
          whole = Unavailable("the fleet lost workers during the " + spec.label + " run: " +
                              (routable.ok() ? std::to_string(*routable) : routable.status().message()) + " of " +
                              std::to_string(args.fleet_workers) + " workers routable at " + url + " at its end");
        }
      }
    }
    fleet.Stop();
    KVF_RETURN_IF_ERROR(run.status());
    KVF_RETURN_IF_ERROR(whole);
    if (request_lines.is_open()) WriteRequestLines(request_lines, spec.label, *run);
    reports.push_back(bench::Summarize(spec.label, *run, ideal, ttft_slo_s, args.scale.warmup_s));
    bench::RunReport& r = reports.back();
    if (before.ok() && after.ok()) {
      for (const auto& [worker, n] : after->requests_by_worker) {
        const auto was = before->requests_by_worker.find(worker);
        double d = n - (was != before->requests_by_worker.end() ? was->second : 0.0);
        if (d > 0) r.requests_by_worker_metrics[worker] = d;
      }
      r.router_pulls = after->pulls - before->pulls;
      r.router_pulled_blocks = after->pulled_blocks - before->pulled_blocks;
      r.router_gossip_frames = after->gossip_frames - before->gossip_frames;
      r.router_gossip_bytes = after->gossip_bytes - before->gossip_bytes;
    }
    std::cerr << "bench: " << r.policy << ": " << r.completed << " completed, " << r.failed << " failed (429 "
              << r.errors_by_status["429"] << ", 503 " << r.errors_by_status["503"] << ", 504 "
              << r.errors_by_status["504"] << ", other " << r.errors_by_status["other"] << "); by worker:";
    for (const auto& [worker, n] : r.requests_by_worker) std::cerr << " " << worker << "=" << n;
    if (!r.requests_by_worker_metrics.empty()) {
      std::cerr << "; by worker (router metrics):";
      for (const auto& [worker, n] : r.requests_by_worker_metrics) std::cerr << " " << worker << "=" << n;
    }
    if (r.router_pulls >= 0) std::cerr << "; pulls " << r.router_pulls << " (" << r.router_pulled_blocks << " blocks)";
    if (r.router_gossip_frames > 0) {
      std::cerr << "; gossip " << r.router_gossip_frames << " messages, " << r.router_gossip_bytes << " bytes";
    }
    std::cerr << "\n";
    for (const auto& e : r.error_examples) std::cerr << "bench:   error " << e << "\n";
    return Status::Ok();
  };
  // A run that cannot be measured (its fleet not ready, workers lost, the router gone) ends
  // the comparison; the runs measured before it are still reported, with what stopped it.
  Status stopped = Status::Ok();
  std::vector<std::string> not_measured;
  for (const Run& spec : runs) {
    if (stopped.ok()) stopped = measure(spec);
    if (!stopped.ok()) not_measured.push_back(spec.label);
  }
  if (!stopped.ok() && reports.empty()) return fail(stopped);

  bench::PrintTable(std::cout, reports);
  bench::BenchSettings settings{args.replay.router_url, args.trace_path, model, args.scale,
                                args.vocab_size, args.replay.concurrency_limit, ttft_slo_s};
  if (!args.out_path.empty()) {
    nlohmann::json results = bench::ResultsJson(settings, reports);
    if (!stopped.ok()) results["stopped"] = {{"error", stopped.message()}, {"runs_not_measured", not_measured}};
    std::ofstream out(args.out_path);
    out << results.dump(2) << "\n";
    if (!out) return fail(Internal("cannot write " + args.out_path));
    std::cerr << "bench: results in " << args.out_path << "\n";
  }
  if (!args.plot_path.empty()) {
    std::ostringstream title;
    title << "kvfleet bench: " << args.trace_path.substr(args.trace_path.find_last_of('/') + 1) << ", time x"
          << args.scale.time_scale << ", lengths /" << args.scale.length_scale << ", " << requests.size()
          << " requests";
    // The results are written by now. A missing gnuplot costs only the picture: the
    // exit status still says whether every request completed.
    if (Status s = bench::WritePlot(args.plot_path, reports, title.str()); s.code() == StatusCode::kNotFound) {
      std::cerr << "bench: " << s.message() << "\n";
    } else if (!s.ok()) {
      return fail(s);
    } else {
      std::cerr << "bench: plot in " << args.plot_path << "\n";
    }
  }
  if (!stopped.ok()) {
    std::cerr << "error: the " << not_measured.front() << " run: " << stopped.message() << " (not measured: ";
    for (size_t i = 0; i < not_measured.size(); ++i) std::cerr << (i > 0 ? ", " : "") << not_measured[i];
    std::cerr << "; the runs before it are reported above)\n";
    return 2;
  }
  size_t failed = 0;
  for (const auto& r : reports) failed += r.failed;
  return failed == 0 ? 0 : 1;
}

}  // namespace

Action AddBenchCommand(CLI::App& parent) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = parent.add_subcommand("bench", "replay a Mooncake-format trace against a router and report");
  cmd->add_option("--router", args->replay.router_url,
                  "router base URL, or several separated by ',' (requests spread evenly over them)")
      ->capture_default_str();
  cmd->add_option("--trace", args->trace_path, "Mooncake-format JSONL trace")->required();
  cmd->add_option("--time-scale", args->scale.time_scale, "replay this many times faster than the trace")
      ->capture_default_str();
  cmd->add_option("--length-scale", args->scale.length_scale,
                  "divide token lengths by this (a power of two; blocks become 512/Y tokens)")
      ->capture_default_str();
  cmd->add_option("--concurrency-limit", args->replay.concurrency_limit, "most requests in flight")
      ->capture_default_str();
  cmd->add_option("--duration", args->scale.duration_s, "replay only arrivals in the first S seconds (0: all)")
      ->capture_default_str();
  cmd->add_option("--warmup-s", args->scale.warmup_s,
                  "send the arrivals of the first S seconds but leave them out of every figure and of the ideal "
                  "(the router's /metrics counts stay whole-run)")
      ->capture_default_str();
  cmd->add_option("--model", args->replay.model, "\"model\" of each request (empty: the router's only model)");
  cmd->add_option("--vocab-size", args->vocab_size, "prompt token ids are drawn from [0, N)")->capture_default_str();
  cmd->add_option("--policy", args->replay.policy, "routing policy override for a single run (empty: router's)");
  cmd->add_option("--cache-salt", args->replay.cache_salt, "cache_salt of every request of a single run");
  cmd->add_option("--compare", args->compare, "run once per policy, e.g. round_robin,least_loaded,kv,approx");
  auto* retain = cmd->add_option("--retain-prefix-tokens", args->replay.retention.prefix_tokens,
                                 "attach kv_retention to every request: its first N prompt tokens (after "
                                 "--length-scale) at --retain-priority (0: none)")
                     ->capture_default_str()
                     ->check(CLI::Range(1u, std::numeric_limits<uint32_t>::max()));
  cmd->add_option("--retain-priority", args->replay.retention.priority, "priority of the retained range, 0..100")
      ->capture_default_str()
      ->needs(retain);
  cmd->add_option("--retain-duration-ms", args->replay.retention.duration_ms,
                  "the retained range's duration_ms (0: for good)")
      ->capture_default_str()
      ->needs(retain);
  cmd->add_flag("--compare-retention", args->compare_retention,
                "run each policy twice, without and then with the --retain-* kv_retention (labelled +retain)");
  cmd->add_option("--fleet-cmd", args->fleet_cmd,
                  "shell command that starts the fleet; run (and stopped) around each --compare run");
  cmd->add_option("--ready-timeout", args->ready_timeout_s, "seconds --fleet-cmd may take to be ready")
      ->capture_default_str();
  cmd->add_option("--fleet-workers", args->fleet_workers,
                  "with --fleet-cmd: before each run, wait (within --ready-timeout) until the router lists this many "
                  "routable workers (GET /fleet), and after it check they still are; else stop with an error; 0: "
                  "the router's /ready alone")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--request-timeout", args->replay.request_timeout_s, "per-request deadline (s)")
      ->capture_default_str();
  cmd->add_option("--ttft-slo-ms", args->ttft_slo_ms,
                  "goodput counts the completed requests whose TTFT is within this (ms; 0: every completed one)")
      ->capture_default_str();
  cmd->add_option("--out", args->out_path, "write JSON results here");
  cmd->add_option("--plot", args->plot_path, "write a PNG (TTFT CDF and hit rate per policy) here");
  cmd->add_option("--requests-out", args->requests_out_path,
                  "write one JSON line per request (send time, worker, outcome) here");
  cmd->add_flag("--quiet", args->quiet, "no progress lines");
  cmd->add_flag("--dry-run", args->dry_run, "print the scaled trace's size and ideal cached ratio; send nothing");
  return [args]() { return RunBench(*args); };
}

}  // namespace kvfleet::cli
