// Engine: one model's continuous-batching inference loop (nano-vllm's LLMEngine).
//
// Step() is the whole loop body:
//
//   batch   = scheduler.Schedule()     decode first, then chunked prefill, within the
//                                      token budget; preempts under KV pressure
//   backend.Execute(batch)             one forward pass, one token per finished prompt
//   outputs = Postprocess(batch)       append tokens, stop conditions, free what ended
//   last_step() = report               for metrics and the load report
//
// The KV cache manager collects the step's events; the worker loop takes them after Step()
// and publishes them with the load (worker/server/worker_loop.h).
//
// Requests join between steps (Add) without waiting for the batch to drain; Cancel takes
// effect at the start of the next step, which frees the request's blocks.
//
// n sequences (OpenAI's n): a request of n runs as sequence 0 until its prompt is computed,
// so the prompt is prefilled once. The step that samples sequence 0's first token forks
// sequences 1..n-1 at the front of the waiting queue; each then matches the prompt's full
// blocks in the reuse tree, shared with sequence 0 (which holds them, so they cannot be
// evicted meanwhile), and recomputes only the prompt's last partial block, 1..B-1 tokens,
// into a block of its own (a prompt that ends on a block boundary had its last block
// stored: the fork copies all but its last token, the KV manager's partial reuse). The
// partial block is recomputed, not copied on write: it is at most one block, and a fork
// then needs nothing of the KV manager or the backends that a prefix hit does not. Sequence i samples with seed + i and stops on its
// own; usage counts the prompt once. An error or a cancel ends all n. With block reuse off
// (or past a windowed pool's first window, which is not stored) the sequences share
// nothing and each prefills what it cannot match.
//
// LoRA adapters: a request names one by GenerateRequest.lora (empty: the base model). The
// engine's LoraRegistry holds the adapters it serves (AddLora, RemoveLora) and assigns the
// backend's slots as the scheduler admits sequences (scheduler.h); a sequence runs with its
// adapter's slot in every step. Its blocks hash with the adapter's name (Contract 1) and its
// stored events carry the adapter's loraId. An adapter is removed only when no request,
// waiting or running, uses it.
//
// Thread safety: thread-compatible; owned by the engine thread. The KV cache manager and
// the backend it is given are used from that thread only.
//
// Invariants (CheckInvariants):
//   1. Every request is in exactly one of waiting, running.
//   2. A running request holds KV blocks for every token it has computed.
//   3. A waiting request holds no KV blocks.
//   4. Finished requests are gone from the engine after the step that reported them.
//   5. A request's n outputs with a finish reason come once each; the last of them is `last`.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "worker/backend/backend.h"
#include "worker/engine/engine_stats.h"
#include "worker/engine/lora_registry.h"
#include "worker/engine/request.h"
#include "worker/engine/scheduler.h"
#include "worker/engine/sequence.h"


namespace kvfleet::engine {

struct EngineOptions {
  std::string model_name;  // Contract 1's hash namespace
  SchedulerOptions scheduler;
  EngineLimits limits;
  std::vector<TokenId> eos_token_ids;  // from the model's config
  int32_t max_lora_rank = model::kMaxLoraRank;  // --max-lora-rank: larger adapters are refused
  Status Validate(uint32_t block_size) const;
};

class Engine {
 public:
  // REQUIRES: options.Validate(kv->block_size()).ok(); the pointers outlive the engine.
  Engine(const EngineOptions& options, backend::ModelBackend* backend, kv::KvCacheManager* kv, const Clock* clock);
  ~Engine();

  // Queues a request. Fails (nothing queued) when the request is invalid (see
  // ValidateRequest; also n over max_batch_size, or n sequences whose blocks cannot fit the
  // cache at once), names an adapter the engine does not serve (NotFound) or the queue has
  // no room for its n sequences (ResourceExhausted).
  // `arrival` starts its TTFT.
  Result<RequestId> Add(GenerateRequest request, TimeNs arrival);

  // Asks for a request to end; the next Step() frees the blocks of its sequences and
  // reports each with FinishReason::kCancelled. Unknown or finished ids are ignored.
  void Cancel(RequestId id);
  // Cancels every request (shutdown after the grace period).
  void CancelAll();

  // Serves `adapter` from now on (LoraRegistry::Add's errors).
  Status AddLora(std::shared_ptr<const model::LoraAdapter> adapter);
  // Stops serving an adapter. FailedPrecondition, naming how many, while requests (waiting
  // or running) use it; NotFound for an unknown name.
  Status RemoveLora(const std::string& name);
  const LoraRegistry& loras() const { return loras_; }

