#include "cli/bench/report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "cli/bench/stats.h"

namespace kvfleet::bench {

namespace {

// How many error details a report keeps, and how many CDF points a plot or the JSON gets.
constexpr size_t kErrorExamples = 5;
constexpr size_t kMaxCdfPoints = 2000;

LatencySummary Summary(Samples& s) {
  return {s.Mean(), s.Percentile(50), s.Percentile(90), s.Percentile(99), s.count()};
}

nlohmann::json Ms(const LatencySummary& l) {
  auto ms = [](double s) { return std::round(s * 1e6) / 1e3; };
  return {{"mean", ms(l.mean)}, {"p50", ms(l.p50)}, {"p90", ms(l.p90)}, {"p99", ms(l.p99)}, {"count", l.count}};
}

// (value, cumulative fraction) points of a sorted sample, at most kMaxCdfPoints.
std::vector<std::pair<double, double>> CdfPoints(const std::vector<double>& sorted) {
  std::vector<std::pair<double, double>> points;
  if (sorted.empty()) return points;
  const size_t step = std::max<size_t>(1, sorted.size() / kMaxCdfPoints);
  for (size_t i = 0; i < sorted.size(); i += step) {
    points.emplace_back(sorted[i], double(i + 1) / double(sorted.size()));
  }
  points.emplace_back(sorted.back(), 1.0);
  return points;
}

std::string GnuplotString(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else out += c;
  }
  return out + "'";
}

// True when `program` can be run: an executable path, or a bare name found on PATH.
bool CanRun(const std::string& program) {
  if (program.find('/') != std::string::npos) return access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "";
  while (true) {
    size_t end = dirs.find(':');
    std::string dir(dirs.substr(0, end));
    if (dir.empty()) dir = ".";
    if (access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    if (end == std::string_view::npos) return false;
    dirs.remove_prefix(end + 1);
  }
}

}  // namespace

RunReport Summarize(std::string policy, ReplayRun& run, const IdealReuse& ideal, double ttft_slo_s,
                    double warmup_s) {
  RunReport r;
  r.policy = std::move(policy);
  r.ideal = ideal;
  r.wall_s = std::max(0.0, run.wall_s - warmup_s);
  r.ttft_slo_s = ttft_slo_s;
  for (const char* status : {"429", "503", "504", "other"}) r.errors_by_status[status] = 0;
  Samples ttft, itl, e2e, queue, refusal;
  for (const RequestOutcome& o : run.outcomes) {
    if (o.arrival_s < warmup_s) continue;
    ++r.requests;
    ++r.requests_by_worker[o.worker.empty() ? "unknown" : o.worker];
    queue.Add(o.queue_s);
    if (!o.ok) {
      ++r.failed;
      ++r.errors[o.error];
      const bool http_error = o.error.rfind("http_", 0) == 0;
      const std::string status = std::to_string(o.http_status);
      ++r.errors_by_status[http_error && r.errors_by_status.count(status) ? status : "other"];
      if (http_error && (o.http_status == 429 || o.http_status == 503) && o.e2e_s >= 0) refusal.Add(o.e2e_s);
      if (r.error_examples.size() < kErrorExamples) r.error_examples.push_back(o.error + ": " + o.error_detail);
      continue;
    }
    ++r.completed;
    if (ttft_slo_s <= 0 || (o.ttft_s >= 0 && o.ttft_s <= ttft_slo_s)) ++r.slo_met;
    if (o.ttft_s >= 0) ttft.Add(o.ttft_s);
    e2e.Add(o.e2e_s);
    for (double g : o.token_gaps_s) itl.Add(g);
    r.prompt_tokens += o.prompt_tokens;
    r.cached_tokens += o.cached_tokens;
    r.completion_tokens += o.completion_tokens;
  }
  r.ttft = Summary(ttft);
  r.itl = Summary(itl);
  r.e2e = Summary(e2e);
  r.queue = Summary(queue);
  r.refusal = Summary(refusal);
  r.ttft_sorted = ttft.Sorted();
  r.output_tokens_per_s = r.wall_s > 0 ? double(r.completion_tokens) / r.wall_s : 0.0;
  r.goodput_rps = r.wall_s > 0 ? double(r.slo_met) / r.wall_s : 0.0;
  r.cached_ratio = r.prompt_tokens ? double(r.cached_tokens) / double(r.prompt_tokens) : 0.0;
  return r;
}

nlohmann::json ResultsJson(const BenchSettings& settings, const std::vector<RunReport>& runs) {
  nlohmann::json j;
  j["settings"] = {
      {"router", settings.router_url},
      {"trace", settings.trace_path},
      {"model", settings.model},
      {"time_scale", settings.scale.time_scale},
      {"length_scale", settings.scale.length_scale},
      {"block_tokens", settings.scale.block_tokens()},
      {"duration_s", settings.scale.duration_s},
      {"warmup_s", settings.scale.warmup_s},
      {"vocab_size", settings.vocab_size},
      {"concurrency_limit", settings.concurrency_limit},
      {"ttft_slo_ms", settings.ttft_slo_s * 1e3},
  };
  j["runs"] = nlohmann::json::array();
  for (const RunReport& r : runs) {
    nlohmann::json cdf = nlohmann::json::array();
    for (auto [v, f] : CdfPoints(r.ttft_sorted)) cdf.push_back({std::round(v * 1e6) / 1e3, f});
    j["runs"].push_back({
        {"policy", r.policy},
        {"requests", r.requests},
        {"completed", r.completed},
        {"failed", r.failed},
        {"errors", r.errors},
        {"errors_by_status", r.errors_by_status},
        {"error_examples", r.error_examples},
        {"ttft_slo_ms", r.ttft_slo_s * 1e3},
        {"slo_met", r.slo_met},
        {"goodput_rps", r.goodput_rps},
        {"refusal_ms", Ms(r.refusal)},
        {"requests_by_worker", r.requests_by_worker},
        {"requests_by_worker_router_metrics", r.requests_by_worker_metrics},
        {"router_pulls", r.router_pulls},
        {"router_pulled_blocks", r.router_pulled_blocks},
        {"router_gossip_frames", r.router_gossip_frames},
        {"router_gossip_bytes", r.router_gossip_bytes},
        {"ttft_ms", Ms(r.ttft)},
        {"inter_token_ms", Ms(r.itl)},
        {"e2e_ms", Ms(r.e2e)},
        {"client_queue_ms", Ms(r.queue)},
        {"wall_s", r.wall_s},
        {"prompt_tokens", r.prompt_tokens},
        {"cached_tokens", r.cached_tokens},
        {"completion_tokens", r.completion_tokens},
        {"output_tokens_per_s", r.output_tokens_per_s},
        {"cached_token_ratio", r.cached_ratio},
        {"ideal_cached_token_ratio", r.ideal.token_ratio()},
        {"ideal_cached_block_ratio", r.ideal.block_ratio()},
        {"ttft_cdf_ms", cdf},
    });
  }
  return j;
}

void PrintTable(std::ostream& out, const std::vector<RunReport>& runs) {
  auto ms = [](double s) { return s * 1e3; };
  auto errors = [](const RunReport& r, const char* status) {
    auto it = r.errors_by_status.find(status);
    return it == r.errors_by_status.end() ? size_t{0} : it->second;
  };
  out << std::left << std::setw(14) << "policy" << std::right << std::setw(7) << "reqs" << std::setw(6) << "err"
      << std::setw(6) << "429" << std::setw(6) << "503" << std::setw(6) << "504" << std::setw(6) << "other"
      << std::setw(10) << "ttft_mean" << std::setw(9) << "ttft_p50" << std::setw(9) << "ttft_p90" << std::setw(9)
      << "ttft_p99" << std::setw(9) << "itl_p50" << std::setw(9) << "itl_p99" << std::setw(9) << "e2e_p50"
      << std::setw(9) << "e2e_p99" << std::setw(11) << "out_tok/s" << std::setw(9) << "goodput" << std::setw(8)
      << "cached" << std::setw(7) << "ideal" << "\n";
  out << std::fixed;
  for (const RunReport& r : runs) {
    out << std::left << std::setw(14) << r.policy << std::right << std::setw(7) << r.requests << std::setw(6)
        << r.failed << std::setw(6) << errors(r, "429") << std::setw(6) << errors(r, "503") << std::setw(6)
        << errors(r, "504") << std::setw(6) << errors(r, "other") << std::setprecision(1) << std::setw(10)
        << ms(r.ttft.mean) << std::setw(9) << ms(r.ttft.p50)
        << std::setw(9) << ms(r.ttft.p90) << std::setw(9) << ms(r.ttft.p99) << std::setw(9) << ms(r.itl.p50)
        << std::setw(9) << ms(r.itl.p99) << std::setw(9) << ms(r.e2e.p50) << std::setw(9) << ms(r.e2e.p99)
        << std::setw(11) << r.output_tokens_per_s << std::setprecision(2) << std::setw(9) << r.goodput_rps
        << std::setprecision(3) << std::setw(8) << r.cached_ratio
        << std::setw(7) << r.ideal.token_ratio() << "\n";
  }
  out << "(times in ms; goodput = completed requests per second";
  if (!runs.empty() && runs[0].ttft_slo_s > 0) {
    out << " with TTFT <= " << std::setprecision(0) << ms(runs[0].ttft_slo_s) << " ms";
  }
  out << "; cached = usage cached_tokens / prompt_tokens; ideal = infinite cache on the trace)\n";
}

Status WritePlot(const std::string& png_path, const std::vector<RunReport>& runs, const std::string& title,
                 const std::string& plotter) {
  if (!CanRun(plotter)) {
    return NotFound(plotter + " not found, so no plot in " + png_path +
                    "; install it for --plot (Debian/Ubuntu: apt-get install gnuplot-nox)");
  }
  std::ostringstream script;
  script << "set terminal pngcairo noenhanced size 1400,600 font ',10'\n"
         << "set output " << GnuplotString(png_path) << "\n";
  for (size_t i = 0; i < runs.size(); ++i) {
    script << "$ttft" << i << " << EOD\n";
    for (auto [v, f] : CdfPoints(runs[i].ttft_sorted)) script << std::max(v * 1e3, 1e-3) << " " << f << "\n";
    script << "EOD\n";
  }
  script << "$hits << EOD\n";
  for (const RunReport& r : runs) {
    script << '"' << r.policy << "\" " << r.cached_ratio << " " << r.ideal.token_ratio() << "\n";
  }
  script << "EOD\n"
         << "set multiplot layout 1,2 title " << GnuplotString(title) << "\n"
         << "set title 'TTFT CDF per policy'\nset xlabel 'time to first token (ms)'\n"
         << "set ylabel 'fraction of requests'\nset logscale x\nset grid\nset key bottom right\nset yrange [0:1]\n"
         << "plot ";
  bool any = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].ttft_sorted.empty()) continue;
    script << (any ? ", " : "") << "$ttft" << i << " using 1:2 with steps lw 2 title " << GnuplotString(runs[i].policy);
    any = true;
  }
  if (!any) script << "NaN title 'no completed requests'";
  script << "\nunset logscale x\nset title 'cached-token ratio per policy'\nset xlabel ''\n"
         << "set ylabel 'cached tokens / prompt tokens'\nset yrange [0:1]\nset style data histograms\n"
         << "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\nset key top right\n"
         << "plot $hits using 2:xtic(1) title 'measured', '' using 3 title 'ideal (infinite cache)'\n"
         << "unset multiplot\n";
  FILE* gp = popen(plotter.c_str(), "w");
  if (gp == nullptr) return Internal("cannot start " + plotter + ": " + std::strerror(errno));
  const std::string text = script.str();
  std::fwrite(text.data(), 1, text.size(), gp);
  int status = pclose(gp);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Internal(plotter + " failed writing " + png_path + " (exit status " + std::to_string(status) + ")");
  }
  return Status::Ok();
}

}  // namespace kvfleet::bench
