#include "worker/engine/engine.h"

#include <algorithm>

#include "common/check.h"
#include "common/log.h"
#include "worker/backend/sampler.h"
#include "worker/engine/predicted_wait.h"

namespace kvfleet::engine {

namespace config {
// Weight of the newest step in the smoothed prefill/decode rates the router sees: about
// the last ten steps count, so a rate follows a load change within a second.
constexpr double kRateSmoothing = 0.1;
// A step measures the prefill rate only when at least this share of its token budget went
// to prompt tokens. The router divides queued prefill by this rate, so it must say how fast
// a queue of prompts drains; a step with a few prompt tokens beside many decodes says how
// little prefill there was, not how fast it goes. Measured on every step, an idle mock
// worker reported ~1,000 tok/s beside busy ones at ~30,000, looked 30x slower to the
// router, got no work and so never measured again (2026-11-22, 8 mock workers). A step
// whose prefill the budget or the step-time bound cut short (more was ready) measures too:
// under the bound, its small chunks are how fast the queue drains.
constexpr double kMinPrefillShareForRate = 0.5;
}  // namespace config

Status EngineOptions::Validate(uint32_t block_size) const {
  KVF_RETURN_IF_ERROR(scheduler.Validate(block_size));
  if (model_name.empty()) return InvalidArgument("the model name is empty");
  if (limits.max_context < 2) return InvalidArgument("max_context must be >= 2");
  return Status::Ok();
}

Engine::Engine(const EngineOptions& options, backend::ModelBackend* backend, kv::KvCacheManager* kv,
               const Clock* clock)
    : options_(options),
      backend_(backend),
      kv_(kv),
      clock_(clock),
      loras_(backend, clock, options.max_lora_rank),
      scheduler_(options.scheduler, options.model_name, kv, &loras_) {
  KVF_CHECK(options.Validate(kv->block_size()).ok()) << options.Validate(kv->block_size()).ToString();
  step_batch_.fill_token_bitmask = [this](size_t i, std::span<uint32_t> mask) { FillMask(step_seqs_[i], mask); };
}

Engine::~Engine() = default;

Result<RequestId> Engine::Add(GenerateRequest request, TimeNs arrival) {
  KVF_RETURN_IF_ERROR(ValidateRequest(request, options_.limits));
  KVF_RETURN_IF_ERROR(CheckFits(request));
  if (request.sampling.structured.kind != StructuredOutput::Kind::kNone && request.grammar == nullptr) {
    return InvalidArgument("response_format: this worker does not offer constrained decoding (structured outputs)");
  }
  if (request.grammar != nullptr && !backend_->applies_token_bitmask()) {
    return InvalidArgument("response_format: the " + std::string(backend_->name()) +
                           " backend does not apply token masks (constrained decoding)");
  }
  if (!request.lora.empty() && !loras_.Has(request.lora)) {
    return NotFound("unknown LoRA adapter '" + request.lora + "': this worker serves " +
                    (loras_.size() == 0 ? std::string("none") : std::to_string(loras_.size()) + " others"));
  }
  const uint32_t n = request.sampling.n;
  if (scheduler_.waiting().size() + n > options_.limits.max_queued) {
    return ResourceExhausted("the queue is full (" + std::to_string(scheduler_.waiting().size()) + " of " +
                             std::to_string(options_.limits.max_queued) + " sequences waiting; this request has " +
                             std::to_string(n) + ")");
  }
  RequestId id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(request), arrival);
  scheduler_.Enqueue(seq.get());
  sequences_.emplace(id, std::move(seq));
  requests_.emplace(id, RequestState{n, 0, {id}});
  ++counters_.requests_added;
  return id;
}

// The n sequences run side by side once forked: their blocks must fit the cache together
// (a single sequence that can never fit is ended by the scheduler, as before).
Status Engine::CheckFits(const GenerateRequest& request) const {
  const uint32_t n = request.sampling.n;
  if (n == 1) return Status::Ok();
  if (n > options_.scheduler.max_batch_size || n > options_.limits.max_queued) {
    // Refused as invalid, not as overloaded: no worker like this one will ever take it.
    return InvalidArgument("n=" + std::to_string(n) + " exceeds this worker's max batch size (" +
                           std::to_string(options_.scheduler.max_batch_size) + ") or queue bound (" +
                           std::to_string(options_.limits.max_queued) + ") in sequences");
  }
  const uint64_t B = kv_->block_size(), len = request.prompt.size();
  const uint64_t shared = kv_->reuse_enabled() ? (len - 1) / B : 0;  // what the forks match
  const uint64_t own = (len + 1 + B - 1) / B - shared;  // each sequence's rest, its first token's slot included
  const uint64_t need = shared + n * own;
  for (const kv::PoolLayout& pool : kv_->pools()) {
    if (pool.windowed() || need <= pool.device_blocks) continue;
    return InvalidArgument("n=" + std::to_string(n) + " sequences of a " + std::to_string(len) + "-token prompt need " +
                           std::to_string(need) + " KV blocks at once (" + std::to_string(shared) + " shared, " +
                           std::to_string(own) + " each); this worker's cache holds " +
                           std::to_string(pool.device_blocks));
  }
  return Status::Ok();
}

