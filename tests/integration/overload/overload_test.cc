// Overload (issue 19): two mock workers behind a router, replayed open-loop at their
// capacity and at 1.5 times it. Before admission control the 1.5x run ended in 504s, each
// after waiting out the first-token timeout. Now:
//   1. no 504: what cannot get its first token in time is refused at once (429), the
//      refusal taking a small fraction of the timeout;
//   2. no request is lost: each one ends with its whole stream or a 429/503;
//   3. goodput (requests whose TTFT meets the timeout) holds: more such requests than in the
//      run at capacity, as many per second.
// The mock backend's cost model (worker/backend/mock/cost_model.h) makes the capacity
// computable: prefill-bound requests of 2048 prompt tokens, in steps cut to the default step
// bound while decodes run. The workers run with their default flags.
//
// Two workers sharing one device (--device-id) under a burst: each one's predicted wait
// counts the other's queue, so the device is not admitted twice its work.
//
// A cold router under a burst (issue 35): before any worker has measured its prefill rate, the
// router costs each at the rate its Hello announces, so a burst far past what slow workers can
// serve in time is refused at once, not admitted and timed out.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench/fleet_process.h"
#include "cli/bench/prompt_builder.h"
#include "cli/bench/replay.h"
#include "cli/bench/report.h"
#include "cli/bench/trace.h"
#include "worker/backend/mock/cost_model.h"
#include "worker/engine/scheduler.h"
#include "tests/common/child_process.h"

