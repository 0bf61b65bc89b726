// kvfleet up: a whole fleet on this machine, for trying kvfleet and for tests. Starts one
// router (or --routers N, sharing their load over gossip) and N workers on loopback, each
// logging to its own file in one directory, and stops them all (routers first, then
// workers) on Ctrl-C or SIGTERM.
//
// With --restart it also supervises: a router or worker that exits while the fleet is up
// (a crash, a SIGKILL) is started again with the same arguments after a short delay, as
// systemd's Restart=always or a Kubernetes controller would. Without it, a worker's exit
// leaves the fleet one worker short, and the last router's exit ends the fleet.
//
// The children get this process's environment without its KVFLEET_* variables.
// KVFLEET_UP_* configure `kvfleet up` itself (KVFLEET_UP_WORKERS is its --workers); the
// others would configure a child behind the command line `kvfleet up` gives it (the
// deprecated plain names even mean something else there: the router's KVFLEET_WORKERS is a
// list of worker addresses). What a child should get goes through --router-arg and
// --worker-arg; `kvfleet up` names the variables it kept back so that none is dropped silently.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli/commands.h"

namespace kvfleet::cli {

namespace {

struct UpArgs {
  std::string backend = "auto";       // auto: the workers' choice with --model-dir, else mock
  int workers = 2;
  int prefill_workers = 0;            // > 0: the first this many get --role prefill, the rest --role decode
  int routers = 1;                    // > 1: routers that gossip (router/README.md, "Several routers")
  uint16_t gossip_base_port = 5560;   // router i's gossip PUB: base+i
  bool no_gossip = false;             // several routers that share nothing (for comparison)
  uint16_t http_port = 8000;
  uint16_t registration_port = 5555;
  uint16_t worker_base_port = 5600;   // worker i: requests base+3i, events +1, replay +2
  uint16_t worker_http_base_port = 9400;
  std::string model_dir;              // cpu/cuda backends; the router's tokenizer too
  std::string model = "mock";         // model name for the mock backend
  uint32_t block_size = 32;
  std::string log_dir = "kvfleet-logs";
  std::string routing_policy = "kv";
  std::string router_bin;             // default: found beside this binary, then on PATH
  std::string worker_bin;
  std::vector<std::string> worker_args;  // passed through to every worker
  std::vector<int> devices;              // worker i runs on GPU devices[i % size] (--device); empty: none given
  std::vector<std::string> router_args;  // passed through to the router
  double stop_timeout_s = 10;
  bool restart = false;               // start a child again when it exits while the fleet is up
  double restart_delay_s = 0.5;       // --restart: wait this long first (ports freed, no busy loop)
};

// Router i of a.routers: HTTP on http_port+i, registration on registration_port+i. Workers
// register with router 0; the others list them as static workers (each asks for its Hello), and
// with several routers each gossips on gossip_base_port+i to all the others.
std::vector<std::string> RouterArgs(const UpArgs& a, int i, const std::string& router_bin) {
  const std::string host = "tcp://127.0.0.1:";
  std::vector<std::string> args = {router_bin, "--http-host", "127.0.0.1", "--http-port",
                                   std::to_string(a.http_port + i), "--registration",
                                   host + std::to_string(a.registration_port + i), "--routing-policy", a.routing_policy};
  if (!a.model_dir.empty()) args.insert(args.end(), {"--tokenizer", a.model_dir});
  if (a.routers > 1 && !a.no_gossip) {
    std::string peers;
    for (int r = 0; r < a.routers; ++r) peers += (r > 0 ? "," : "") + host + std::to_string(a.gossip_base_port + r);
    args.insert(args.end(), {"--router-id", "router-" + std::to_string(i), "--gossip-endpoint",
                             host + std::to_string(a.gossip_base_port + i), "--peer-routers", peers});
  }
  if (i > 0) {
    // The model the workers serve, named as a worker names it (WorkerConfig::ModelName).
    std::string model = a.model;
    if (!a.model_dir.empty()) {
      std::filesystem::path dir(a.model_dir);
      model = dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
    }
    std::string workers;
    for (int w = 0; w < a.workers; ++w) workers += (w > 0 ? "," : "") + host + std::to_string(a.worker_base_port + 3 * w);
    args.insert(args.end(), {"--workers", model + "=" + workers, "--block-size", std::to_string(a.block_size)});
  }
  args.insert(args.end(), a.router_args.begin(), a.router_args.end());
  return args;
}

// A program beside this one (build tree or install prefix), else the bare name (PATH).
std::string FindProgram(const std::string& name, const std::string& subdir) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto dir = self.parent_path();
    for (auto candidate : {dir / name, dir.parent_path() / subdir / name}) {
      if (std::filesystem::exists(candidate, ec)) return candidate.string();
    }
  }
  return name;
}