Status Engine::AddLora(std::shared_ptr<const model::LoraAdapter> adapter) { return loras_.Add(std::move(adapter)); }

Status Engine::RemoveLora(const std::string& name) {
  if (!loras_.Has(name)) return NotFound("unknown LoRA adapter '" + name + "'");
  size_t users = 0;
  for (const auto& [id, seq] : sequences_) users += !seq->finished && seq->request.lora == name;
  if (users > 0) {
    return FailedPrecondition("LoRA adapter '" + name + "' is in use by " + std::to_string(users) +
                              " waiting or running sequences; unload it when they finish");
  }
  return loras_.Remove(name);
}

void Engine::Cancel(RequestId id) {
  if (requests_.contains(id)) ending_.emplace_back(id, FinishReason::kCancelled);
}

void Engine::Hold(RequestId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second->held || it->second->finished || it->second->admitted_once) return;
  it->second->held = it->second->was_held = true;
  ++held_;
}

void Engine::LowerRetention(RequestId id, uint8_t priority) {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second->kv_registered || it->second->admitted_once) return;
  kv::KvCacheRetentionConfig& r = it->second->request.retention;
  r.token_ranges.push_back(kv::TokenRangeRetention{0, std::nullopt, priority, std::nullopt});
  if (r.decode_priority == kv::kDefaultPriority && !r.decode_duration) r.decode_priority = priority;
}

bool Engine::AwaitsAdmission(RequestId id) const {
  auto it = sequences_.find(id);
  return it != sequences_.end() && !it->second->finished && !it->second->admitted_once;
}

void Engine::Unhold(RequestId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || !it->second->held) return;
  it->second->held = false;
  --held_;
}

void Engine::CancelAll() {
  for (const auto& [id, request] : requests_) ending_.emplace_back(id, FinishReason::kCancelled);
}

// ---- The loop body ------------------------------------------------------------------

std::vector<RequestOutput> Engine::Step() {
  const TimeNs start = clock_->Now();
  std::vector<RequestOutput> outputs;
  ApplyCancellations(&outputs);

  ScheduledBatch batch = scheduler_.Schedule(start);
  for (Sequence* seq : batch.unfittable) Finish(seq, FinishReason::kError, &outputs);

  std::vector<TokenId> sampled;
  uint32_t preemptions = 0;
  bool executed = false;
  if (!batch.empty()) {
    Status st = Execute(batch, &sampled);
    if (st.ok()) {
      Postprocess(batch, sampled, &outputs, &preemptions);
      executed = true;
    } else {
      Logger("engine")->error("step failed, ending its {} requests: {}", batch.seqs.size(), st.ToString());
      for (const ScheduledSeq& s : batch.seqs) Finish(s.seq, FinishReason::kError, &outputs);
    }
  }

  StepReport report;
  report.duration = clock_->Now() - start;
  if (executed) scheduler_.ObserveStep(batch, report.duration);  // the step-time model learns
  report.time_bounded = batch.time_bounded;
  report.prefill_limited = batch.prefill_limited;
  report.kv_short = batch.kv_short;
  report.batch_sequences = static_cast<uint32_t>(batch.seqs.size());
  report.batch_tokens = batch.num_tokens;
  report.prefill_tokens = batch.prefill_tokens;
  report.decode_sequences = batch.decode_seqs;
  report.preemptions = preemptions;
  report.finished = static_cast<uint32_t>(finished_.size());
  ++counters_.steps;
  counters_.preemptions += preemptions;
  UpdateRates(report);
  for (RequestId id : finished_) sequences_.erase(id);
  finished_.clear();
  report.load = Load();
  last_step_ = report;
  return outputs;
}

// ---- Execute ------------------------------------------------------------------------

