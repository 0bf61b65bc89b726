#include "worker/engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/check.h"
#include "common/log.h"

namespace kvfleet::engine {

Status SchedulerOptions::Validate(uint32_t block_size) const {
  if (max_num_tokens == 0 || max_num_tokens % block_size != 0) {
    return InvalidArgument("max_num_tokens (" + std::to_string(max_num_tokens) +
                           ") must be a positive multiple of the block size " + std::to_string(block_size));
  }
  if (max_batch_size == 0) return InvalidArgument("max_batch_size must be >= 1");
  if (!std::isfinite(max_step_ms) || (max_step_ms != 0 && (max_step_ms < 1 || max_step_ms > 60'000))) {
    return InvalidArgument("max_step_ms (" + std::to_string(max_step_ms) +
                           ") must be 0 (no bound) or between 1 and 60000 ms");
  }
  if (!std::isfinite(max_step_over_decodes) ||
      (max_step_over_decodes != 0 && (max_step_over_decodes < 1 || max_step_over_decodes > 100))) {
    return InvalidArgument("max_step_over_decodes (" + std::to_string(max_step_over_decodes) +
                           ") must be 0 (none) or between 1 and 100");
  }
  if (!std::isfinite(max_capped_wait_ms) || max_capped_wait_ms < 0) {
    return InvalidArgument("max_capped_wait_ms (" + std::to_string(max_capped_wait_ms) + ") must be finite and >= 0");
  }
  for (double c : {step_prior.base_us, step_prior.prefill_step_us, step_prior.prefill_token_us,
                   step_prior.decode_seq_us, step_prior.kv_token_us, step_prior.prefill_pair_us}) {
    if (!std::isfinite(c) || c < 0) return InvalidArgument("step_prior coefficients must be finite and >= 0");
  }
  return Status::Ok();
}

Scheduler::Scheduler(const SchedulerOptions& options, std::string model_name, kv::KvCacheManager* kv,
                     LoraRegistry* loras)
    : options_(options), model_name_(std::move(model_name)), kv_(kv), loras_(loras), step_model_(options.step_prior) {}

void Scheduler::Enqueue(Sequence* seq) {
  seq->state = SequenceState::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::EnqueueFront(Sequence* seq) {
  seq->state = SequenceState::kWaiting;
  waiting_.push_front(seq);
}

void Scheduler::Register(Sequence* seq) {
  kv::SequenceSpec spec;
  spec.prompt = seq->tokens;  // after a dropped registration: prompt + generated so far
  spec.model = model_name_;
  spec.lora = seq->request.lora;
  spec.cache_salt = seq->request.cache_salt;
  spec.retention = seq->request.retention;
  // Prompt logprobs need every prompt position's logits: computed, not reused, until known.
  spec.match_cached = !seq->request.sampling.prompt_logprobs || seq->prompt_logprobs_sent ||
                      seq->prompt_logprobs.size() + 1 >= seq->prompt_len;
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

ScheduledBatch Scheduler::Schedule(TimeNs now) {
  ScheduledBatch batch;
  uint32_t budget = options_.max_num_tokens;
  auto add = [&](Sequence* seq, uint32_t n) {
    const uint32_t start = seq->num_computed;
    bool decode = seq->num_uncomputed() == 1 && seq->num_generated() > 0;
    batch.seqs.push_back(ScheduledSeq{seq, start, n, n == seq->num_uncomputed(), decode});
    batch.num_tokens += n;
    if (decode) {
      ++batch.decode_seqs;
      batch.shape.AddDecode(start + 1);
    } else {
      batch.prefill_tokens += n;
      batch.shape.AddPrefill(start, n);
    }
    budget -= n;
  };
  // 1. Decodes (and prompts with one token left after a prefix hit).
  for (Sequence* seq : running_) {
    if (budget > 0 && seq->num_uncomputed() == 1) add(seq, 1);
  }
  // The bound protects the decodes of this step; a step without any runs at full budget.
  const bool capped = options_.max_step_over_decodes > 0 && !PromptOverdue(now);
  const bool bounded = (options_.max_step_ms > 0 || capped) && batch.decode_seqs > 0;
  const double target_us = bounded ? StepTargetUs(batch.shape, capped) : 0;
  bool chunked = false;  // a prefill chunk (not a one-token rest) is in the step
  // 1b. Decode role: a prompt with at most a block left to compute (a split's pulled prompt)
  // goes with the decodes, not behind the prompts the cap holds back.
  if (admits_nearly_cached_ahead()) AdmitNearlyCached(budget, add);
  // 1c. A prompt held while its prefix was pulled keeps its arrival place: the prompts admitted
  // during the pull came after it. Behind them, a pulled prompt of a few tokens waited for whole
  // long prefills that arrived during its 30 ms pull (a mock fleet: 0.4 s first tokens for pulls
  // predicted at 0.06-0.09 s).
  AdmitPulledInPlace();
  // The chunk `seq` gets now, 0 when the budget or the bound leaves nothing.
  auto chunk = [&](Sequence* seq) -> uint32_t {
    const uint32_t max_n = std::min(seq->num_uncomputed(), budget);
    uint32_t n = max_n;
    bool cut = false;
    if (bounded && max_n > 0) n = BoundedChunk(batch.shape, seq->num_computed, max_n, target_us, !chunked, &cut);
    if (n < seq->num_uncomputed()) batch.prefill_limited = true;
    batch.time_bounded |= cut;
    return n;
  };
  // 2. Unfinished prefills, oldest first; one that gets nothing holds back the younger.
  for (Sequence* seq : running_) {
    if (seq->num_uncomputed() <= 1) continue;
    if (admits_nearly_cached_ahead() && seq->num_uncomputed() <= kv_->block_size()) continue;  // 1b's
    const uint32_t n = chunk(seq);
    if (n == 0) break;
    add(seq, n);
    chunked = true;
  }
  // 3. Admissions. Past an adapter sequence that cannot get a slot, only base-model
  // sequences are admitted (see the header); `next` is the first not yet considered.
  bool lora_blocked = false;
  size_t next = 0;
  while (next < waiting_.size() && running_.size() < options_.max_batch_size) {
    Sequence* seq = waiting_[next];
    if (seq->held) {  // its prefix is being pulled: the ones behind it go first
      ++next;
      continue;
    }
    if (budget == 0) {
      batch.prefill_limited = true;
      break;
    }
    if (bounded && chunked &&
        step_model_.PredictUs(batch.shape.WithPrefill(0, kv_->block_size())) > target_us) {
      // Not even a block of a new prompt fits: admit it when it can start.
      batch.prefill_limited = batch.time_bounded = true;
      break;
    }
    const std::string& lora = seq->request.lora;
    if (!lora.empty()) {
      KVF_CHECK(loras_ != nullptr) << "a sequence with an adapter, and no LoRA registry";
      if (lora_blocked || !loras_->CanAcquire(lora)) {
        lora_blocked = true;
        ++next;
        continue;
      }
      auto slot = loras_->Acquire(lora);
      if (!slot.ok()) {
        Logger("engine")->error("request {}: {}", seq->id, slot.status().ToString());
        waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
        if (seq->kv_registered) kv_->Release(seq->kv_id);
        seq->kv_registered = false;
        batch.unfittable.push_back(seq);
        continue;
      }
      seq->lora_slot = *slot;
    }
    if (!TryAdmit(seq)) {
      ReleaseLora(seq);
      if (running_.empty() && kv_->live_imports() == 0) {
        // Nothing holds blocks and it still does not fit: it never will.
        waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
        kv_->Release(seq->kv_id);
        seq->kv_registered = false;
        batch.unfittable.push_back(seq);
        continue;
      }
      batch.kv_short = true;
      break;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(next));
    const uint32_t n = chunk(seq);
    if (n == 0) break;  // admitted (it holds its blocks); it starts next step
    add(seq, n);
    if (seq->num_uncomputed() > 1) chunked = true;
  }
  batch.predicted_us = step_model_.PredictUs(batch.shape);
  return batch;
}

template <typename Add>
void Scheduler::AdmitNearlyCached(uint32_t budget, const Add& add) {
  const uint32_t block = kv_->block_size();
  for (Sequence* seq : running_) {
    const uint32_t left = seq->num_uncomputed();
    if (left > 1 && left <= block && left <= budget) {
      add(seq, left);
      budget -= left;
    }
  }
  for (size_t i = 0; i < waiting_.size() && running_.size() < options_.max_batch_size;) {
    Sequence* seq = waiting_[i];
    if (seq->held || seq->admitted_once || !seq->request.lora.empty()) {
      ++i;
      continue;
    }
    if (!seq->kv_registered) Register(seq);
    const uint32_t left = seq->num_tokens() - std::min(seq->num_tokens() - 1, kv_->Match(seq->kv_id).cached_tokens());
    if (left > block || left > budget || !TryAdmit(seq)) {
      ++i;
      continue;
    }
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    const uint32_t n = std::min(seq->num_uncomputed(), budget);
    add(seq, n);
    budget -= n;
  }
}

void Scheduler::AdmitPulledInPlace() {
  for (size_t i = 0; i < waiting_.size() && running_.size() < options_.max_batch_size;) {
    Sequence* seq = waiting_[i];
    auto later = [seq](const Sequence* r) { return r->num_uncomputed() > 1 && r->arrival > seq->arrival; };
    if (!seq->was_held || seq->held || seq->admitted_once || !seq->request.lora.empty() ||
        std::none_of(running_.begin(), running_.end(), later)) {
      ++i;
      continue;
    }
    if (!TryAdmit(seq)) return;  // the cache is full: step 3 admits in arrival order
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    running_.pop_back();  // TryAdmit appended it
    running_.insert(std::find_if(running_.begin(), running_.end(), later), seq);
  }
}

uint32_t Scheduler::BoundedChunk(const StepShape& shape, uint32_t start, uint32_t max_n, double target_us,
                                 bool guarantee, bool* cut) const {
  auto fits = [&](uint32_t n) { return step_model_.PredictUs(shape.WithPrefill(start, n)) <= target_us; };
  if (fits(max_n)) return max_n;
  *cut = true;
  // The model is monotone in n (no coefficient is negative): the largest n that fits.
  uint32_t lo = 0, hi = max_n;  // fits(lo) or lo == 0; !fits(hi)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  const uint32_t block = kv_->block_size();
  const uint32_t end = (start + lo) / block * block;  // the chunk ends on a block boundary
  uint32_t n = end > start ? end - start : 0;
  if (guarantee) {
    // At least one block, ending on a boundary: [B, 2B) tokens from an unaligned start.
    const uint32_t progress = ((start + block) / block) * block - start + (start % block == 0 ? 0 : block);
    n = std::max(n, std::min(progress, max_n));
  }
  return n;
}

double Scheduler::StepTargetUs(const StepShape& decodes, bool capped) const {
  const double decodes_us = step_model_.PredictUs(decodes);
  double target = std::numeric_limits<double>::infinity();
  if (options_.max_step_ms > 0) target = std::max(options_.max_step_ms * 1000, config::kMinStepOverDecodes * decodes_us);
  if (capped) target = std::min(target, options_.max_step_over_decodes * decodes_us);
  return target;
}

bool Scheduler::PromptOverdue(TimeNs now) const {
  if (now == 0 || options_.max_capped_wait_ms <= 0) return false;
  const auto limit = static_cast<TimeNs>(options_.max_capped_wait_ms * static_cast<double>(kNsPerMs));
  for (const Sequence* seq : running_) {
    if (seq->num_uncomputed() > 1 && now - seq->arrival > limit) return true;
  }
  for (const Sequence* seq : waiting_) {  // oldest first; a held one waits for its pull
    if (!seq->held) return now - seq->arrival > limit;
  }
  return false;
}

void Scheduler::ObserveStep(const ScheduledBatch& batch, DurationNs duration) {
  step_model_.Observe(batch.shape, duration);
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

void Scheduler::ReleaseLora(Sequence* seq) {
  if (seq->lora_slot < 0) return;
  loras_->Release(seq->request.lora);
  seq->lora_slot = -1;
}

void Scheduler::Preempt(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  ReleaseLora(seq);
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
    ReleaseLora(seq);
  } else {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  if (seq->kv_registered) kv_->Release(seq->kv_id);
  seq->kv_registered = false;
}

Status Scheduler::CheckInvariants() const {
  if (running_.size() > options_.max_batch_size) return Internal("invariant 2: more running than max_batch_size");
  uint64_t lora_holders = 0;
  for (const Sequence* s : running_) {
    if ((s->lora_slot >= 0) != !s->request.lora.empty()) {
      return Internal("invariant 4: running request " + std::to_string(s->id) + " and its adapter slot disagree");
    }
    lora_holders += s->lora_slot >= 0;
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
  if (loras_ != nullptr) KVF_RETURN_IF_ERROR(loras_->CheckInvariants(lora_holders));
  for (const Sequence* s : waiting_) {
    if (s->state != SequenceState::kWaiting) return Internal("invariant 1: a waiting sequence is not kWaiting");
    if (s->lora_slot >= 0) return Internal("invariant 4: waiting request " + std::to_string(s->id) + " holds an adapter slot");
    if (s->kv_registered && kv_->IsAllocated(s->kv_id)) {
      return Internal("invariant 1: waiting request " + std::to_string(s->id) + " holds KV blocks");
    }
  }
  return Status::Ok();
}

}  // namespace kvfleet::engine
