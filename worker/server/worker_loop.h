// WorkerLoop: the engine thread of kvfleet-worker. It joins the request socket to the
// engine: takes Generate/Cancel commands between steps, runs Engine::Step() while there
// is work, streams each step's outputs back as Deltas, and shuts down gracefully.
//
//   loop:
//     commands = server.Take(wait: none while busy, idle_wait when idle)
//     apply them (Add → Error on refusal; Cancel)
//     between_steps()            (the event publisher's snapshot service, heartbeats)
//     if engine has work: outputs = engine.Step(); send them
//
// Shutdown (RequestStop, e.g. on SIGTERM): new Generates are refused with shuttingDown;
// running requests continue until they finish or the grace period ends, then the rest
// are cancelled (their Deltas say so) and Run() returns.
//
// Thread safety: Run() on one thread (the engine thread); RequestStop() from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <unordered_map>

#include "common/clock.h"
#include "worker/engine/engine.h"
#include "worker/server/request_server.h"

namespace kvfleet::server {

struct WorkerLoopOptions {
  std::string model_name;                   // Generates naming another model are refused
  DurationNs idle_wait = 50 * kNsPerMs;     // longest wait for a command when idle
  DurationNs shutdown_grace = 30 * kNsPerSec;  // time running requests get to finish
};

class WorkerLoop {
 public:
  // The pointers outlive the loop. `between_steps` may be empty.
  WorkerLoop(const WorkerLoopOptions& options, engine::Engine* engine, RequestServer* server, const Clock* clock,
             std::function<void()> between_steps);

  // Called on the engine thread with each step's outputs, before they are sent (metrics).
  void SetOutputObserver(std::function<void(const std::vector<engine::RequestOutput>&)> observer) {
    output_observer_ = std::move(observer);
  }

  // Runs until RequestStop() and the drain are done.
  void Run();
  void RequestStop();
  bool stopping() const { return stop_requested_.load(std::memory_order_acquire); }

  // Requests in the engine, for /ready and tests (engine thread's view, relaxed).
  size_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  void Apply(Command& command, bool refuse_new);
  void Send(std::vector<engine::RequestOutput>& outputs);

  const WorkerLoopOptions options_;
  engine::Engine* const engine_;
  RequestServer* const server_;
  const Clock* const clock_;
  std::function<void()> between_steps_;
  std::function<void(const std::vector<engine::RequestOutput>&)> output_observer_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<size_t> in_flight_{0};

  std::unordered_map<ClientKey, engine::RequestId, ClientKeyHash> by_key_;
  std::unordered_map<engine::RequestId, ClientKey> by_id_;
};

}  // namespace kvfleet::server
