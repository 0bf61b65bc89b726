#include "worker/engine/scheduler.h"

#include <algorithm>

#include "common/check.h"
#include "common/log.h"

namespace kvfleet::engine {

Status SchedulerOptions::Validate(uint32_t block_size) const {
  if (max_num_tokens == 0 || max_num_tokens % block_size != 0) {
    return InvalidArgument("max_num_tokens (" + std::to_string(max_num_tokens) +
                           ") must be a positive multiple of the block size " + std::to_string(block_size));
  }
  if (max_batch_size == 0) return InvalidArgument("max_batch_size must be >= 1");
  return Status::Ok();
}

Scheduler::Scheduler(const SchedulerOptions& options, std::string model_name, kv::KvCacheManager* kv)
    : options_(options), model_name_(std::move(model_name)), kv_(kv) {}

void Scheduler::Enqueue(Sequence* seq) {
  seq->state = SequenceState::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::Register(Sequence* seq) {
  kv::SequenceSpec spec;
  spec.prompt = seq->tokens;  // after a dropped registration: prompt + generated so far
  spec.model = model_name_;
  spec.lora = seq->request.lora;
  spec.cache_salt = seq->request.cache_salt;
  spec.retention = seq->request.retention;
  auto id = kv_->AddSequence(std::move(spec));
  // The engine validated the prompt and the retention before queueing the request.
  KVF_CHECK(id.ok()) << id.status().ToString();
  seq->kv_id = *id;
  seq->kv_registered = true;
}

bool Scheduler::TryAdmit(Sequence* seq) {
  if (!seq->kv_registered) Register(seq);
  if (!kv_->CanAllocate(seq->kv_id)) return false;
  if (!seq->admitted_once) {
    kv::MatchInfo match = kv_->Match(seq->kv_id);
    seq->cached_device_tokens = match.device_tokens + match.partial_tokens;
    seq->cached_host_tokens = match.host_tokens;
  }
  Status st = kv_->Allocate(seq->kv_id);
  KVF_CHECK(st.ok()) << "Allocate after CanAllocate: " << st.ToString();
  seq->admitted_once = true;
  seq->num_computed = kv_->NumComputedTokens(seq->kv_id);
  // The KV manager always leaves the last token to compute, so the step can sample.
  KVF_CHECK_LT(seq->num_computed, seq->num_tokens());
  seq->state = SequenceState::kRunning;
  running_.push_back(seq);
  return true;
}

ScheduledBatch Scheduler::Schedule() {
  ScheduledBatch batch;
  uint32_t budget = options_.max_num_tokens;
  auto add = [&](Sequence* seq) {
    uint32_t n = std::min(seq->num_uncomputed(), budget);
    bool decode = seq->num_uncomputed() == 1 && seq->num_generated() > 0;
    batch.seqs.push_back(ScheduledSeq{seq, seq->num_computed, n, n == seq->num_uncomputed(), decode});
    batch.num_tokens += n;
    if (decode) {
      ++batch.decode_seqs;
    } else {
      batch.prefill_tokens += n;
    }
    budget -= n;
  };
  // 1. Decodes, 2. unfinished prefills: every running sequence, decodes first.
  for (Sequence* seq : running_) {
    if (budget > 0 && seq->num_uncomputed() == 1) add(seq);
  }
  for (Sequence* seq : running_) {
    if (budget > 0 && seq->num_uncomputed() > 1) add(seq);
  }
  // 3. Admissions.
  while (!waiting_.empty() && budget > 0 && running_.size() < options_.max_batch_size) {
    Sequence* seq = waiting_.front();
    if (!TryAdmit(seq)) {
      if (running_.empty()) {
        // Nothing holds blocks and it still does not fit: it never will.
        waiting_.pop_front();
        kv_->Release(seq->kv_id);
        seq->kv_registered = false;
        batch.unfittable.push_back(seq);
        continue;
      }
      break;
    }
    waiting_.pop_front();
    add(seq);
  }
  return batch;
}

Sequence* Scheduler::PickVictim() const {
  Sequence* victim = nullptr;
  for (Sequence* s : running_) {
    if (!victim || s->preemption_priority < victim->preemption_priority ||
        (s->preemption_priority == victim->preemption_priority && s->id > victim->id)) {
      victim = s;
    }
  }
  return victim;
}

void Scheduler::Preempt(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  if (kv_->NumTokens(seq->kv_id) == seq->num_tokens()) {
    kv_->Preempt(seq->kv_id);
  } else {
    // Its newest token was sampled but has no slot: drop the registration and register
    // prompt + generated again on readmission.
    kv_->Release(seq->kv_id);
    seq->kv_registered = false;
  }
  seq->num_computed = 0;
  seq->state = SequenceState::kWaiting;
  ++seq->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(seq);
}

bool Scheduler::MakeRoomToAppend(Sequence* seq, std::vector<Sequence*>* preempted) {
  while (!kv_->CanAppend(seq->kv_id, 1)) {
    Sequence* victim = PickVictim();
    KVF_CHECK(victim != nullptr);
    Logger("engine")->debug("KV cache full: preempting request {} (priority {}, {} tokens)", victim->id,
                            victim->preemption_priority, victim->num_tokens());
    Preempt(victim);
    preempted->push_back(victim);
    if (victim == seq) return false;
  }
  return true;
}

void Scheduler::Remove(Sequence* seq) {
  if (seq->state == SequenceState::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  if (seq->kv_registered) kv_->Release(seq->kv_id);
  seq->kv_registered = false;
}

Status Scheduler::CheckInvariants() const {
  if (running_.size() > options_.max_batch_size) return Internal("invariant 2: more running than max_batch_size");
  for (const Sequence* s : running_) {
    if (s->state != SequenceState::kRunning) return Internal("invariant 1: a running sequence is not kRunning");
    if (std::find(waiting_.begin(), waiting_.end(), s) != waiting_.end()) {
      return Internal("invariant 1: a sequence is both waiting and running");
    }
    if (!s->kv_registered || !kv_->IsAllocated(s->kv_id)) {
      return Internal("invariant 3: running request " + std::to_string(s->id) + " holds no KV blocks");
    }
    if (kv_->NumComputedTokens(s->kv_id) != s->num_computed) {
      return Internal("invariant 3: request " + std::to_string(s->id) + " computed " +
                      std::to_string(s->num_computed) + " tokens, the KV manager says " +
                      std::to_string(kv_->NumComputedTokens(s->kv_id)));
    }
  }
  for (const Sequence* s : waiting_) {
    if (s->state != SequenceState::kWaiting) return Internal("invariant 1: a waiting sequence is not kWaiting");
    if (s->kv_registered && kv_->IsAllocated(s->kv_id)) {
      return Internal("invariant 1: waiting request " + std::to_string(s->id) + " holds KV blocks");
    }
  }
  return Status::Ok();
}

}  // namespace kvfleet::engine
