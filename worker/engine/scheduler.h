// Scheduler: which sequences run in the next step, and how many tokens each computes
// (vLLM's continuous batching with chunked prefill, nano-vllm's shape).
//
// Each step has a budget of max_num_tokens tokens and max_batch_size running sequences:
//   1. Decode first: every running sequence with one uncomputed token gets it.
//   2. Then running sequences still prefilling (a long prompt, or a recompute after
//      preemption) get chunks, oldest first.
//   3. Then waiting sequences are admitted, in order, while the budget, the batch size and
//      the KV cache allow: Match (prefix hits skip their tokens), CanAllocate, Allocate.
//      Admission stops at the first one that does not fit, so a big request is not starved
//      by smaller ones behind it.
// KV memory is the KV cache manager's: Allocate reclaims evictable cached blocks by itself.
// When a running sequence cannot get a slot for its next token (MakeRoomToAppend), the
// scheduler preempts the running request with the lowest retention priority, the newest
// on ties, and requeues it at the front of the waiting queue. Its full blocks stay in the
// reuse tree, so its recompute is mostly prefix hits. Memory pressure never aborts.
//
// Thread safety: thread-compatible; owned by the engine thread.
//
// Invariants (CheckInvariants):
//   1. A sequence is in waiting or running, never both; its state says which.
//   2. running.size() <= max_batch_size.
//   3. A running sequence is registered with the KV manager, which has it allocated, and
//      num_computed equals the manager's NumComputedTokens.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/engine/sequence.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::engine {

struct SchedulerOptions {
  uint32_t max_num_tokens = 8192;  // tokens computed per step, all sequences; a multiple of B
  uint32_t max_batch_size = 256;   // running sequences
  Status Validate(uint32_t block_size) const;
};

// One sequence's share of a step.
struct ScheduledSeq {
  Sequence* seq = nullptr;
  uint32_t start = 0;       // first token computed (== seq->num_computed when scheduled)
  uint32_t num_tokens = 0;  // tokens computed, >= 1
  bool sample = false;      // the chunk reaches the last token: sample the next one
  bool decode = false;      // a decode step (one token of a sequence past its prefill)
};

struct ScheduledBatch {
  std::vector<ScheduledSeq> seqs;  // decodes first, then prefill chunks
  uint32_t num_tokens = 0;
  uint32_t prefill_tokens = 0;
  uint32_t decode_seqs = 0;
  // Waiting requests that can never fit: the cache is too small even with nothing else
  // running. The engine ends them with an error.
  std::vector<Sequence*> unfittable;
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  // REQUIRES: options.Validate(kv->block_size()).ok(); kv outlives the scheduler.
  Scheduler(const SchedulerOptions& options, std::string model_name, kv::KvCacheManager* kv);

  // A new request joins the back of the waiting queue.
  void Enqueue(Sequence* seq);
  ScheduledBatch Schedule();

  // Ensures `seq` (running) can append one token, preempting running requests (lowest
  // retention priority, newest on ties) until it can. Returns false when `seq` itself was
  // the one preempted. Preempted sequences are added to *preempted.
  bool MakeRoomToAppend(Sequence* seq, std::vector<Sequence*>* preempted);

  // Takes a sequence out (finished or cancelled) and releases its KV blocks; its stored
  // blocks stay reusable.
  void Remove(Sequence* seq);

  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }
  uint64_t num_preemptions() const { return num_preemptions_; }

  Status CheckInvariants() const;

 private:
  // Admits the head of the waiting queue when the cache allows; false otherwise.
  bool TryAdmit(Sequence* seq);
  void Register(Sequence* seq);
  void Preempt(Sequence* seq);
  Sequence* PickVictim() const;

  const SchedulerOptions options_;
  const std::string model_name_;
  kv::KvCacheManager* const kv_;
  std::deque<Sequence*> waiting_;   // front: preempted (oldest first), then arrival order
  std::vector<Sequence*> running_;  // admission order
  uint64_t num_preemptions_ = 0;
};

}  // namespace kvfleet::engine
