// `kvfleet up` as the quickstart runs it: configured through KVFLEET_UP_* variables, which
// are meant for `kvfleet up`; no KVFLEET_* variable reaches the router and workers it starts.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/bench/fleet_process.h"
#include "tests/common/child_process.h"

namespace {

namespace fs = std::filesystem;

// Ports of this test's fleet: router HTTP and registration, then the workers'.
constexpr int kHttpPort = 24200;
constexpr int kRegistrationPort = 24201;
constexpr int kWorkerBasePort = 24210;      // worker i: +3i, +3i+1, +3i+2
constexpr int kWorkerHttpBasePort = 24250;  // worker i: +i
const std::string kRouterUrl = "http://127.0.0.1:" + std::to_string(kHttpPort);

using kvfleet::testing::ChildProcess;
using kvfleet::testing::ReadFile;
using kvfleet::testing::TempDir;

// The listening TCP sockets of this host on `ports` whose address is not loopback
// (/proc/net/tcp and tcp6: "ADDR:PORT" in hex, state 0A is LISTEN), as "addr:port".
std::vector<std::string> NonLoopbackListeners(const std::set<int>& ports) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const size_t colon = local.find(':');
      if (state != "0A" || colon == std::string::npos) continue;
      const int port = std::stoi(local.substr(colon + 1), nullptr, 16);
      const std::string addr = local.substr(0, colon);
      const bool loopback = addr == "0100007F" || addr == "00000000000000000000000001000000";
      if (ports.count(port) && !loopback) out.push_back(addr + ":" + std::to_string(port));
    }
  }
  return out;
}

// `kvfleet up` with `env` added to this process's environment; SIGTERMed at the end.
ChildProcess StartUp(const fs::path& dir, const std::vector<std::pair<std::string, std::string>>& env,
                     const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {"up", "--backend", "mock", "--http-port", std::to_string(kHttpPort),
                                   "--registration-port", std::to_string(kRegistrationPort), "--worker-base-port",
                                   std::to_string(kWorkerBasePort), "--worker-http-base-port",
                                   std::to_string(kWorkerHttpBasePort), "--router-bin", KVFLEET_ROUTER_BIN,
                                   "--worker-bin", KVFLEET_WORKER_BIN, "--log-dir", (dir / "logs").string(),
                                   "--stop-timeout-s", "5"};
  args.insert(args.end(), more.begin(), more.end());
  return ChildProcess(KVFLEET_CLI, args, dir / "up.log", env);
}

TEST_CASE("kvfleet up reads KVFLEET_UP_* itself and keeps KVFLEET_* from the router and workers") {
  TempDir dir("kvfleet_up_test_");
  // KVFLEET_UP_WORKERS is `kvfleet up --workers`. KVFLEET_TOKENIZER names no `kvfleet up`
  // option; to the router it would be (deprecated) a tokenizer directory that does not exist,
  // and reaching the router it would stop the fleet from becoming ready.
  ChildProcess up =
      StartUp(dir.path, {{"KVFLEET_UP_WORKERS", "4"}, {"KVFLEET_TOKENIZER", (dir.path / "no-such-model").string()}});

  // Ready means the router has every worker `kvfleet up` started, all four.
  size_t routable = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && up.Running()) {
    auto fleet = kvfleet::bench::HttpGet(kRouterUrl, "/fleet", 1.0);
    auto j = fleet.ok() ? nlohmann::json::parse(fleet->body, nullptr, false) : nlohmann::json();
    routable = 0;
    if (j.is_object() && j.contains("workers")) {
      for (const auto& w : j["workers"]) routable += w.value("routable", false) ? 1 : 0;
    }
    auto ready = kvfleet::bench::HttpGet(kRouterUrl, "/ready", 1.0);
    if (routable == 4 && ready.ok() && ready->status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO("kvfleet up log:\n" << ReadFile(up.log_path()) << "\nrouter log:\n" << ReadFile(dir.path / "logs/router.log"));
  REQUIRE(routable == 4);

  // Every socket of the fleet listens on loopback only: nothing on another host reaches it.
  std::set<int> ports = {kHttpPort, kRegistrationPort};
  for (int i = 0; i < 4; ++i) {
    ports.insert({kWorkerBasePort + 3 * i, kWorkerBasePort + 3 * i + 1, kWorkerBasePort + 3 * i + 2,
                  kWorkerHttpBasePort + i});
  }
  CHECK(NonLoopbackListeners(ports) == std::vector<std::string>{});

  // It serves requests: `kvfleet bench` exits 0 only when all of them completed.
  const fs::path trace = dir.path / "trace.jsonl", results = dir.path / "results.json";
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [1]}\n"
                       << "{\"timestamp\": 10, \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [1]}\n";
  const std::string bench = std::string(KVFLEET_CLI) + " bench --router " + kRouterUrl + " --trace " + trace.string() +
                            " --out " + results.string() + " --quiet > " + (dir.path / "bench.log").string() + " 2>&1";
  INFO("bench log:\n" << ReadFile(dir.path / "bench.log"));
  CHECK(std::system(bench.c_str()) == 0);
  auto j = nlohmann::json::parse(ReadFile(results), nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["runs"][0]["completed"] == 2);
  CHECK(j["runs"][0]["completion_tokens"] == 8);

  // It said which variables it kept back.
  const std::string log = ReadFile(up.log_path());
  CHECK(log.find("not passing") != std::string::npos);
  CHECK(log.find("KVFLEET_TOKENIZER") != std::string::npos);
  CHECK(log.find("KVFLEET_UP_WORKERS") == std::string::npos);  // its own, not kept back from anyone
}