Status Engine::Execute(const ScheduledBatch& batch, std::vector<TokenId>* sampled) {
  const auto pools = backend_->pools();
  step_batch_.seqs.clear();
  step_seqs_.clear();
  for (const ScheduledSeq& s : batch.seqs) {
    const Sequence& seq = *s.seq;
    step_seqs_.push_back(s.seq);
    backend::SequenceStep& step = step_batch_.seqs.emplace_back();
    step.request_id = seq.id;
    step.tokens = std::span<const TokenId>(seq.tokens).subspan(s.start, s.num_tokens);
    step.start_position = s.start;
    step.sample = s.sample;
    step.sampling = &seq.request.sampling;
    step.seed = seq.seed;
    // Prompt logprobs until they went out (decode steps then keep their CUDA graphs).
    step.prompt_logprobs = seq.request.sampling.prompt_logprobs && !seq.prompt_logprobs_sent;
    step.rng_counter = seq.num_generated();
    step.history = seq.tokens;
    step.prompt_len = seq.prompt_len;
    step.context_end = seq.prompt_len;  // StreamingLLM's dense context phase (pools that have one)
    step.lora_slot = seq.lora_slot;
    // Constrained: the backend asks for the mask once the forward pass is queued (FillMask).
    step.late_token_bitmask = s.sample && seq.matcher.has_value();
    // The backend reads a linear table (kNoBlock where a window dropped the block); the KV
    // manager keeps one per sequence, so a long streamed sequence costs no copy per step.
    for (uint32_t pool = 0; pool < pools.size(); ++pool) step.block_tables.push_back(kv_->View(seq.kv_id, pool).linear);
  }
  KVF_RETURN_IF_ERROR(backend_->Execute(step_batch_, &step_output_));
  if (step_output_.tokens.size() != batch.seqs.size()) {
    return Internal("the backend returned " + std::to_string(step_output_.tokens.size()) + " tokens for " +
                    std::to_string(batch.seqs.size()) + " sequences");
  }
  *sampled = step_output_.tokens;
  // Prompt logprobs of positions not yet known (a recompute after preemption repeats some).
  for (size_t i = 0; i < batch.seqs.size() && i < step_output_.prompt_logprobs.size(); ++i) {
    Sequence* seq = batch.seqs[i].seq;
    if (seq->prompt_logprobs_sent) continue;
    const uint32_t first = batch.seqs[i].start;  // entries are positions first, first + 1, ...
    auto& got = step_output_.prompt_logprobs[i];
    for (size_t k = 0; k < got.size(); ++k) {
      if (first + k == seq->prompt_logprobs.size()) seq->prompt_logprobs.push_back(std::move(got[k]));
    }
  }
  return Status::Ok();
}

// ---- Postprocess --------------------------------------------------------------------

void Engine::Postprocess(const ScheduledBatch& batch, const std::vector<TokenId>& sampled,
                         std::vector<RequestOutput>* outputs, uint32_t* preemptions) {
  // 1. The KV of every computed token is written: full blocks become reusable.
  for (const ScheduledSeq& s : batch.seqs) {
    s.seq->num_computed = s.start + s.num_tokens;
    kv_->Commit(s.seq->kv_id, s.seq->num_computed);
  }
  // 2. Sampled tokens: stop conditions, then a slot for the next step.
  const TimeNs now = clock_->Now();
  std::vector<Sequence*> preempted;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    Sequence* seq = s.seq;
    if (!s.sample) continue;
    KVF_CHECK(sampled[i] != backend::kNoToken) << "the backend did not sample request " << seq->id;
    if (seq->grammar_end) {  // the grammar allowed no more text: the draw is dropped
      // Unforked siblings end with it: the same grammar from the start ends them alike.
      Finish(seq, GrammarEnd(*seq), outputs);
      continue;
    }
    seq->tokens.push_back(sampled[i]);
    if (seq->request.sampling.logprobs >= 0 && i < step_output_.logprobs.size()) {
      seq->logprobs.push_back(std::move(step_output_.logprobs[i]));
    }
    ++counters_.generated_tokens;
    if (seq->first_token_time == 0) seq->first_token_time = now;
    if (seq->forks_left > 0) Fork(seq);
    FinishReason stop = seq->matcher ? FollowGrammar(seq) : StopReason(*seq);
    if (stop != FinishReason::kNone) {
      Finish(seq, stop, outputs);
      continue;
    }
    if (seq->state == SequenceState::kWaiting) {
      // Preempted earlier in this loop, before its token arrived: the KV manager's copy of
      // its tokens is one short, so register it afresh on readmission.
      if (seq->kv_registered) kv_->Release(seq->kv_id);
      seq->kv_registered = false;
    } else if (scheduler_.MakeRoomToAppend(seq, &preempted)) {
      Status st = kv_->Append(seq->kv_id, std::span<const TokenId>(&seq->tokens.back(), 1));
      KVF_CHECK(st.ok()) << "Append after CanAppend: " << st.ToString();
    }
  }
  *preemptions = static_cast<uint32_t>(preempted.size());
  // 3. News for the clients: tokens generated this step, by the unfinished requests.
  for (const ScheduledSeq& s : batch.seqs) {
    Sequence* seq = s.seq;
    if (s.sample && !seq->finished && seq->num_generated() > seq->num_streamed) {
      outputs->push_back(MakeOutput(seq, FinishReason::kNone));
    }
  }
}