// The environment of the router and workers: this process's, less every KVFLEET_*
// variable. The names of those left out, but `kvfleet up`'s own, go to `dropped`.
std::vector<std::string> ChildEnvironment(std::vector<std::string>* dropped) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry = *e;
    if (entry.starts_with("KVFLEET_")) {
      if (!entry.starts_with("KVFLEET_UP_")) dropped->emplace_back(entry.substr(0, entry.find('=')));
    } else {
      env.emplace_back(entry);
    }
  }
  return env;
}

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log_path) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  setpgid(0, 0);  // Ctrl-C reaches only `kvfleet up`, which stops children in order
  // If `kvfleet up` itself is killed (SIGKILL from a supervisor or `kvfleet bench
  // --fleet-cmd` running out of patience), its children must not live on as orphans still
  // holding the fleet's ports: they get SIGTERM when it dies.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) _exit(0);  // it died before prctl took effect
  int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  execvpe(args[0], args.data(), envp.data());
  std::fprintf(stderr, "kvfleet up: cannot run %s: %s\n", args[0], std::strerror(errno));
  _exit(127);
}

// GET /ready on loopback: true on 200.
bool Ready(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const char req[] = "GET /ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) > 0) {
      char buf[32] = {};
      ok = recv(fd, buf, sizeof(buf) - 1, 0) > 12 && std::string(buf).find(" 200 ") != std::string::npos;
    }
  }
  close(fd);
  return ok;
}

struct Child {
  std::string name;
  pid_t pid;
  std::vector<std::string> argv;  // to start it again (--restart)
  std::string log_path;
  bool running = true;
  std::chrono::steady_clock::time_point restart_at{};  // --restart: when it is due, if not running
  int restarts = 0;
};

// Sends SIGTERM, waits up to `timeout_s`, then SIGKILLs what is left.
void StopChildren(std::vector<Child>& children, double timeout_s) {
  for (auto& c : children) {
    if (c.running) kill(c.pid, SIGTERM);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    bool any = false;
    for (auto& c : children) {
      if (c.running && waitpid(c.pid, nullptr, WNOHANG) == c.pid) c.running = false;
      any = any || c.running;
    }
    if (!any) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : children) {
    if (!c.running) continue;
    std::cerr << "kvfleet up: " << c.name << " did not stop in " << timeout_s << " s; killing it\n";
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    c.running = false;
  }
}

