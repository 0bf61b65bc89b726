#include "worker/server/worker_loop.h"

#include "common/log.h"

namespace kvfleet::server {

WorkerLoop::WorkerLoop(const WorkerLoopOptions& options, engine::Engine* engine, kv::KvCacheManager* kv,
                       events::EventPublisher* publisher, RequestServer* server, const Clock* clock,
                       std::function<void()> between_steps)
    : options_(options),
      engine_(engine),
      kv_(kv),
      publisher_(publisher),
      server_(server),
      clock_(clock),
      between_steps_(std::move(between_steps)) {}

void WorkerLoop::RequestStop() {
  stop_requested_.store(true, std::memory_order_release);
  server_->Wake();
}

void WorkerLoop::Apply(Command& command, bool refuse_new) {
  if (auto* cancel = std::get_if<CancelCommand>(&command)) {
    auto it = by_key_.find(cancel->key);
    if (it != by_key_.end()) engine_->Cancel(it->second);
    return;
  }
  if (auto* load = std::get_if<LoadLoraCommand>(&command)) {
    Status st = load->status;
    if (st.ok()) st = engine_->AddLora(std::move(load->adapter));
    if (st.ok()) Logger("worker")->info("serving LoRA adapter '{}'", load->name);
    server_->SendLoraResult(load->key, st);
    if (st.ok() && lora_observer_) lora_observer_();
    return;
  }
  if (auto* unload = std::get_if<UnloadLoraCommand>(&command)) {
    Status st = engine_->RemoveLora(unload->name);
    if (st.ok()) Logger("worker")->info("unloaded LoRA adapter '{}'", unload->name);
    server_->SendLoraResult(unload->key, st);
    if (st.ok() && lora_observer_) lora_observer_();
    return;
  }
  auto& gen = std::get<GenerateCommand>(command);
  if (refuse_new) {
    server_->SendError(gen.key, WorkerErrorCode::kShuttingDown, "the worker is shutting down");
    return;
  }
  // A request may name its adapter by its model field (vLLM's convention) as well as by loraName.
  if (!gen.model.empty() && gen.model != options_.model_name && engine_->loras().Has(gen.model) &&
      (gen.request.lora.empty() || gen.request.lora == gen.model)) {
    gen.request.lora = gen.model;
    gen.model.clear();
  }
  if (!gen.model.empty() && gen.model != options_.model_name) {
    server_->SendError(gen.key, WorkerErrorCode::kUnknownModel,
                       "this worker serves '" + options_.model_name + "', not '" + gen.model + "'");
    return;
  }
  if (by_key_.contains(gen.key)) {
    server_->SendError(gen.key, WorkerErrorCode::kInvalidRequest,
                       "request id " + std::to_string(gen.key.request_id) + " is already in flight");
    return;
  }
  std::optional<engine::GenerateRequest> pulled;  // what a pull needs of the request
  if (pulls_ != nullptr && pulls_->Wants(gen.pull)) pulled = gen.request;
  auto id = engine_->Add(std::move(gen.request), gen.arrival);
  if (!id.ok()) {
    server_->SendError(gen.key, ErrorCodeFor(id.status()), id.status().message());
    return;
  }
  if (pulled) pulls_->Start(*id, *pulled, gen.pull);
  by_key_.emplace(gen.key, *id);
  by_id_.emplace(*id, gen.key);
}

void WorkerLoop::Send(std::vector<engine::RequestOutput>& outputs) {
  for (const engine::RequestOutput& out : outputs) {
    auto it = by_id_.find(out.id);
    if (it == by_id_.end()) continue;
    server_->SendOutput(it->second, out);
    if (out.last) {
      by_key_.erase(it->second);
      by_id_.erase(it);
    }
  }
}

void WorkerLoop::Run() {
  TimeNs drain_deadline = 0;
  bool cancelled_all = false;
  while (true) {
    bool stopping = stop_requested_.load(std::memory_order_acquire);
    if (stopping && drain_deadline == 0) {
      drain_deadline = clock_->Now() + options_.shutdown_grace;
      Logger("worker")->info("shutting down: {} requests in flight, {} s grace", engine_->num_requests(),
                             options_.shutdown_grace / kNsPerSec);
    }
    // A KV pull being served with a frame to read goes on at once, as a step would.
    const bool busy = engine_->HasWork() || stopping || (pulls_ != nullptr && pulls_->reading());
    std::vector<Command> commands = server_->Take(busy ? 0 : options_.idle_wait);
    for (Command& c : commands) Apply(c, stopping);
    if (stopping && !cancelled_all && clock_->Now() >= drain_deadline) {
      Logger("worker")->warn("grace period over: cancelling {} requests", engine_->num_requests());
      engine_->CancelAll();
      cancelled_all = true;
    }
    if (publisher_->snapshot_wanted()) {
      std::vector<kv::KvEvent> events = kv_->TakeEvents();  // sealed before the snapshot they lead to
      publisher_->PublishSnapshot(std::move(events), kv_->events_dropped(), kv_->Snapshot());
    }
    if (pulls_ != nullptr) pulls_->Poll();
    if (between_steps_) between_steps_();
    if (engine_->HasWork()) {
      std::vector<engine::RequestOutput> outputs = engine_->Step();
      const engine::StepReport& step = engine_->last_step();
      publisher_->Publish(kv_->TakeEvents(), WithPulls(step.load), kv_->events_dropped());
      if (step_observer_) step_observer_(step, outputs);
      Send(outputs);
    } else if (clock_->Now() >= next_idle_load_) {
      publisher_->Publish(kv_->TakeEvents(), WithPulls(engine_->Load()), kv_->events_dropped());
      next_idle_load_ = clock_->Now() + options_.idle_load_interval;
    }
    in_flight_.store(engine_->num_requests(), std::memory_order_relaxed);
    if (stopping && !engine_->HasWork()) break;
  }
  // Anything the drain left (cancellations after the last step) goes out too.
  publisher_->Publish(kv_->TakeEvents(), WithPulls(engine_->Load()), kv_->events_dropped());
}

LoadReport WorkerLoop::WithPulls(LoadReport load) {
  if (pulls_ != nullptr) load.pulls = pulls_->TakeChangedPullTotals();
  return load;
}

}  // namespace kvfleet::server
