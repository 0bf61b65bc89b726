// How many mock workers one CPU core sustains at a given request rate each.
//
// N complete workers (requests socket, engine, KV cache manager, event publisher, HTTP)
// run in this process on the mock backend with its default cost model (Llama-3.1-8B on an
// H100). One load thread sends each worker `--rate` requests/s through a DEALER and
// reads the Deltas. CPU time of the process minus the load thread's own, over the wall
// time, gives the cores the workers used; workers per core = N / cores.
//
//   build/bench/mock_workers_bench [--workers 8] [--rate 100] [--seconds 5]
//                                  [--prompt 512] [--shared 384] [--output 64]
//
// Requests: `prompt` tokens whose first `shared` are the same for every request of a
// worker (a system prompt), then `output` generated tokens (greedy, ignore EOS).
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <capnp/message.h>
#include <zmq.hpp>

#include "common/log.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "worker/server/worker.h"

namespace {

using namespace kvfleet;

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

std::string Frame(uint64_t id, uint32_t worker, uint32_t prompt, uint32_t shared, uint32_t output) {
  capnp::MallocMessageBuilder msg;
  auto g = msg.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(id);
  auto t = g.initTokens(prompt);
  for (uint32_t i = 0; i < prompt; ++i) {
    t.set(i, i < shared ? 1000 + worker * 7 + i : static_cast<uint32_t>(50000 + (id * 7919 + i * 31) % 60000));
  }
  g.getSampling().setTemperature(0);
  g.getSampling().setMaxTokens(output);
  g.getSampling().setIgnoreEos(true);
  return wire::Encode(msg);
}

int Arg(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int workers_n = Arg(argc, argv, "--workers", 8);
  const int rate = Arg(argc, argv, "--rate", 100);
  const int seconds = Arg(argc, argv, "--seconds", 5);
  const uint32_t prompt = static_cast<uint32_t>(Arg(argc, argv, "--prompt", 512));
  const uint32_t shared = static_cast<uint32_t>(Arg(argc, argv, "--shared", 384));
  const uint32_t output = static_cast<uint32_t>(Arg(argc, argv, "--output", 64));
  (void)InitLogging(LogOptions{"warn", "text"});

  zmq::context_t context;
  std::vector<std::unique_ptr<server::Worker>> workers;
  for (int i = 0; i < workers_n; ++i) {
    server::WorkerConfig c;
    c.backend = "mock";
    c.model_name = "mock-8b";
    c.requests = c.events = c.replay = "tcp://127.0.0.1:0";
    c.http_port = 0;
    c.worker_id = "bench-" + std::to_string(i);
    auto w = server::Worker::Start(c, context);
    if (!w.ok()) {
      std::fprintf(stderr, "worker %d: %s\n", i, w.status().ToString().c_str());
      return 1;
    }
    workers.push_back(std::move(*w));
  }
  std::vector<std::thread> engines;
  for (auto& w : workers) engines.emplace_back([&w] { w->Run(); });

  std::vector<zmq::socket_t> sockets;
  for (auto& w : workers) {
    sockets.emplace_back(context, zmq::socket_type::dealer);
    sockets.back().set(zmq::sockopt::linger, 0);
    sockets.back().connect(w->requests_endpoint());
  }
  std::vector<zmq::pollitem_t> items;
  for (auto& s : sockets) items.push_back({static_cast<void*>(s), 0, ZMQ_POLLIN, 0});

  const auto interval = std::chrono::nanoseconds(1'000'000'000 / rate);
  const auto t0 = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  const auto t_end = t0 + std::chrono::seconds(seconds);
  std::vector<std::chrono::steady_clock::time_point> next(workers_n);
  for (int i = 0; i < workers_n; ++i) next[i] = t0 + interval * i / workers_n;  // staggered
  uint64_t sent = 0, finished = 0, tokens = 0, cached = 0, prompt_tokens = 0;
  std::vector<double> ttft_ms;
  uint64_t id = 0;
  std::this_thread::sleep_until(t0);
  const double cpu0 = ProcessCpuSeconds(), gen_cpu0 = ThreadCpuSeconds();
  const auto wall0 = std::chrono::steady_clock::now();
  // CPU and wall time are measured over the sending window, the steady state.
  double window_wall = 0, worker_cpu = 0;
  while (true) {
    const auto now = std::chrono::steady_clock::now();
    const bool sending = now < t_end;
    if (!sending && window_wall == 0) {
      window_wall = std::chrono::duration<double>(now - wall0).count();
      worker_cpu = (ProcessCpuSeconds() - cpu0) - (ThreadCpuSeconds() - gen_cpu0);
    }
    if (!sending && finished == sent) break;
    if (now > t_end + std::chrono::seconds(10)) break;
    auto soonest = t_end;
    for (int i = 0; sending && i < workers_n; ++i) {
      while (next[i] <= now) {
        std::string f = Frame(++id, static_cast<uint32_t>(i), prompt, shared, output);
        sockets[i].send(zmq::buffer(f), zmq::send_flags::dontwait);
        ++sent;
        next[i] += interval;
      }
      soonest = std::min(soonest, next[i]);
    }
    auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(soonest - now);
    zmq::poll(items.data(), items.size(), sending ? std::max(wait, std::chrono::milliseconds(0)) : std::chrono::milliseconds(50));
    for (size_t i = 0; i < sockets.size(); ++i) {
      zmq::message_t m;
      while (sockets[i].recv(m, zmq::recv_flags::dontwait)) {
        auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
        if (!d.ok()) continue;
        auto root = (*d)->Root<schema::FromWorker>();
        if (root.isError()) {
          ++finished;
          continue;
        }
        auto delta = root.getDelta();
        if (delta.getFinishReason() == schema::FinishReason::NONE) continue;
        ++finished;
        tokens += delta.getUsage().getCompletionTokens();
        cached += delta.getUsage().getCachedDeviceTokens();
        prompt_tokens += delta.getUsage().getPromptTokens();
        ttft_ms.push_back(static_cast<double>(delta.getUsage().getTimeToFirstTokenUs()) / 1000.0);
      }
    }
  }
  const double wall = window_wall;
  for (auto& w : workers) w->RequestStop();
  for (auto& t : engines) t.join();

  std::sort(ttft_ms.begin(), ttft_ms.end());
  auto pct = [&](double p) { return ttft_ms.empty() ? 0.0 : ttft_ms[static_cast<size_t>(p * (ttft_ms.size() - 1))]; };
  const double cores = worker_cpu / wall;
  std::printf("mock workers: %d at %d req/s each (prompt %u, %u shared, %u out), %.1f s of load\n", workers_n, rate,
              prompt, shared, output, wall);
  std::printf("  requests: %lu sent, %lu finished (%.0f req/s offered), %lu tokens generated\n",
              static_cast<unsigned long>(sent), static_cast<unsigned long>(finished), sent / wall,
              static_cast<unsigned long>(tokens));
  std::printf("  prefix cache: %.1f%% of prompt tokens cached\n", prompt_tokens ? 100.0 * cached / prompt_tokens : 0.0);
  std::printf("  TTFT inside the workers (modelled H100 time): p50 %.1f ms, p99 %.1f ms\n", pct(0.5), pct(0.99));
  std::printf("  worker CPU: %.2f core-seconds over %.1f s = %.3f cores -> %.1f mock workers per core at %d req/s\n",
              worker_cpu, wall, cores, cores > 0 ? workers_n / cores : 0.0, rate);
  return 0;
}