FinishReason Engine::StopReason(const Sequence& seq) const {
  const TokenId last = seq.tokens.back();
  const SamplingParams& s = seq.request.sampling;
  if (!s.ignore_eos && std::count(options_.eos_token_ids.begin(), options_.eos_token_ids.end(), last)) {
    return FinishReason::kStop;
  }
  if (std::count(s.stop_token_ids.begin(), s.stop_token_ids.end(), last)) return FinishReason::kStop;
  if (seq.num_generated() >= s.max_tokens) return FinishReason::kLength;
  if (seq.num_tokens() >= options_.limits.max_context) return FinishReason::kLength;
  return FinishReason::kNone;
}

void Engine::FillMask(Sequence* seq, std::span<uint32_t> mask) {
  const TimeNs start = clock_->Now();
  seq->matcher->FillNextTokenBitmask(mask);
  // The grammar's stop ids are the model's eos ids (or none). A document that is complete
  // and allows no more text ends without sampling an end token (with no stop ids, as the
  // byte vocabulary, it could not), and a matcher with nothing allowed is a broken grammar:
  // either way this step's draw is dropped (Postprocess), so the sampler gets any one token.
  bool other = false;
  for (size_t w = 0; w < mask.size() && !other; ++w) {
    uint32_t bits = mask[w];
    for (TokenId eos : options_.eos_token_ids) {
      if (eos / 32 == w) bits &= ~(1u << (eos % 32));
    }
    other = bits != 0;
  }
  if (!other) {
    seq->grammar_end = true;
    if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; })) mask[0] = 1;
  }
  ++counters_.masks_filled;
  counters_.mask_fill_ns += static_cast<uint64_t>(clock_->Now() - start);
}

FinishReason Engine::GrammarEnd(const Sequence& seq) const {
  if (seq.matcher->CanTerminate()) return FinishReason::kStop;
  Logger("engine")->error("request {}: its grammar allows no token after {} generated", seq.request_id,
                          seq.num_generated());
  return FinishReason::kError;
}

// The grammar's end wins over ignore_eos: a stop token the grammar accepts ends the document.
FinishReason Engine::FollowGrammar(Sequence* seq) {
  const TokenId token = seq->tokens.back();
  if (!seq->matcher->AcceptToken(static_cast<int32_t>(token))) {
    Logger("engine")->error("request {}: the backend sampled token {}, which its grammar does not allow ({})",
                            seq->request_id, token, seq->matcher->status().ToString());
    return FinishReason::kError;
  }
  if (seq->matcher->IsTerminated()) return FinishReason::kStop;
  return StopReason(*seq);
}

void Engine::Fork(Sequence* seq) {
  RequestState& request = requests_.at(seq->request_id);
  // Front of the queue, in index order: they need the blocks sequence 0 holds now.
  std::vector<Sequence*> forks;
  for (uint32_t index = request.n - seq->forks_left; index < request.n; ++index) {
    const RequestId id = next_id_++;
    auto fork = std::make_unique<Sequence>(id, *seq, index);
    forks.push_back(fork.get());
    request.seqs.push_back(id);
    sequences_.emplace(id, std::move(fork));
  }
  for (auto it = forks.rbegin(); it != forks.rend(); ++it) scheduler_.EnqueueFront(*it);
  seq->forks_left = 0;
}