int RunUp(const UpArgs& args) {
  UpArgs a = args;
  if (a.backend == "auto" && a.model_dir.empty()) a.backend = "mock";  // nothing else to serve: named "mock"
  if (a.backend != "mock" && a.model_dir.empty()) {
    std::cerr << "kvfleet up: --backend " << a.backend << " needs --model-dir\n";
    return 2;
  }
  if (a.prefill_workers >= a.workers) {
    std::cerr << "kvfleet up: --prefill-workers " << a.prefill_workers << " leaves no decode worker of --workers "
              << a.workers << "\n";
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(a.log_dir, ec);
  if (ec) {
    std::cerr << "kvfleet up: cannot create " << a.log_dir << ": " << ec.message() << "\n";
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  sigprocmask(SIG_BLOCK, &signals, nullptr);

  std::string router_bin = a.router_bin.empty() ? FindProgram("kvfleet-router", "router") : a.router_bin;
  std::string worker_bin = a.worker_bin.empty() ? FindProgram("kvfleet-worker", "worker") : a.worker_bin;
  std::string registration = "tcp://127.0.0.1:" + std::to_string(a.registration_port);
  std::vector<Child> router, workers;
  std::vector<std::string> dropped;
  const std::vector<std::string> env = ChildEnvironment(&dropped);
  if (!dropped.empty()) {
    std::cerr << "kvfleet up: not passing";
    for (const auto& name : dropped) std::cerr << " " << name;
    std::cerr << " to the router and workers (use --router-arg or --worker-arg for their options)\n";
  }

  for (int i = 0; i < a.routers; ++i) {
    std::vector<std::string> rargs = RouterArgs(a, i, router_bin);
    const std::string name = i == 0 ? "router" : "router-" + std::to_string(i);
    const std::string log = a.log_dir + "/" + name + ".log";
    router.push_back({name, Spawn(rargs, env, log), rargs, log});
  }
  for (int i = 0; i < a.workers; ++i) {
    int base = a.worker_base_port + 3 * i;
    std::string host = "tcp://127.0.0.1:";
    std::vector<std::string> wargs = {worker_bin, "--backend", a.backend, "--worker-id", "worker-" + std::to_string(i),
                                      "--requests", host + std::to_string(base), "--events",
                                      host + std::to_string(base + 1), "--replay", host + std::to_string(base + 2),
                                      "--http-host", "127.0.0.1", "--http-port",
                                      std::to_string(a.worker_http_base_port + i), "--router",
                                      registration, "--block-size", std::to_string(a.block_size)};
    if (!a.model_dir.empty()) wargs.insert(wargs.end(), {"--model-dir", a.model_dir});
    wargs.insert(wargs.end(), {"--advertise-host", "127.0.0.1"});
    if (a.model_dir.empty()) wargs.insert(wargs.end(), {"--model-name", a.model});
    if (!a.devices.empty()) {
      wargs.insert(wargs.end(), {"--device", std::to_string(a.devices[static_cast<size_t>(i) % a.devices.size()])});
    }
    if (a.prefill_workers > 0) wargs.insert(wargs.end(), {"--role", i < a.prefill_workers ? "prefill" : "decode"});
    wargs.insert(wargs.end(), a.worker_args.begin(), a.worker_args.end());
    std::string log = a.log_dir + "/worker-" + std::to_string(i) + ".log";
    workers.push_back({"worker-" + std::to_string(i), Spawn(wargs, env, log), wargs, log});
  }
  std::cerr << "kvfleet up: " << (a.routers > 1 ? std::to_string(a.routers) + " routers from" : std::string("router on"))
            << " http://127.0.0.1:" << a.http_port << " with " << a.workers << " "
            << (a.backend == "auto" ? "workers (--backend auto: each picks cuda or cpu and logs why)"
                                    : a.backend + " workers")
            << "; logs in " << a.log_dir << "/; Ctrl-C stops all\n";

  bool announced = false;
  int rc = 0;
  timespec poll{0, 200'000'000};
  while (true) {
    siginfo_t info;
    int sig = sigtimedwait(&signals, &info, &poll);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (sig == SIGCHLD || sig < 0) {
      // Reap whoever exited.
      bool router_gone = false;
      for (auto* group : {&router, &workers}) {
        for (auto& c : *group) {
          int status = 0;
          if (c.running && waitpid(c.pid, &status, WNOHANG) == c.pid) {
            c.running = false;
            std::cerr << "kvfleet up: " << c.name << " (pid " << c.pid << ") exited ("
                      << (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                                            : "signal " + std::to_string(WTERMSIG(status)))
                      << "); see " << c.log_path << (a.restart ? "; restarting it" : "") << "\n";
            if (a.restart) {
              c.restart_at = std::chrono::steady_clock::now() +
                             std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(a.restart_delay_s));
            } else {
              router_gone = router_gone || group == &router;
            }
          }
        }
      }
      // With several routers the others serve on: the fleet ends with its last router.
      const bool any_router = std::any_of(router.begin(), router.end(), [](const Child& c) { return c.running; });
      if (router_gone && !any_router) {
        rc = 1;
        break;
      }
    }
    if (a.restart) {
      const auto now = std::chrono::steady_clock::now();
      for (auto* group : {&router, &workers}) {
        for (auto& c : *group) {
          if (c.running || now < c.restart_at) continue;
          c.pid = Spawn(c.argv, env, c.log_path);
          c.running = true;
          ++c.restarts;
          std::cerr << "kvfleet up: " << c.name << " restarted (pid " << c.pid << ", restart " << c.restarts << ")\n";
        }
      }
    }
    if (!announced && Ready(a.http_port)) {
      announced = true;
      std::cerr << "kvfleet up: ready\n";
    }
  }
  std::cerr << "kvfleet up: stopping\n";
  StopChildren(router, a.stop_timeout_s);
  StopChildren(workers, a.stop_timeout_s);
  return rc;
}

}  // namespace