  // KV transfer: a held request stays queued but is not admitted until Unhold, while the
  // worker pulls its prompt's cached prefix from another worker (its queue wait and the pull
  // overlap). Held before its first admission only; unknown or finished ids are ignored.
  void Hold(RequestId id);
  void Unhold(RequestId id);
  // Stores request `id`'s blocks at `priority` where its own retention says nothing (a range
  // over the whole prompt after its own ranges, and its decode priority when that is the
  // default), while it waits with no KV sequence yet: KvPulls' receiver keeps a request that
  // came for its load below the requests that came for its cache. Nothing happens for an
  // unknown request or one already admitted.
  void LowerRetention(RequestId id, uint8_t priority);
  size_t num_held() const { return held_; }
  // Whether request `id` still waits for its first admission (held or not): false once
  // admitted, finished, or for an unknown id.
  bool AwaitsAdmission(RequestId id) const;

  // True when a Step() would do something: a sequence that is not held, or a cancellation.
  bool HasWork() const { return sequences_.size() > held_ || !ending_.empty(); }
  size_t num_requests() const { return requests_.size(); }
  size_t num_sequences() const { return sequences_.size(); }

  // One engine step. Returns the news of every request that has some.
  std::vector<RequestOutput> Step();

  // The report of the latest Step(); its load is Load() as that step left it.
  const StepReport& last_step() const { return last_step_; }
  LoadReport Load() const;
  const EngineCounters& counters() const { return counters_; }
  const Scheduler& scheduler() const { return scheduler_; }

  // Checks the invariants above and the scheduler's (tests).
  Status CheckInvariants() const;

 private:
  Status Execute(const ScheduledBatch& batch, std::vector<TokenId>* sampled);
  void Postprocess(const ScheduledBatch& batch, const std::vector<TokenId>& sampled,
                   std::vector<RequestOutput>* outputs, uint32_t* preemptions);
  void ApplyCancellations(std::vector<RequestOutput>* outputs);
  // Sequences 1..n-1 of seq's request, once seq's prompt is computed.
  void Fork(Sequence* seq);
  Status CheckFits(const GenerateRequest& request) const;
  // Why `seq` stops after its newest token, or kNone.
  FinishReason StopReason(const Sequence& seq) const;
  // Constrained decoding: the matcher accepts the newest token; why `seq` stops, or kNone.
  FinishReason FollowGrammar(Sequence* seq);
  // The backend's TokenBitmaskFiller (backend.h): seq's next-token mask into the backend's
  // `mask`, called while the step's forward pass runs. A mask with no token but an end token
  // sets grammar_end (and keeps one bit set for the sampler); Postprocess then ends seq.
  void FillMask(Sequence* seq, std::span<uint32_t> mask);
  // How a grammar_end sequence ends: stop when its document is complete, else error.
  FinishReason GrammarEnd(const Sequence& seq) const;
  // Ends a sequence: frees its blocks and reports it; it leaves sequences_ at the end of
  // the step. An error ends its siblings at the start of the next step. Idempotent.
  void Finish(Sequence* seq, FinishReason reason, std::vector<RequestOutput>* outputs);
  RequestOutput MakeOutput(Sequence* seq, FinishReason reason);
  void UpdateRates(const StepReport& report);

  const EngineOptions options_;
  backend::ModelBackend* const backend_;
  kv::KvCacheManager* const kv_;
  const Clock* const clock_;
  LoraRegistry loras_;
  Scheduler scheduler_;

  // A request's sequences: sequence ids (sequence 0's is the request's), n, how many ended.
  struct RequestState {
    uint32_t n = 1;
    uint32_t finished = 0;
    std::vector<RequestId> seqs;
  };

  RequestId next_id_ = 1;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> sequences_;  // by sequence id
  std::unordered_map<RequestId, RequestState> requests_;                // by request id
  size_t held_ = 0;  // sequences with held set
  // Requests to end (cancelled, or a sibling failed), applied at the start of the next step.
  std::vector<std::pair<RequestId, FinishReason>> ending_;
  std::vector<RequestId> finished_;   // sequences reported this step; erased at its end

  // Per step scratch: the backend batch (its block tables are the KV manager's) and the
  // sequence of each of its rows (for the batch's mask filler).
  backend::StepBatch step_batch_;
  std::vector<Sequence*> step_seqs_;
  backend::StepOutput step_output_;

  EngineCounters counters_;
  StepReport last_step_;
  double prefill_rate_ = 0;  // tokens/s, exponentially smoothed
  double decode_rate_ = 0;
  double step_s_ = 0;        // step duration, exponentially smoothed (predicted wait)
};

}  // namespace kvfleet::engine