void Engine::ApplyCancellations(std::vector<RequestOutput>* outputs) {
  std::vector<std::pair<RequestId, FinishReason>> ending;
  ending.swap(ending_);
  for (const auto& [id, reason] : ending) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    if (reason == FinishReason::kCancelled) ++counters_.requests_cancelled;
    const std::vector<RequestId> seqs = it->second.seqs;  // Finish may erase the request
    for (RequestId s : seqs) {
      auto seq = sequences_.find(s);  // one that finished in an earlier step is gone
      if (seq != sequences_.end()) Finish(seq->second.get(), reason, outputs);
    }
  }
  // Finishing siblings for the same reason queues nothing new.
  std::erase_if(ending_, [&](const auto& e) { return !requests_.contains(e.first); });
}

void Engine::Finish(Sequence* seq, FinishReason reason, std::vector<RequestOutput>* outputs) {
  if (seq->finished) return;
  if (seq->held) {
    seq->held = false;
    --held_;
  }
  scheduler_.Remove(seq);
  finished_.push_back(seq->id);
  seq->finished = true;
  RequestState& request = requests_.at(seq->request_id);
  RequestOutput out = MakeOutput(seq, reason);
  out.last = ++request.finished == request.n;
  outputs->push_back(std::move(out));
  // Sequence 0 ended before its prompt was computed (cancel, error): the sequences it never
  // forked end with it, without tokens.
  for (uint32_t index = request.n - seq->forks_left; index < request.n; ++index) {
    RequestOutput unforked;
    unforked.id = seq->request_id;
    unforked.index = index;
    unforked.finish = reason;
    unforked.usage.prompt_tokens = seq->prompt_len;
    unforked.usage.cached_device_tokens = seq->cached_device_tokens;
    unforked.usage.cached_host_tokens = seq->cached_host_tokens;
    unforked.last = ++request.finished == request.n;
    outputs->push_back(std::move(unforked));
  }
  seq->forks_left = 0;
  if (request.finished == request.n) {
    requests_.erase(seq->request_id);
    ++counters_.requests_finished;
  } else if (reason == FinishReason::kError) {
    ending_.emplace_back(seq->request_id, FinishReason::kError);  // its siblings fail with it
  }
}

RequestOutput Engine::MakeOutput(Sequence* seq, FinishReason reason) {
  RequestOutput out;
  out.id = seq->request_id;
  out.index = seq->index;
  out.new_tokens.assign(seq->tokens.begin() + seq->prompt_len + seq->num_streamed, seq->tokens.end());
  if (seq->request.sampling.logprobs >= 0) {
    out.logprobs.assign(seq->logprobs.begin() + std::min<size_t>(seq->num_streamed, seq->logprobs.size()),
                        seq->logprobs.end());
  }
  if (seq->request.sampling.prompt_logprobs && !seq->prompt_logprobs_sent && seq->num_generated() > 0) {
    out.prompt_logprobs = std::move(seq->prompt_logprobs);
    seq->prompt_logprobs.clear();
    seq->prompt_logprobs_sent = true;
  }
  seq->num_streamed = seq->num_generated();
  out.finish = reason;
  out.usage.prompt_tokens = seq->prompt_len;
  out.usage.cached_device_tokens = seq->cached_device_tokens;
  out.usage.cached_host_tokens = seq->cached_host_tokens;
  out.usage.completion_tokens = seq->num_generated();
  if (seq->first_token_time != 0) out.usage.time_to_first_token = seq->first_token_time - seq->arrival;
  return out;
}

// ---- Load ---------------------------------------------------------------------------

void Engine::UpdateRates(const StepReport& report) {
  if (report.duration <= 0) return;
  const double seconds = static_cast<double>(report.duration) / kNsPerSec;
  if (report.batch_sequences > 0) {
    step_s_ = step_s_ == 0 ? seconds : step_s_ + config::kRateSmoothing * (seconds - step_s_);
  }
  if (report.prefill_tokens > 0 &&
      (report.prefill_limited ||
       report.prefill_tokens >= config::kMinPrefillShareForRate * options_.scheduler.max_num_tokens)) {
    double rate = report.prefill_tokens / seconds;
    prefill_rate_ = prefill_rate_ == 0 ? rate : prefill_rate_ + config::kRateSmoothing * (rate - prefill_rate_);
  }
  if (report.decode_sequences > 0) {
    double rate = report.decode_sequences / seconds;
    decode_rate_ = decode_rate_ == 0 ? rate : decode_rate_ + config::kRateSmoothing * (rate - decode_rate_);
  }
}

