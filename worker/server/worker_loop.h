// WorkerLoop: the engine thread of kvfleet-worker. It joins the request socket and the
// event publisher to the engine: takes Generate/Cancel commands between steps, runs
// Engine::Step() while there is work, publishes each step's KV events, streams the step's
// outputs back as Deltas, and shuts down gracefully.
//
//   loop:
//     commands = server.Take(wait: none while busy, idle_wait when idle)
//     apply them (Add → Error on refusal; Cancel; LoadLora/UnloadLora → engine → LoraResult)
//     if publisher.snapshot_wanted():
//       publisher.PublishSnapshot(kv.TakeEvents(), kv.events_dropped(), kv.Snapshot())
//     between_steps()                                (metrics)
//     if engine has work:
//       outputs = engine.Step()
//       publisher.Publish(kv.TakeEvents(), load, kv.events_dropped())
//       send outputs         (after the events: a prompt's blocks leave with its first token)
//     else, every idle_load_interval: publisher.Publish(kv.TakeEvents(), load, ...)
//                                                    (the load idle heartbeats carry)
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
#include "worker/kv/kv_cache_manager.h"
#include "worker/server/event_publisher.h"
#include "worker/server/kv_pulls.h"
#include "worker/server/request_server.h"

namespace kvfleet::server {

struct WorkerLoopOptions {
  std::string model_name;                   // Generates naming another model are refused
  DurationNs idle_wait = 50 * kNsPerMs;     // longest wait for a command when idle
  DurationNs shutdown_grace = 30 * kNsPerSec;  // time running requests get to finish
  // While idle, how often the load heartbeats carry is refreshed; well inside Contract 2's
  // 250 ms heartbeat, and nothing changes it while the engine is idle but a command.
  DurationNs idle_load_interval = 250 * kNsPerMs;
};

class WorkerLoop {
 public:
  // The pointers outlive the loop; `kv` is the engine's KV cache manager. `between_steps`
  // (metrics) may be empty.
  WorkerLoop(const WorkerLoopOptions& options, engine::Engine* engine, kv::KvCacheManager* kv,
             events::EventPublisher* publisher, RequestServer* server, const Clock* clock,
             std::function<void()> between_steps);

  using StepObserver = std::function<void(const engine::StepReport&, const std::vector<engine::RequestOutput>&)>;
  // Called on the engine thread after each step with its report and outputs, before the
  // outputs are sent (metrics).
  void SetStepObserver(StepObserver observer) { step_observer_ = std::move(observer); }

  // KV transfer (kv_pulls.h): pulls for hinted Generates, and serving others' pulls. May be
  // null (no transfer). Outlives the loop.
  void SetPulls(KvPulls* pulls) { pulls_ = pulls; }

  // Called on the engine thread after an adapter was loaded or unloaded (Hello, metrics).
  void SetLoraObserver(std::function<void()> observer) { lora_observer_ = std::move(observer); }

  // Runs until RequestStop() and the drain are done.
  void Run();
  void RequestStop();
  bool stopping() const { return stop_requested_.load(std::memory_order_acquire); }

  // Requests in the engine, for /ready and tests (engine thread's view, relaxed).
  size_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  void Apply(Command& command, bool refuse_new);
  void Send(std::vector<engine::RequestOutput>& outputs);
  // `load` with the pull totals that changed since the last batch (Load.pulls).
  LoadReport WithPulls(LoadReport load);

  const WorkerLoopOptions options_;
  engine::Engine* const engine_;
  kv::KvCacheManager* const kv_;
  events::EventPublisher* const publisher_;
  RequestServer* const server_;
  const Clock* const clock_;
  std::function<void()> between_steps_;
  StepObserver step_observer_;
  KvPulls* pulls_ = nullptr;
  std::function<void()> lora_observer_;
  TimeNs next_idle_load_ = 0;
  std::atomic<bool> stop_requested_{false};
  std::atomic<size_t> in_flight_{0};

  std::unordered_map<ClientKey, engine::RequestId, ClientKeyHash> by_key_;
  std::unordered_map<engine::RequestId, ClientKey> by_id_;
};

}  // namespace kvfleet::server