namespace kvfleet::bench {
namespace {

namespace fs = std::filesystem;

constexpr int kHttpPort = 24400;
constexpr int kRegistrationPort = 24401;
constexpr int kWorkerBasePort = 24410;      // worker i: +10i (requests), +1 (events), +2 (replay)
constexpr int kWorkerHttpBasePort = 24450;  // worker i: +10i
const std::string kRouterUrl = "http://127.0.0.1:" + std::to_string(kHttpPort);

constexpr uint32_t kWorkers = 2;
constexpr uint32_t kStepTokens = 8192;   // the workers' --max-num-tokens (default)
constexpr uint32_t kPromptTokens = 2048;
constexpr uint32_t kOutputTokens = 4;    // decodes ride along with prefill: prefill-bound
constexpr double kFirstTokenTimeoutS = 1;
constexpr double kRunSeconds = 3;        // of arrivals per run

using kvfleet::testing::ChildProcess;
using kvfleet::testing::ReadFile;
using kvfleet::testing::TempDir;

std::vector<std::string> RouterArgs(double first_token_timeout_s = kFirstTokenTimeoutS) {
  return {"--http-host", "127.0.0.1", "--http-port", std::to_string(kHttpPort), "--registration",
          "tcp://127.0.0.1:" + std::to_string(kRegistrationPort), "--first-token-timeout-s",
          std::to_string(first_token_timeout_s), "--log-level", "warn"};
}

std::vector<std::string> WorkerArgs(std::vector<std::string> extra = {}) {
  const std::string host = "tcp://127.0.0.1:";
  std::vector<std::string> args = {"--backend", "mock", "--mock-workers", std::to_string(kWorkers), "--port-stride", "10",
          "--requests", host + std::to_string(kWorkerBasePort), "--events", host + std::to_string(kWorkerBasePort + 1),
          "--replay", host + std::to_string(kWorkerBasePort + 2), "--http-port", std::to_string(kWorkerHttpBasePort),
          "--router", host + std::to_string(kRegistrationPort), "--advertise-host", "127.0.0.1",
          "--worker-id", "overload", "--max-num-tokens", std::to_string(kStepTokens), "--log-level", "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Requests per second the fleet computes: prefill steps cut to the default step bound (the
// decodes of the requests before run beside them), at most kStepTokens each.
double CapacityRps() {
  backend::mock::CostModel cost;  // the workers' defaults
  const double fit = (engine::config::kDefaultMaxStepMs * 1e3 - cost.step_base_us) / cost.prefill_token_us;
  const uint64_t tokens = std::min<uint64_t>(kStepTokens, static_cast<uint64_t>(fit));
  const double step_s = static_cast<double>(cost.StepDuration({tokens, 0, tokens, 0})) / static_cast<double>(kNsPerSec);
  return kWorkers * static_cast<double>(tokens) / step_s / kPromptTokens;
}

// Waits until the router lists every worker routable and live. A router or worker of this
// test that exited (its ports held by another fleet: a test killed before its destructors ran)
// fails the test here rather than let it measure that other fleet.
size_t WaitLive(const ChildProcess& worker, const ChildProcess& router) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a failed bind exits at once
  REQUIRE_MESSAGE(worker.Running(), "the worker exited (ports 24410-24460 taken?)");
  REQUIRE_MESSAGE(router.Running(), "the router exited (ports 24400-24401 taken?)");
  size_t live = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline && live < kWorkers) {
    auto fleet = HttpGet(kRouterUrl, "/fleet", 1.0);
    auto j = fleet.ok() ? nlohmann::json::parse(fleet->body, nullptr, false) : nlohmann::json();
    live = 0;
    if (j.is_object() && j.contains("workers")) {
      for (const auto& w : j["workers"]) live += w.value("routable", false) && w.value("state", "") == "live";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return live;
}

// Evenly spaced arrivals at `rate` for kRunSeconds; no two prompts share a block.
std::vector<TraceRequest> Arrivals(double rate, uint64_t first_hash) {
  std::vector<TraceRequest> trace;
  const int n = static_cast<int>(rate * kRunSeconds);
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.timestamp_ms = static_cast<int64_t>(i * 1000.0 / rate);
    r.input_length = kPromptTokens;
    r.output_length = kOutputTokens;
    for (uint32_t b = 0; b < kPromptTokens / config::kTraceBlockTokens; ++b) r.hash_ids.push_back(first_hash++);
    r.line = static_cast<uint32_t>(i + 1);
    trace.push_back(r);
  }
  return trace;
}

RunReport RunAt(double rate, uint64_t first_hash, std::vector<RequestOutcome>* outcomes) {
  const std::vector<TraceRequest> trace = Arrivals(rate, first_hash);
  const TraceScale scale;
  const auto requests = ScaleTrace(trace, scale);
  ReplayOptions options;
  options.router_url = kRouterUrl;
  options.model = "mock";
  options.progress = false;
  auto run = Replay(requests, PromptBuilder(32000, scale.block_tokens()), options);
  REQUIRE_MESSAGE(run.ok(), run.status().ToString());
  *outcomes = run->outcomes;
  return Summarize("kv", *run, ComputeIdealReuse(requests, scale.block_tokens()), kFirstTokenTimeoutS);
}

std::string Describe(const RunReport& r) {
  std::ostringstream s;
  PrintTable(s, {r});
  for (const auto& e : r.error_examples) s << "  " << e << "\n";
  return s.str();
}

// Replays `n` requests of 1,024 uncached tokens, `spacing_ms` apart (block hashes from
// `hash_base`), against the router with a 2 s first-token timeout: none may end in 504, some
// must be refused (429), and each served one has its first token within the timeout. Returns
// how many were served.
size_t ServedBurstWithout504(uint32_t n, uint32_t spacing_ms, uint64_t hash_base) {
  std::vector<TraceRequest> trace;
  for (uint32_t i = 0; i < n; ++i) {
    TraceRequest r;
    r.timestamp_ms = spacing_ms * i;
    r.input_length = 1024;
    r.output_length = kOutputTokens;
    for (uint32_t b = 0; b < 1024 / config::kTraceBlockTokens; ++b) r.hash_ids.push_back(hash_base + i * 100 + b);
    r.line = i + 1;
    trace.push_back(r);
  }
  const TraceScale scale;
  ReplayOptions options;
  options.router_url = kRouterUrl;
  options.model = "mock";
  options.progress = false;
  const auto requests = ScaleTrace(trace, scale);
  auto run = Replay(requests, PromptBuilder(32000, scale.block_tokens()), options);
  REQUIRE_MESSAGE(run.ok(), run.status().ToString());
  const RunReport report = Summarize("kv", *run, ComputeIdealReuse(requests, scale.block_tokens()), 2.0);
  INFO(Describe(report));
  CHECK(report.errors_by_status.at("504") == 0);
  CHECK(report.errors_by_status.at("429") > 0);  // far past capacity: most are refused
  size_t served = 0;
  for (const RequestOutcome& o : run->outcomes) {
    CHECK_MESSAGE((o.ok || o.http_status == 429 || o.http_status == 503), o.error << ": " << o.error_detail);
    if (o.ok) {
      ++served;
      CHECK(o.ttft_s <= 2.0);
    }
  }
  return served;
}

TEST_CASE("at 1.5x capacity: no 504, refusals at once, no request lost, goodput at least that at capacity") {
  TempDir dir("kvfleet_overload_test_");
  ChildProcess worker(KVFLEET_WORKER_BIN, WorkerArgs(), dir.path / "worker.log");
  ChildProcess router(KVFLEET_ROUTER_BIN, RouterArgs(), dir.path / "router.log");
  INFO("router log:\n" << ReadFile(dir.path / "router.log") << "\nworker log:\n" << ReadFile(dir.path / "worker.log"));
  // Ready: both workers routable and their load reports live (admission reads them).
  REQUIRE(WaitLive(worker, router) == kWorkers);

  const double capacity = CapacityRps();
  CAPTURE(capacity);
  std::vector<RequestOutcome> at_capacity_outcomes, overload_outcomes;
  const RunReport at_capacity = RunAt(capacity, 1, &at_capacity_outcomes);
  INFO("at capacity:\n" << Describe(at_capacity));
  const RunReport overload = RunAt(1.5 * capacity, 1'000'000, &overload_outcomes);
  INFO("at 1.5x capacity:\n" << Describe(overload));

  // 1. Overloaded, and refused rather than timed out.
  CHECK(overload.errors_by_status.at("504") == 0);
  CHECK(overload.errors_by_status.at("429") > 0);
  for (const RequestOutcome& o : overload_outcomes) {
    if (o.http_status == 429 || o.http_status == 503) CHECK(o.e2e_s < 0.1 * kFirstTokenTimeoutS);
  }
  // 2. Every request: its whole stream (the usage chunk and [DONE] seen), or a refusal.
  for (const auto* outcomes : {&at_capacity_outcomes, &overload_outcomes}) {
    for (const RequestOutcome& o : *outcomes) {
      CHECK_MESSAGE((o.ok || o.http_status == 429 || o.http_status == 503), o.error << ": " << o.error_detail);
      if (o.ok) {
        CHECK(o.completion_tokens == kOutputTokens);
        CHECK(o.ttft_s <= kFirstTokenTimeoutS);  // admitted requests are served in time
      }
    }
  }
  CHECK(at_capacity.errors_by_status.at("504") == 0);
  // 3. Refusing the excess keeps the fleet busy with what it can serve in time: it serves
  // more requests within the timeout than at capacity, and as many per second. Both runs
  // keep the fleet busy, so their rates agree within where each run's wall time ends (the
  // last answer): 5%. Without admission this run's goodput was less than half (2026-11-24).
  CHECK(overload.slo_met >= at_capacity.slo_met);
  CHECK(overload.goodput_rps >= 0.95 * at_capacity.goodput_rps);

  // The router counted each refusal by reason.
  auto metrics = HttpGet(kRouterUrl, "/metrics", 2.0);
  REQUIRE(metrics.ok());
  double refused = 0;
  std::istringstream lines(metrics->body);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("kvfleet_router_requests_refused_total{", 0) == 0) {
      refused += std::stod(line.substr(line.rfind(' ')));
    }
  }
  CHECK(refused == static_cast<double>(overload.errors_by_status.at("429") + overload.errors_by_status.at("503") +
                                       at_capacity.errors_by_status.at("429") +
                                       at_capacity.errors_by_status.at("503")));
}

TEST_CASE("a cold router under a burst: no 504, the excess refused at once") {
  // Workers 4x slower than the router's default guess (2,000 prompt tokens/s, 500 us a
  // token), 80 requests of 1,024 tokens at once: about 20 s of prefill against a 2 s timeout.
  // Without the rate in the Hello the router admitted for 8,000 tokens/s and 14 to 24 of the
  // 80 waited out the timeout (504).
  TempDir dir("kvfleet_overload_test_");
  ChildProcess worker(KVFLEET_WORKER_BIN, WorkerArgs({"--mock-prefill-token-us", "500"}), dir.path / "worker.log");
  ChildProcess router(KVFLEET_ROUTER_BIN, RouterArgs(2.0), dir.path / "router.log");
  INFO("router log:\n" << ReadFile(dir.path / "router.log") << "\nworker log:\n" << ReadFile(dir.path / "worker.log"));
  REQUIRE(WaitLive(worker, router) == kWorkers);
  auto fleet = HttpGet(kRouterUrl, "/fleet", 1.0);
  REQUIRE(fleet.ok());
  const auto j = nlohmann::json::parse(fleet->body);
  for (const auto& w : j["workers"]) CHECK(w.value("announced_prefill_tokens_per_second", 0.0) > 0);

  CHECK(ServedBurstWithout504(80, 0, 5'000'000) > 0);
}

TEST_CASE("two workers sharing one device under a burst: no 504, each one's wait counts the other's queue") {
  // Two mock workers taking turns on one device (--device-id: the mock's shared timeline), each
  // announcing the device's rate alone: about 2,000 prompt tokens/s (500 us a token; no step
  // bound, so a prompt is one step of 0.52 s), 40 requests of 1,024 tokens 20 ms apart against
  // a 2 s timeout (admitted within 1.6 s). Counting each worker's queue alone, the router
  // admitted 7 (3.6 s of the device's time) and 4 waited out the timeout (504);
  // counting both queues it admitted 4 in all, each first token within 1.55 s.
  TempDir dir("kvfleet_overload_test_");
  ChildProcess worker(KVFLEET_WORKER_BIN,
                      WorkerArgs({"--mock-prefill-token-us", "500", "--max-step-ms", "0", "--device-id", "gpu-0"}),
                      dir.path / "worker.log");
  ChildProcess router(KVFLEET_ROUTER_BIN, RouterArgs(2.0), dir.path / "router.log");
  INFO("router log:\n" << ReadFile(dir.path / "router.log") << "\nworker log:\n" << ReadFile(dir.path / "worker.log"));
  REQUIRE(WaitLive(worker, router) == kWorkers);
  CHECK(ServedBurstWithout504(40, 20, 7'000'000) >= 2);  // one at a time: each decision sees the ones before
}

TEST_CASE("an admission bound past the first-token timeout is refused at start-up, naming the flag") {
  TempDir dir("kvfleet_overload_test_");
  std::vector<std::string> args = RouterArgs();
  args.insert(args.end(), {"--admission-ttft-s", "2"});
  ChildProcess router(KVFLEET_ROUTER_BIN, args, dir.path / "router.log");
  CHECK(router.Wait(10) == 2);
  CHECK(ReadFile(dir.path / "router.log").find("--admission-ttft-s") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::bench
