// `kvfleet bench` as an operator runs it: --compare against a fake router, with a
// --fleet-cmd restarted around each run, JSON results and a plot.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cli/bench/fleet_process.h"
#include "cli/bench/report.h"
#include "tests/cli/bench/fake_openai_server.h"

namespace kvfleet::bench {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kvfleet_bench_cli_" + std::to_string(getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

// Runs a shell command; returns its exit code and stdout.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// `count` requests sharing a first block, 10 ms apart, with inputs of 600, 650, ...
// tokens and 40 output tokens (lengths /8 at --length-scale 8).
fs::path WriteTrace(const fs::path& path, int count) {
  std::ofstream t(path);
  for (int i = 0; i < count; ++i) {
    t << "{\"timestamp\": " << i * 10 << ", \"input_length\": " << 600 + 50 * i
      << ", \"output_length\": 40, \"hash_ids\": [1, " << 100 + i << "]}\n";
  }
  return path;
}

TEST_CASE("kvfleet bench --compare runs every policy with its own cache salt and writes JSON and a PNG") {
  testing::FakeOpenAiServer server;
  TempDir dir;
  const fs::path trace = WriteTrace(dir.path / "trace.jsonl", 6);
  const fs::path out = dir.path / "results.json", png = dir.path / "plot.png";
  const fs::path started = dir.path / "fleet_started";
  // The "fleet" records each start and then idles until the bench stops it.
  const std::string fleet_cmd = "echo x >> " + started.string() + "; exec sleep 60";
  const std::string cmd = std::string(KVFLEET_CLI) + " bench --router " + server.url() + " --trace " +
                          trace.string() + " --length-scale 8 --time-scale 10 --compare kv,round_robin" +
                           " --fleet-cmd '" + fleet_cmd + "' --out " + out.string() + " --plot " +
                          png.string() + " --quiet 2>/dev/null";
  auto [rc, table] = RunCommand(cmd);
  CHECK(rc == 0);
  CHECK(table.find("kv ") != std::string::npos);
  CHECK(table.find("round_robin") != std::string::npos);

  // The fleet command ran once per policy, and the readiness probe was asked.
  std::ifstream s(started);
  std::string line;
  int starts = 0;
  while (std::getline(s, line)) ++starts;
  CHECK(starts == 2);
  CHECK(server.gets() >= 2);

  // Each policy's requests carry that policy and a salt no other run shares.
  std::map<std::string, std::set<std::string>> salts;
  std::map<std::string, int> per_policy;
  for (const auto& b : server.bodies()) {
    ++per_policy[b["routing"].get<std::string>()];
    salts[b["routing"].get<std::string>()].insert(b["cache_salt"].get<std::string>());
    CHECK(b["max_tokens"] == 5);  // ceil(40 / 8)
    CHECK(b["model"] == "fake");  // the router's only model, as no --model was given
  }
  CHECK(per_policy["kv"] == 6);
  CHECK(per_policy["round_robin"] == 6);
  REQUIRE(salts["kv"].size() == 1);
  REQUIRE(salts["round_robin"].size() == 1);
  CHECK(*salts["kv"].begin() != *salts["round_robin"].begin());

  std::ifstream j(out);
  nlohmann::json results = nlohmann::json::parse(j);
  REQUIRE(results["runs"].size() == 2);
  CHECK(results["runs"][0]["policy"] == "kv");
  CHECK(results["runs"][1]["policy"] == "round_robin");
  for (const auto& run : results["runs"]) {
    CHECK(run["completed"] == 6);
    CHECK(run["failed"] == 0);
    CHECK(run["completion_tokens"] == 30);
    CHECK(run["ttft_ms"]["count"] == 6);
    // The fake server reports half of every prompt cached.
    CHECK(run["cached_token_ratio"].get<double>() == doctest::Approx(0.5).epsilon(0.02));
    // Each prompt (75..107 tokens) holds one full 64-token block, id 1 in all six: five
    // hit it.
    CHECK(run["ideal_cached_block_ratio"].get<double>() == doctest::Approx(5.0 / 6.0));
  }
  CHECK(results["settings"]["length_scale"] == 8);
  CHECK(results["settings"]["model"] == "fake");
  CHECK(fs::file_size(png) > 1000);
  if (const char* keep = std::getenv("KVFLEET_KEEP_PLOT")) fs::copy_file(png, keep, fs::copy_options::overwrite_existing);
}

TEST_CASE("--compare-retention runs each policy without, then with, kv_retention on the prompt's first N tokens") {
  testing::FakeOpenAiServer server;
  TempDir dir;
  const fs::path trace = WriteTrace(dir.path / "trace.jsonl", 4);
  const fs::path out = dir.path / "results.json";
  const std::string cmd = std::string(KVFLEET_CLI) + " bench --router " + server.url() + " --trace " +
                          trace.string() + " --length-scale 8 --time-scale 10 --policy kv --compare-retention" +
                          " --retain-prefix-tokens 80 --retain-priority 90 --retain-duration-ms 5000 --out " +
                          out.string() + " --quiet 2>/dev/null";
  auto [rc, table] = RunCommand(cmd);
  CHECK(rc == 0);
  CHECK(table.find("kv+retain") != std::string::npos);

  // Two salts; only the second run's requests carry kv_retention, each range cut to its prompt.
  std::map<std::string, std::vector<nlohmann::json>> by_salt;
  for (const auto& b : server.bodies()) by_salt[b["cache_salt"].get<std::string>()].push_back(b);
  REQUIRE(by_salt.size() == 2);
  int with = 0, without = 0;
  for (const auto& [salt, bodies] : by_salt) {
    REQUIRE(bodies.size() == 4);
    const bool retained = bodies[0].contains("kv_retention");
    for (const auto& b : bodies) {
      REQUIRE(b.contains("kv_retention") == retained);
      CHECK(b["routing"] == "kv");
      if (!retained) continue;
      const auto& range = b["kv_retention"]["token_ranges"].at(0);
      const size_t prompt = b["prompt"].size();  // 75..94 tokens
      CHECK(range["start"] == 0);
      CHECK(range["end"] == std::min<size_t>(80, prompt));
      CHECK(range["priority"] == 90);
      CHECK(range["duration_ms"] == 5000);
    }
    (retained ? with : without) += 1;
  }
  CHECK(with == 1);
  CHECK(without == 1);
  std::ifstream j(out);
  nlohmann::json results = nlohmann::json::parse(j);
  REQUIRE(results["runs"].size() == 2);
  CHECK(results["runs"][0]["policy"] == "kv");
  CHECK(results["runs"][1]["policy"] == "kv+retain");
}

TEST_CASE("retention flags that cannot apply are errors naming the flag") {
  TempDir dir;
  const fs::path trace = WriteTrace(dir.path / "trace.jsonl", 2);
  const std::string base = std::string(KVFLEET_CLI) + " bench --router http://127.0.0.1:9 --trace " + trace.string();
  for (const auto& [flags, named] : std::vector<std::pair<std::string, std::string>>{
           {"--compare-retention", "--retain-prefix-tokens"},
           {"--retain-priority 90", "--retain-prefix-tokens"},
           {"--retain-prefix-tokens 64 --retain-priority 101", "--retain-priority"},
           {"--retain-prefix-tokens 0", "--retain-prefix-tokens"}}) {
    INFO(flags);
    auto [rc, output] = RunCommand(base + " " + flags + " 2>&1");
    CHECK(rc != 0);
    CHECK(output.find(named) != std::string::npos);
  }
}

TEST_CASE("without gnuplot, kvfleet bench --plot writes the JSON, prints the install hint and exits 0") {
  testing::FakeOpenAiServer server;
  TempDir dir;
  const fs::path trace = WriteTrace(dir.path / "trace.jsonl", 3);
  const fs::path empty_bin = dir.path / "bin";  // PATH without gnuplot
  fs::create_directories(empty_bin);
  const fs::path out = dir.path / "results.json", png = dir.path / "plot.png";
  auto [rc, output] = RunCommand("env PATH=" + empty_bin.string() + " " + KVFLEET_CLI + " bench --router " +
                                 server.url() + " --trace " + trace.string() +
                                 " --length-scale 8 --time-scale 10 --out " + out.string() + " --plot " +
                                 png.string() + " --quiet 2>&1");
  INFO(output);
  CHECK(rc == 0);
  CHECK(output.find("gnuplot not found") != std::string::npos);
  CHECK(output.find("apt-get install gnuplot-nox") != std::string::npos);
  CHECK(!fs::exists(png));
  REQUIRE(fs::exists(out));
  std::ifstream j(out);
  nlohmann::json results = nlohmann::json::parse(j);
  REQUIRE(results["runs"].size() == 1);
  CHECK(results["runs"][0]["completed"] == 3);
}

TEST_CASE("WritePlot tells a missing plotter from one that fails") {
  TempDir dir;
  const std::string png = (dir.path / "plot.png").string();
  Status missing = WritePlot(png, {}, "t", "kvfleet-no-such-plotter");
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK(missing.message().find("apt-get install gnuplot-nox") != std::string::npos);
  CHECK(WritePlot(png, {}, "t", (dir.path / "no-such-dir/gnuplot").string()).code() == StatusCode::kNotFound);
  Status failing = WritePlot(png, {}, "t", "false");
  CHECK(failing.code() == StatusCode::kInternal);
  CHECK(failing.message().find("false failed") != std::string::npos);
}

TEST_CASE("a bad trace line stops kvfleet bench with the line named") {
  TempDir dir;
  const fs::path trace = dir.path / "bad.jsonl";
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
                       << "{\"timestamp\": 1, \"input_length\": 10}\n";
  auto [rc, out] = RunCommand(std::string(KVFLEET_CLI) + " bench --trace " + trace.string() + " --dry-run 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("bad.jsonl:2:") != std::string::npos);
}

TEST_CASE("--warmup-s past the last arrival, or over the whole --duration, is refused: nothing would be measured") {
  TempDir dir;
  const fs::path trace = dir.path / "t.jsonl";
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
                       << "{\"timestamp\": 2000, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n";
  const std::string bench = std::string(KVFLEET_CLI) + " bench --trace " + trace.string() + " --dry-run";
  auto [rc, out] = RunCommand(bench + " --warmup-s 3 2>&1");
  CHECK(rc == 2);
  CHECK(out.find("past the last arrival (2 s)") != std::string::npos);
  auto [over_rc, over] = RunCommand(bench + " --warmup-s 1 --duration 1 2>&1");
  CHECK(over_rc == 2);
  CHECK(over.find("--warmup-s must be below --duration") != std::string::npos);
  // A warm-up of the first request: the second alone is measured.
  auto [ok_rc, ok] = RunCommand(bench + " --warmup-s 1 2>&1");
  CHECK(ok_rc == 0);
  CHECK(ok.find("arrivals before 1 s a warm-up") != std::string::npos);
  CHECK(ok.find("prompt_tokens 10\n") != std::string::npos);
}

TEST_CASE("--fleet-workers: a fleet is measured only once the router lists that many routable workers") {
  testing::FakeOpenAiServer server;  // its /fleet: two routable workers of three
  FleetProcess fleet;
  REQUIRE(fleet.Start("exec sleep 60").ok());
  CHECK(fleet.WaitReady(server.url(), 5, 2).ok());
  const Status short_of_one = fleet.WaitReady(server.url(), 0.5, 3);
  CHECK_FALSE(short_of_one.ok());
  CHECK(short_of_one.message().find("2 of 3 workers routable") != std::string::npos);
  fleet.Stop(5);

  // Through the command: the run stops with that error instead of measuring a smaller fleet.
  TempDir dir;
  const fs::path trace = dir.path / "t.jsonl";
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": 64, \"output_length\": 2, \"hash_ids\": [1]}\n";
  const std::string cmd = std::string(KVFLEET_CLI) + " bench --router " + server.url() + " --trace " +
                          trace.string() + " --compare kv --fleet-cmd 'exec sleep 60' --fleet-workers 3 " +
                          "--ready-timeout 0.5 --quiet --out " + (dir.path / "o.json").string() + " 2>&1";
  auto [rc, out] = RunCommand(cmd);
  CHECK(rc != 0);
  CHECK(out.find("2 of 3 workers routable") != std::string::npos);

  // All there at the start and at the end: the run is measured.
  const std::string two = std::string(KVFLEET_CLI) + " bench --router " + server.url() + " --trace " +
                          trace.string() + " --compare kv --fleet-cmd 'exec sleep 60' --fleet-workers 2 " +
                          "--ready-timeout 5 --quiet --out " + (dir.path / "o.json").string() + " 2>&1";
  auto [whole_rc, whole_out] = RunCommand(two);
  CHECK(whole_rc == 0);
  // A worker lost during the run: the row is not reported as the whole fleet's.
  testing::FakeOpenAiServer losing;
  losing.LoseAWorkerAfterFirstFleet();
  std::string lost_cmd = two;
  lost_cmd.replace(lost_cmd.find(server.url()), server.url().size(), losing.url());
  auto [lost_rc, lost_out] = RunCommand(lost_cmd);
  CHECK(lost_rc != 0);
  CHECK(lost_out.find("lost workers during the kv run: 1 of 2 workers routable") != std::string::npos);
}

TEST_CASE("a comparison stopped by a fleet that does not come up still reports the runs measured before it") {
  // Regression: a --compare whose later fleet never became ready exited with the error alone,
  // and the runs already measured (minutes of them) were lost with it.
  testing::FakeOpenAiServer server;
  // Two routable workers for the first run's start and end; one for every fleet after it.
  server.LoseAWorkerAfterFleetGets(2);
  TempDir dir;
  const fs::path trace = WriteTrace(dir.path / "trace.jsonl", 3);
  const fs::path out = dir.path / "results.json";
  const std::string cmd = std::string(KVFLEET_CLI) + " bench --router " + server.url() + " --trace " +
                          trace.string() + " --length-scale 8 --time-scale 10 --compare kv,round_robin,least_loaded" +
                          " --fleet-cmd 'exec sleep 60' --fleet-workers 2 --ready-timeout 0.5 --out " + out.string() +
                          " --quiet 2>&1";
  auto [rc, printed] = RunCommand(cmd);
  CHECK(rc == 2);
  CHECK(printed.find("kv ") != std::string::npos);  // the table, with the run measured
  CHECK(printed.find("error: the round_robin run: router at ") != std::string::npos);
  CHECK(printed.find("not ready after 0.5") != std::string::npos);
  CHECK(printed.find("(1 of 2 workers routable) (not measured: round_robin, least_loaded;") != std::string::npos);
  std::ifstream j(out);
  const nlohmann::json results = nlohmann::json::parse(j);
  REQUIRE(results["runs"].size() == 1);
  CHECK(results["runs"][0]["policy"] == "kv");
  CHECK(results["runs"][0]["completed"] == 3);
  CHECK(results["stopped"]["error"].get<std::string>().find("1 of 2 workers routable") != std::string::npos);
  CHECK(results["stopped"]["runs_not_measured"] == nlohmann::json::array({"round_robin", "least_loaded"}));
}

TEST_CASE("a fleet command that exits is reported, and Stop takes down its whole process group") {
  FleetProcess dead;
  REQUIRE(dead.Start("exit 3").ok());
  auto st = dead.WaitReady("http://127.0.0.1:1", 5);
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("exited") != std::string::npos);

  TempDir dir;
  const fs::path pid_file = dir.path / "child.pid";
  FleetProcess fleet;
  // A child in the background, as `kvfleet up` starts its router and workers.
  REQUIRE(fleet.Start("sleep 60 & echo $! > " + pid_file.string() + "; wait").ok());
  pid_t child = 0;
  for (int i = 0; i < 100 && child == 0; ++i) {
    std::ifstream in(pid_file);
    in >> child;
    if (child == 0) usleep(20'000);
  }
  REQUIRE(child > 0);
  CHECK(kill(child, 0) == 0);
  fleet.Stop(5);
  CHECK_FALSE(fleet.running());
  // The background child is gone too, and reaped, when Stop returns.
  CHECK(kill(child, 0) != 0);

  // The shell dies at the signal; what it started takes a while to stop, as `kvfleet up` does
  // stopping its workers (each saying Bye). Stop waits for it: a next fleet must not start
  // beside it on the same ports. (Stopping only the shell's wait, this child was SIGKILLed
  // 0.2 s later, before its handler ended.)
  const fs::path stopped = dir.path / "stopped";
  FleetProcess slow;
  REQUIRE(slow.Start("sh -c 'trap \"sleep 0.5; touch " + stopped.string() +
                     "; exit 0\" TERM; while :; do sleep 0.05; done' & wait").ok());
  usleep(300'000);  // the child has set its trap
  slow.Stop(5);
  CHECK(fs::exists(stopped));
}

TEST_CASE("requests per worker are read from the router's kvfleet_router_requests_total") {
  auto by_worker = ParseRequestsByWorker(
      "# HELP kvfleet_router_requests_total Requests\n"
      "# TYPE kvfleet_router_requests_total counter\n"
      "kvfleet_router_requests_total{model=\"m\",status=\"200\",worker=\"w0\"} 5\n"
      "kvfleet_router_requests_total{model=\"m\",status=\"503\",worker=\"w0\"} 2\n"
      "kvfleet_router_requests_total{model=\"m\",status=\"200\",worker=\"w1\"} 1e+01\n"
      "kvfleet_router_requests_total_other{worker=\"w9\"} 3\n"
      "kvfleet_router_inflight{worker=\"w0\"} 4\n"
      "kvfleet_router_requests_total{model=\"m\",status=\"400\"} 6\n");
  CHECK(by_worker.size() == 2);
  CHECK(by_worker["w0"] == 7);
  CHECK(by_worker["w1"] == 10);
}

TEST_CASE("a counter's samples are summed over their labels; a longer name is another metric") {
  const std::string text =
      "# TYPE kvfleet_router_pulls_total counter\n"
      "kvfleet_router_pulls_total{model=\"m\",source=\"w0\"} 3\n"
      "kvfleet_router_pulls_total{model=\"m\",source=\"w1\"} 4e+00\n"
      "kvfleet_router_pulls_total_other 100\n"
      "kvfleet_router_pulled_blocks_total 12\n"
      "kvfleet_router_pulls_total{broken 9\n";
  CHECK(SumCounter(text, "kvfleet_router_pulls_total") == 7);
  CHECK(SumCounter(text, "kvfleet_router_pulled_blocks_total") == 12);
  CHECK(SumCounter(text, "kvfleet_router_absent_total") == 0);
}

TEST_CASE("a counter's samples are summed over those with one label, e.g. the gossip frames sent") {
  const std::string text =
      "kvfleet_router_gossip_frames_total{direction=\"applied\"} 30\n"
      "kvfleet_router_gossip_frames_total{direction=\"sent\"} 12\n"
      "kvfleet_router_gossip_frames_total 5\n"
      "kvfleet_router_gossip_frames_total_other{direction=\"sent\"} 100\n";
  CHECK(SumCounter(text, "kvfleet_router_gossip_frames_total", "direction=\"sent\"") == 12);
  CHECK(SumCounter(text, "kvfleet_router_gossip_frames_total", "direction=\"lost\"") == 0);
  CHECK(SumCounter(text, "kvfleet_router_gossip_frames_total") == 47);
}

}  // namespace
}  // namespace kvfleet::bench