Action AddUpCommand(CLI::App& parent) {
  auto args = std::make_shared<UpArgs>();
  CLI::App* cmd = parent.add_subcommand("up", "start a router and N workers on loopback; Ctrl-C stops them all");
  cmd->add_option("--backend", args->backend,
                  "worker backend: auto (with --model-dir: cuda when the build's kernels run on the GPU, else cpu; "
                  "without: mock), cuda, cpu or mock")
      ->capture_default_str();
  cmd->add_option("--workers", args->workers, "number of workers")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--prefill-workers", args->prefill_workers,
                  "prefill and decode on different workers: the first N workers run --role prefill, the others "
                  "--role decode (router/routing/README.md); 0: every worker --role both")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  cmd->add_option("--routers", args->routers,
                  "number of routers (router i: HTTP and registration ports +i); several share their load over "
                  "gossip, and the workers register with the first")
      ->capture_default_str()
      ->check(CLI::Range(1, 32));
  cmd->add_option("--http-port", args->http_port, "router HTTP port (router i: +i)")->capture_default_str();
  cmd->add_option("--registration-port", args->registration_port, "router registration port (router i: +i)")
      ->capture_default_str();
  cmd->add_option("--gossip-base-port", args->gossip_base_port, "with --routers N > 1: router i gossips on base+i")
      ->capture_default_str();
  cmd->add_flag("--no-gossip", args->no_gossip,
                "with --routers N > 1: the routers share nothing, each counting only its own requests (for comparison)");
  cmd->add_option("--worker-base-port", args->worker_base_port,
                  "worker i uses base+3i (requests), +1 (events), +2 (replay)")
      ->capture_default_str();
  cmd->add_option("--worker-http-base-port", args->worker_http_base_port, "worker i serves HTTP on base+i")
      ->capture_default_str();
  cmd->add_option("--model-dir", args->model_dir, "HF model directory (cpu/cuda; optional for mock)");
  cmd->add_option("--model", args->model, "model name of mock workers without --model-dir")->capture_default_str();
  cmd->add_option("--block-size", args->block_size, "tokens per KV block")->capture_default_str();
  cmd->add_option("--log-dir", args->log_dir, "directory for router.log and worker-N.log")->capture_default_str();
  cmd->add_option("--routing-policy", args->routing_policy,
                  "round_robin, least_loaded, kv, approx or kv_retention; for comparison dynamo, llmd, sglang or preble")
      ->capture_default_str();
  cmd->add_option("--router-bin", args->router_bin, "kvfleet-router to run (default: beside kvfleet, then PATH)");
  cmd->add_option("--worker-bin", args->worker_bin, "kvfleet-worker to run (default: beside kvfleet, then PATH)");
  cmd->add_option("--stop-timeout-s", args->stop_timeout_s, "grace period before SIGKILL")->capture_default_str();
  cmd->add_flag("--restart", args->restart, "start a router or worker again when it exits while the fleet is up");
  cmd->add_option("--restart-delay-s", args->restart_delay_s, "--restart: seconds before starting it again")
      ->capture_default_str();
  cmd->add_option("--devices", args->devices,
                  "cuda: GPU ordinals the workers take in turn (worker i: the (i mod n)th), e.g. --devices 0,1")
      ->delimiter(',')
      ->check(CLI::Range(0, 1023));
  cmd->add_option("--worker-arg", args->worker_args,
                  "an extra argument for every worker (repeatable; KVFLEET_* variables do not reach workers)");
  cmd->add_option("--router-arg", args->router_args,
                  "an extra argument for every router (repeatable; KVFLEET_* variables do not reach it)");
  return [args]() { return RunUp(*args); };
}

}  // namespace kvfleet::cli
