// kvfleet-worker: serves one model on one device (or, with --backend mock and
// --mock-workers N, N simulated workers in one process for fleet benchmarks).
//
// SIGTERM or SIGINT: stop accepting, finish or cancel in-flight requests within
// --shutdown-grace-s, flush events, say Bye, exit 0.
#include <signal.h>

#include <iostream>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/cpu_latency.h"
#include "common/log.h"
#include "worker/server/worker.h"
#include "worker/server/worker_config.h"

int main(int argc, char** argv) {
  using namespace kvfleet;
  CLI::App app{"kvfleet-worker: one model, continuous batching, a reusable KV cache, KV events"};
  CommonOptions common;
  AddCommonOptions(app, &common, "kvfleet-worker");
  server::WorkerConfig config;
  server::AddWorkerFlags(app, &config);
  CpuLatencyOption cpu_latency;
  AddCpuLatencyOption(app, &cpu_latency);
  int rc = ParseCommandLine(app, &common, argc, argv);
  if (rc >= 0) return rc;
  if (Status st = config.Validate(); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  auto held_latency = HoldCpuLatency(cpu_latency);
  if (!held_latency.ok()) {
    std::cerr << "error: --cpu-latency-us: " << held_latency.status().message() << "\n";
    return 2;
  }
  if (*held_latency) Logger("worker")->info("holding a CPU latency request of {} µs", (*held_latency)->max_latency_us());

  // Signals go to one waiting thread, never to a worker thread mid-step.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  zmq::context_t context;
  std::vector<std::unique_ptr<server::Worker>> workers;
  for (uint32_t i = 0; i < config.mock_workers; ++i) {
    auto worker = server::Worker::Start(config.ForInstance(i), context);
    if (!worker.ok()) {
      Logger("worker")->critical("cannot start: {}", worker.status().ToString());
      for (auto& w : workers) w->RequestStop();
      return 1;
    }
    workers.push_back(std::move(*worker));
  }

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    Logger("worker")->info("{}: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    for (auto& w : workers) w->RequestStop();
  });
  std::vector<std::thread> engine_threads;
  for (size_t i = 1; i < workers.size(); ++i) engine_threads.emplace_back([&, i] { workers[i]->Run(); });
  workers[0]->Run();
  for (auto& t : engine_threads) t.join();
  // Workers can also stop without a signal (a fatal error path); release the signal thread.
  pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  workers.clear();
  return 0;
}