TEST_CASE("kvfleet up --devices gives the workers their GPUs in turn; a mock worker refuses one") {
  TempDir dir("kvfleet_up_devices_");
  ChildProcess up = StartUp(dir.path, {}, {"--workers", "3", "--devices", "3,5"});
  // Workers 0, 1, 2 get --device 3, 5, 3; the mock backend has no GPU to pick and says so.
  const std::vector<std::string> want = {"--device 3 picks a GPU", "--device 5 picks a GPU", "--device 3 picks a GPU"};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto all_refused = [&] {
    for (size_t i = 0; i < want.size(); ++i) {
      if (ReadFile(dir.path / ("logs/worker-" + std::to_string(i) + ".log")).find(want[i]) == std::string::npos) {
        return false;
      }
    }
    return true;
  };
  while (std::chrono::steady_clock::now() < deadline && !all_refused()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO("worker logs:\n" << ReadFile(dir.path / "logs/worker-0.log") << ReadFile(dir.path / "logs/worker-1.log")
                         << ReadFile(dir.path / "logs/worker-2.log"));
  CHECK(all_refused());
}

// Routable workers in `router_url`'s /fleet, and the requests its peer routers have in
// flight there (their gossip), summed over the workers.
struct FleetView {
  size_t routable = 0;
  int64_t peer_inflight = 0;
};
FleetView ViewOf(const std::string& router_url) {
  FleetView v;
  auto fleet = kvfleet::bench::HttpGet(router_url, "/fleet", 1.0);
  auto j = fleet.ok() ? nlohmann::json::parse(fleet->body, nullptr, false) : nlohmann::json();
  if (!j.is_object() || !j.contains("workers")) return v;
  for (const auto& w : j["workers"]) {
    v.routable += w.value("routable", false) ? 1 : 0;
    v.peer_inflight += w.value("peer_routers_inflight_requests", int64_t{0});
  }
  return v;
}

TEST_CASE("kvfleet up --routers 2: both routers serve, and each counts the other's requests in flight") {
  TempDir dir("kvfleet_up_routers_test_");
  // Ports 24300-24360: router i HTTP 24300+i, registration 24302+i, gossip 24304+i.
  const std::string r0 = "http://127.0.0.1:24300", r1 = "http://127.0.0.1:24301";
  ChildProcess up(KVFLEET_CLI,
                  {"up", "--backend", "mock", "--routers", "2", "--workers", "2", "--http-port", "24300",
                   "--registration-port", "24302", "--gossip-base-port", "24304", "--worker-base-port", "24310",
                   "--worker-http-base-port", "24350", "--router-bin", KVFLEET_ROUTER_BIN, "--worker-bin",
                   KVFLEET_WORKER_BIN, "--log-dir", (dir.path / "logs").string(), "--stop-timeout-s", "5"},
                  dir.path / "up.log", {});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && up.Running()) {
    if (ViewOf(r0).routable == 2 && ViewOf(r1).routable == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO("kvfleet up log:\n" << ReadFile(up.log_path()) << "\nrouter-1 log:\n" << ReadFile(dir.path / "logs/router-1.log"));
  REQUIRE(ViewOf(r0).routable == 2);
  REQUIRE(ViewOf(r1).routable == 2);  // the second router lists the workers registered with the first
  CHECK(NonLoopbackListeners({24300, 24301, 24302, 24303, 24304, 24305}) == std::vector<std::string>{});

  // A long request through router 0 (~600 decode steps of the mock, a few seconds): router 1
  // sees it in flight through the gossip.
  const fs::path trace = dir.path / "long.jsonl";
  std::ofstream(trace) << "{\"timestamp\": 0, \"input_length\": 64, \"output_length\": 600, \"hash_ids\": [1]}\n";
  const std::string long_bench = std::string(KVFLEET_CLI) + " bench --router " + r0 + " --trace " + trace.string() +
                                 " --quiet > " + (dir.path / "long.log").string() + " 2>&1";
  std::thread sender([&] { std::system(long_bench.c_str()); });
  int64_t seen = 0;
  for (int i = 0; i < 200 && seen == 0; ++i) {  // at most 10 s
    seen = ViewOf(r1).peer_inflight;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  sender.join();
  CHECK(seen == 1);
  CHECK(ViewOf(r0).peer_inflight == 0);  // router 1 sent nothing

  // Both serve: `kvfleet bench` over both routers exits 0 only when every request completed.
  const fs::path spread = dir.path / "spread.jsonl", results = dir.path / "results.json";
  std::ofstream out(spread);
  for (int i = 0; i < 4; ++i) {
    out << "{\"timestamp\": " << 10 * i << ", \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [1]}\n";
  }
  out.close();
  const std::string bench = std::string(KVFLEET_CLI) + " bench --router " + r0 + "," + r1 + " --trace " +
                            spread.string() + " --out " + results.string() + " --quiet > " +
                            (dir.path / "bench.log").string() + " 2>&1";
  INFO("bench log:\n" << ReadFile(dir.path / "bench.log"));
  CHECK(std::system(bench.c_str()) == 0);
  auto j = nlohmann::json::parse(ReadFile(results), nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["runs"][0]["completed"] == 4);
}

TEST_CASE("kvfleet, kvfleet-router and kvfleet-worker print their version with --version and exit 0") {
  for (const std::string& bin : {std::string(KVFLEET_CLI), std::string(KVFLEET_ROUTER_BIN), std::string(KVFLEET_WORKER_BIN)}) {
    std::FILE* p = popen(("'" + bin + "' --version 2>&1").c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[512];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    const int status = pclose(p);
    INFO(bin << ": " << out);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(out.starts_with(fs::path(bin).filename().string() + " "));  // the binary's own name first
    CHECK(out.find("(git ") != std::string::npos);
  }
}

}  // namespace
