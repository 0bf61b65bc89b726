// kvfleet simulate: a fleet of simulated workers in one process, registered with a router,
// for scale tests of the router (cli/simulate/README.md).
//
//   kvfleet simulate --router tcp://127.0.0.1:5555 --workers 1000 --blocks 100000 --model sim
#include <sys/resource.h>

#include <atomic>
#include <csignal>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/simulate/fleet_sim.h"
#include "common/log.h"

namespace kvfleet::cli {

namespace {

std::atomic<bool> g_stop{false};

extern "C" void OnStopSignal(int) { g_stop.store(true); }

struct SimulateArgs {
  sim::FleetSimOptions fleet;
  double token_delay_ms = 10;
  double batch_interval_ms = 50;
};

// Every worker holds a few file descriptors (sockets, ZMQ mailboxes, each router's
// connections): a thousand workers need more than the usual soft limit of 1024.
void RaiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  (void)setrlimit(RLIMIT_NOFILE, &limit);
}

int RunSimulate(SimulateArgs args) {
  args.fleet.worker.token_delay = static_cast<DurationNs>(args.token_delay_ms * kNsPerMs);
  args.fleet.worker.batch_interval = static_cast<DurationNs>(args.batch_interval_ms * kNsPerMs);
  if (Status s = sim::ValidateFleetSimOptions(args.fleet); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 2;
  }
  if (!(args.batch_interval_ms > 0)) {
    std::cerr << "error: --batch-interval-ms must be > 0\n";
    return 2;
  }
  RaiseFileLimit();
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  sim::FleetSim fleet(args.fleet);
  if (Status s = fleet.Run(g_stop); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

Action AddSimulateCommand(CLI::App& parent) {
  auto args = std::make_shared<SimulateArgs>();
  sim::FleetSimOptions& f = args->fleet;
  sim::SimWorkerOptions& w = f.worker;
  CLI::App* cmd = parent.add_subcommand(
      "simulate", "run N simulated workers in this process, registered with a router (router scale tests)");
  cmd->add_option("--router", w.router_endpoint, "the router's registration endpoint, e.g. tcp://127.0.0.1:5555")
      ->required();
  cmd->add_option("--workers", f.workers, "simulated workers")->capture_default_str();
  cmd->add_option("--blocks", w.cache.capacity_blocks, "KV blocks each worker holds at most")->capture_default_str();
  cmd->add_option("--model", w.model, "the model every worker serves")->capture_default_str();
  cmd->add_option("--block-size", w.block_size, "tokens per block (Contract 1's B), as Hellos announce")
      ->capture_default_str();
  cmd->add_option("--fill", w.initial_fill, "fraction of each worker's blocks held at start (learnt by snapshot)")
      ->capture_default_str();
  cmd->add_option("--events-per-s", w.events_per_s, "block events (stored blocks, removed hashes) per worker per second")
      ->capture_default_str();
  cmd->add_option("--batch-interval-ms", args->batch_interval_ms, "one event batch per worker this often (an engine step)")
      ->capture_default_str();
  cmd->add_option("--churn", f.churn_per_min, "fraction of the workers replaced per minute (Bye, then a new id and ports)")
      ->capture_default_str();
  cmd->add_option("--tokens", w.tokens, "tokens in each answer (at most the request's max_tokens)")
      ->capture_default_str();
  cmd->add_option("--token-delay-ms", args->token_delay_ms, "milliseconds before each token of an answer")
      ->capture_default_str();
  cmd->add_option("--ring-batches", w.ring_batches, "batches each worker keeps for replays")->capture_default_str();
  cmd->add_option("--host", w.host, "address the workers bind and announce")->capture_default_str();
  cmd->add_option("--base-port", f.base_port, "first port; worker slot k binds base + 3k .. base + 3k + 2")
      ->capture_default_str();
  cmd->add_option("--name-prefix", f.name_prefix, "worker ids are PREFIX-N")->capture_default_str();
  cmd->add_option("--threads", f.threads, "poll-loop threads the workers are spread over")->capture_default_str();
  cmd->add_option("--duration", f.duration_s, "stop after this many seconds (0: at SIGINT or SIGTERM)")
      ->capture_default_str();
  cmd->add_option("--stats-interval", f.stats_interval_s, "seconds between progress lines (0: none)")
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "workload seed")->capture_default_str();
  return [args]() { return RunSimulate(*args); };
}

}  // namespace kvfleet::cli