LoadReport Engine::Load() const {
  LoadReport load;
  const uint32_t block_size = kv_->block_size();
  std::vector<uint32_t> running_remaining, waiting_tokens;
  running_remaining.reserve(scheduler_.running().size());
  waiting_tokens.reserve(scheduler_.waiting().size());
  for (const Sequence* seq : scheduler_.running()) {
    if (seq->num_uncomputed() > 1) load.active_prefill_tokens += seq->num_uncomputed();
    if (seq->decoding()) load.active_decode_blocks += (seq->num_tokens() + block_size - 1) / block_size;
    // Tokens it may still generate, to max_tokens or the context limit (an EOS may come sooner).
    const uint32_t max_tokens = seq->request.sampling.max_tokens, max_context = options_.limits.max_context;
    const uint32_t to_length = max_tokens - std::min(seq->num_generated(), max_tokens);
    const uint32_t to_context = max_context - std::min(seq->num_tokens(), max_context);
    const uint32_t remaining = std::max(1u, std::min(to_length, to_context));
    // Its steps after its prefill: a prompt still computing samples its first token with its
    // prefill's last chunk, which the prefill term counts (predicted_wait.h).
    running_remaining.push_back(seq->decoding() ? remaining : remaining - 1);
  }
  for (const Sequence* seq : scheduler_.waiting()) {
    load.active_prefill_tokens += seq->num_tokens();
    waiting_tokens.push_back(seq->num_tokens());
  }
  // Sequences a request of n will fork once its prompt is computed queue behind it: each
  // will compute the prompt's last partial block (engine.h, "n sequences").
  uint32_t unforked = 0;
  auto count_forks = [&](const Sequence* seq) {
    if (seq->forks_left == 0) return;
    const uint32_t tail = seq->prompt_len - (seq->prompt_len - 1) / block_size * block_size;
    unforked += seq->forks_left;
    load.active_prefill_tokens += uint64_t{seq->forks_left} * tail;
    waiting_tokens.insert(waiting_tokens.end(), seq->forks_left, tail);
  };
  for (const Sequence* seq : scheduler_.running()) count_forks(seq);
  for (const Sequence* seq : scheduler_.waiting()) count_forks(seq);
  load.active_requests = static_cast<uint32_t>(scheduler_.running().size());
  load.queued_requests = static_cast<uint32_t>(scheduler_.waiting().size()) + unforked;
  for (int t = 0; t < kNumTiers; ++t) {
    load.free_blocks[t] = kv_->FreeBlocks(static_cast<kv::Tier>(t));
    load.total_blocks[t] = kv_->TotalBlocks(static_cast<kv::Tier>(t));
  }
  load.prefill_tokens_per_second = static_cast<float>(prefill_rate_);
  load.decode_tokens_per_second = static_cast<float>(decode_rate_);
  QueueSnapshot queue;
  queue.prefill_tokens = load.active_prefill_tokens;
  queue.prefill_tokens_per_s = prefill_rate_;
  queue.step_s = step_s_;
  queue.max_batch_size = options_.scheduler.max_batch_size;
  queue.block_size = block_size;
  queue.free_blocks = load.free_blocks[0] / std::max<size_t>(1, backend_->pools().size());
  queue.waiting_tokens = waiting_tokens;
  queue.running_remaining = running_remaining;
  load.predicted_wait_us = static_cast<uint64_t>(PredictedWaitSeconds(queue) * 1e6);
  load.pulled_wait_us =
      static_cast<uint64_t>(PulledWaitSeconds(queue, scheduler_.admits_nearly_cached_ahead()) * 1e6);
  load.resident_loras = loras_.Resident();
  return load;
}

Status Engine::CheckInvariants() const {
  KVF_RETURN_IF_ERROR(scheduler_.CheckInvariants());
  size_t queued = scheduler_.waiting().size() + scheduler_.running().size();
  size_t live = 0;
  for (const auto& [id, request] : requests_) {
    if (request.finished >= request.n) return Internal("invariant 5: request " + std::to_string(id) + " is done");
    for (RequestId s : request.seqs) live += sequences_.contains(s) && !sequences_.at(s)->finished;
  }
  if (live != sequences_.size()) return Internal("invariant 1: a sequence belongs to no live request");
  if (queued != sequences_.size()) {
    return Internal("invariant 1: " + std::to_string(sequences_.size()) + " requests, " + std::to_string(queued) +
                    " waiting or running");
  }
  return kv_->CheckInvariants();
}

}  // namespace kvfleet::engine
