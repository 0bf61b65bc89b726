// The scheduler's stall bound on its own: a real KV cache manager over simulated memory, a
// step-time model with fixed coefficients (the prior, never fed a measurement), and a
// stand-in for the engine's postprocess that commits each step and appends one token to
// every sequence that sampled.
#include "worker/engine/scheduler.h"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "tests/worker/kv/kv_fixture.h"

namespace kvfleet::engine {
namespace {

constexpr uint32_t kB = 16;
constexpr uint32_t kBudget = 8192;

// 5 ms a step, 1 ms more with prefill, 20 µs a prompt token, 10 µs a decode, 0.05 µs a KV
// token, 1 ns a pair.
constexpr StepCoefficients kFake{5000.0, 1000.0, 20.0, 10.0, 0.05, 0.001};

struct Rig {
  explicit Rig(double max_step_ms, StepCoefficients model = kFake, uint32_t device_blocks = 4096,
               double max_step_over_decodes = 0, double max_capped_wait_ms = 0)
      : kv(kv::testing::SmallConfig(kB, device_blocks)) {
    SchedulerOptions o;
    o.max_num_tokens = kBudget;
    o.max_batch_size = 64;
    o.max_step_ms = max_step_ms;
    o.max_step_over_decodes = max_step_over_decodes;
    o.max_capped_wait_ms = max_capped_wait_ms;
    o.step_prior = model;
    REQUIRE(o.Validate(kB).ok());
    scheduler = std::make_unique<Scheduler>(o, "m", kv.m.get());
  }

  std::vector<TokenId> Fresh(uint32_t n) {
    std::vector<TokenId> t;
    for (uint32_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(next_token_++));
    return t;
  }
  Sequence* Add(std::vector<TokenId> prompt) {
    GenerateRequest r;
    r.prompt = std::move(prompt);
    seqs.push_back(std::make_unique<Sequence>(seqs.size() + 1, std::move(r), 0));
    scheduler->Enqueue(seqs.back().get());
    return seqs.back().get();
  }
  Sequence* Add(uint32_t prompt_len) { return Add(Fresh(prompt_len)); }

  // Schedules a step and completes it as the engine would.
  ScheduledBatch Step(TimeNs now = 0) {
    ScheduledBatch batch = scheduler->Schedule(now);
    for (const ScheduledSeq& s : batch.seqs) {
      s.seq->num_computed = s.start + s.num_tokens;
      kv.m->Commit(s.seq->kv_id, s.seq->num_computed);
    }
    for (const ScheduledSeq& s : batch.seqs) {
      if (!s.sample) continue;
      const TokenId t = static_cast<TokenId>(next_token_++);
      s.seq->tokens.push_back(t);
      REQUIRE(kv.m->CanAppend(s.seq->kv_id, 1));
      REQUIRE(kv.m->Append(s.seq->kv_id, std::span<const TokenId>(&t, 1)).ok());
    }
    const Status st = scheduler->CheckInvariants();
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    return batch;
  }

  // `n` sequences decoding with contexts of about `context` tokens.
  void StartDecodes(uint32_t n, uint32_t context) {
    std::vector<Sequence*> started;
    for (uint32_t i = 0; i < n; ++i) started.push_back(Add(context - 1));
    ScheduledBatch first = Step();  // no decodes yet: every prompt in one step
    REQUIRE(first.decode_seqs == 0);
    for (Sequence* seq : started) REQUIRE(seq->decoding());
  }

  const ScheduledSeq* Find(const ScheduledBatch& b, const Sequence* seq) const {
    for (const ScheduledSeq& s : b.seqs) {
      if (s.seq == seq) return &s;
    }
    return nullptr;
  }

  double Predict(const StepShape& s) const { return scheduler->step_model().PredictUs(s); }

  kv::testing::Fixture kv;
  std::unique_ptr<Scheduler> scheduler;
  std::vector<std::unique_ptr<Sequence>> seqs;
  uint32_t next_token_ = 1;
};

TEST_CASE("while decodes run, each step's prefill is the longest block-aligned chunk within max_step_ms") {
  Rig rig(20);
  rig.StartDecodes(8, 512);
  Sequence* prompt = rig.Add(4000);
  int steps = 0;
  while (prompt->num_uncomputed() > 1 || prompt->num_generated() == 0) {
    ScheduledBatch b = rig.Step();
    ++steps;
    CHECK(b.decode_seqs == 8);  // no decode waits for the prompt
    const ScheduledSeq* chunk = rig.Find(b, prompt);
    REQUIRE(chunk != nullptr);
    CHECK(b.predicted_us <= 20'000);
    CHECK(b.predicted_us == doctest::Approx(rig.Predict(b.shape)));
    if (!chunk->sample) {
      // Cut by the bound: it ends on a block boundary, and one block more would not fit.
      CHECK(b.time_bounded);
      CHECK(b.prefill_limited);
      CHECK((chunk->start + chunk->num_tokens) % kB == 0);
      StepShape bigger = b.shape;
      bigger.AddPrefill(chunk->start + chunk->num_tokens, kB);
      CHECK(rig.Predict(bigger) > 20'000);
    }
  }
  // 8 decodes cost ~5.3 ms, which leaves ~14.7 ms: ~700 tokens a step.
  CHECK(steps >= 5);
  CHECK(steps <= 7);
}

TEST_CASE("with no decode running a prompt takes the whole token budget, bound or not") {
  for (double bound : {0.0, 20.0}) {
    Rig rig(bound);
    Sequence* prompt = rig.Add(20000);
    ScheduledBatch b = rig.Step();
    CHECK(b.decode_seqs == 0);
    CHECK(b.prefill_tokens == kBudget);
    CHECK(rig.Find(b, prompt)->num_tokens == kBudget);
    CHECK_FALSE(b.time_bounded);
    CHECK(b.prefill_limited);       // more of it was ready
    CHECK(b.predicted_us > 20'000);  // long, but nothing waits on it
    // A second prompt behind it: still no decode (the first has not sampled), full budget.
    rig.Add(3000);
    b = rig.Step();
    CHECK(b.num_tokens == kBudget);
  }
}

TEST_CASE("a prefill progresses by at least one block a step when not even a block fits the bound") {
  StepCoefficients slow_prefill = kFake;
  slow_prefill.prefill_token_us = 100'000;  // 100 ms a token: no chunk fits 20 ms, nor 2x the decodes
  Rig rig(20, slow_prefill);
  rig.StartDecodes(4, 256);
  Sequence* prompt = rig.Add(10 * kB);
  Sequence* behind = rig.Add(5 * kB);
  for (int step = 1; step <= 10; ++step) {
    ScheduledBatch b = rig.Step();
    CHECK(b.decode_seqs == 4);
    const ScheduledSeq* chunk = rig.Find(b, prompt);
    REQUIRE(chunk != nullptr);
    CHECK(chunk->num_tokens == kB);
    CHECK(chunk->sample == (step == 10));
    CHECK(b.time_bounded);
    CHECK(rig.Find(b, behind) == nullptr);  // only the oldest prefill gets the guarantee
  }
  CHECK(prompt->num_generated() == 1);
}

TEST_CASE("a chunk from a start off the block grid gets a block plus the rest of its first block") {
  StepCoefficients slow_prefill = kFake;
  slow_prefill.prefill_token_us = 100'000;
  Rig rig(20, slow_prefill);
  // A finished request leaves its blocks cached; a prompt that shares 5 blocks and 10
  // tokens of the sixth starts at 90 (partial reuse copies the 10).
  const std::vector<TokenId> cached = rig.Fresh(100);
  Sequence* old = rig.Add(cached);
  rig.Step();
  rig.scheduler->Remove(old);
  rig.StartDecodes(2, 100);
  std::vector<TokenId> prompt_tokens(cached.begin(), cached.begin() + 90);
  for (TokenId t : rig.Fresh(200)) prompt_tokens.push_back(t);
  Sequence* prompt = rig.Add(prompt_tokens);
  ScheduledBatch b = rig.Step();
  const ScheduledSeq* chunk = rig.Find(b, prompt);
  REQUIRE(chunk != nullptr);
  REQUIRE(chunk->start == 90);
  CHECK(chunk->num_tokens == 2 * kB - 10);  // to 112: the rest of block 5, then block 6
  ScheduledBatch b2 = rig.Step();
  CHECK(rig.Find(b2, prompt)->start == 7 * kB);
  CHECK(rig.Find(b2, prompt)->num_tokens == kB);
}

TEST_CASE("when the decodes alone nearly fill the bound, prefill still gets as long as they take") {
  StepCoefficients dear_decodes = kFake;
  dear_decodes.decode_seq_us = 2500;  // 8 decodes: 25 ms with the base, over the 20 ms bound
  Rig rig(20, dear_decodes);
  rig.StartDecodes(8, 256);
  Sequence* prompt = rig.Add(8000);
  ScheduledBatch b = rig.Step();
  StepShape decodes;
  for (const ScheduledSeq& s : b.seqs) {
    if (s.decode) decodes.AddDecode(s.start + 1);
  }
  const double decode_us = rig.Predict(decodes);
  REQUIRE(decode_us > 20'000);
  const ScheduledSeq* chunk = rig.Find(b, prompt);
  REQUIRE(chunk != nullptr);
  CHECK(b.predicted_us <= config::kMinStepOverDecodes * decode_us);
  CHECK(b.predicted_us > 1.9 * decode_us);  // the prefill's share is close to the decodes'
  CHECK(chunk->num_tokens > 1000);
}

TEST_CASE("max_step_ms 0 schedules as before the bound: the budget left by the decodes") {
  Rig rig(0);
  rig.StartDecodes(8, 512);
  Sequence* prompt = rig.Add(9000);
  ScheduledBatch b = rig.Step();
  CHECK(b.decode_seqs == 8);
  CHECK(rig.Find(b, prompt)->num_tokens == kBudget - 8);
  CHECK_FALSE(b.time_bounded);
  CHECK(b.predicted_us > 100'000);
}

TEST_CASE("a waiting prompt is admitted only while a block of it still fits the bound") {
  Rig rig(20);
  rig.StartDecodes(8, 512);
  Sequence* first = rig.Add(600);   // fits in one step beside the decodes
  Sequence* second = rig.Add(3000);  // gets what is left
  Sequence* third = rig.Add(3000);   // nothing is left: stays waiting, holds no blocks
  ScheduledBatch b = rig.Step();
  CHECK(rig.Find(b, first)->num_tokens == 600);
  const ScheduledSeq* c2 = rig.Find(b, second);
  REQUIRE(c2 != nullptr);
  CHECK(c2->num_tokens % kB == 0);
  CHECK(rig.Find(b, third) == nullptr);
  CHECK(third->state == SequenceState::kWaiting);
  CHECK(b.predicted_us <= 20'000);
  CHECK(b.prefill_limited);
}

// The decodes' own predicted time in step `b`.
double DecodesUs(const Rig& rig, const ScheduledBatch& b) {
  StepShape decodes;
  for (const ScheduledSeq& s : b.seqs) {
    if (s.decode) decodes.AddDecode(s.start + 1);
  }
  return rig.Predict(decodes);
}

TEST_CASE("a decode-role worker's steps with prefill stay within 1.25x their decodes' time, and the prompt still ends") {
  // Issue 36: decode workers ran every step with a prompt chunk to the 25 ms bound, 2-3x a
  // decode step, so the split's inter-token p99 stayed 2-3x its p50.
  Rig rig(25, kFake, 4096, config::kDecodeRoleStepOverDecodes);
  rig.StartDecodes(8, 512);
  Sequence* prompt = rig.Add(2000);
  int steps = 0;
  while (prompt->num_generated() == 0) {
    ScheduledBatch b = rig.Step();
    ++steps;
    REQUIRE(steps < 400);
    CHECK(b.decode_seqs == 8);
    const double decodes_us = DecodesUs(rig, b);
    const ScheduledSeq* chunk = rig.Find(b, prompt);
    REQUIRE(chunk != nullptr);  // a block a step at least: never starved
    if (chunk->num_tokens > 2 * kB) {
      CHECK(b.predicted_us <= config::kDecodeRoleStepOverDecodes * decodes_us);
    }
    if (!chunk->sample) {
      CHECK(b.time_bounded);
      StepShape bigger = b.shape;
      bigger.AddPrefill(chunk->start + chunk->num_tokens, kB);
      CHECK(rig.Predict(bigger) > config::kDecodeRoleStepOverDecodes * decodes_us);
    }
  }
  // 8 decodes: ~5.3 ms; a quarter of it (~1.3 ms) is ~16 tokens beside the 1 ms a prefill
  // step adds, so one block a step: 2,000 tokens in ~125 steps, against 3 within 25 ms alone.
  CHECK(steps >= 100);
  Rig both(25);
  both.StartDecodes(8, 512);
  Sequence* p2 = both.Add(2000);
  int both_steps = 0;
  while (p2->num_generated() == 0) {
    both.Step();
    ++both_steps;
  }
  CHECK(both_steps <= 4);
}

TEST_CASE("on a decode-role worker a prompt with at most a block left runs at once, ahead of capped prompts") {
  // A split request's pulled prompt waited behind the prompts the cap slows (FIFO admission),
  // so the split's first token waited for the decode worker's prompt queue.
  Rig rig(25, kFake, 4096, config::kDecodeRoleStepOverDecodes);
  rig.StartDecodes(8, 512);
  Sequence* long1 = rig.Add(4000);
  Sequence* long2 = rig.Add(3000);  // the cap leaves it no room: it waits
  rig.Step();
  std::vector<TokenId> prompt(rig.seqs[0]->tokens.begin(), rig.seqs[0]->tokens.begin() + 30 * kB);
  for (TokenId t : rig.Fresh(10)) prompt.push_back(t);  // 30 cached blocks, then 10 tokens
  Sequence* pulled = rig.Add(prompt);
  ScheduledBatch b = rig.Step();
  const ScheduledSeq* s = rig.Find(b, pulled);
  REQUIRE(s != nullptr);
  CHECK(s->sample);
  CHECK(s->num_tokens == 10);
  CHECK(long2->state == SequenceState::kWaiting);
  CHECK(rig.Find(b, long1) != nullptr);  // the oldest prefill still gets its block
  CHECK(b.predicted_us <= 1.5 * DecodesUs(rig, b));
}

TEST_CASE("the decode-role cap yields to max_step_ms once a prompt has waited past max_capped_wait_ms") {
  // With the yield, a saturated fleet's decode workers do not fall seconds behind on prompts.
  constexpr double kWaitMs = 500;
  Rig rig(20, kFake, 4096, config::kDecodeRoleStepOverDecodes, kWaitMs);
  rig.StartDecodes(8, 512);
  rig.Add(4000);  // arrived at 0
  const TimeNs limit = static_cast<TimeNs>(kWaitMs * kNsPerMs);
  ScheduledBatch early = rig.Step(limit);  // not past it yet: capped
  const double decodes_us = DecodesUs(rig, early);
  CHECK(early.prefill_tokens <= 2 * kB);
  CHECK(early.predicted_us < 20'000);
  ScheduledBatch late = rig.Step(limit + 1);  // the running prefill is overdue: the 20 ms rule
  CHECK(late.time_bounded);
  CHECK(late.predicted_us <= 20'000);
  CHECK(late.predicted_us > 1.25 * decodes_us);
  CHECK(late.prefill_tokens > 500);
  // By default the cap never yields: the same prompt, seconds overdue, still gets capped steps.
  CHECK(config::kDecodeRoleMaxCappedWaitMs == 0);
  Rig strict(20, kFake, 4096, config::kDecodeRoleStepOverDecodes, config::kDecodeRoleMaxCappedWaitMs);
  strict.StartDecodes(8, 512);
  strict.Add(4000);
  ScheduledBatch overdue = strict.Step(100 * limit);
  CHECK(overdue.predicted_us <= config::kDecodeRoleStepOverDecodes * DecodesUs(strict, overdue));
  CHECK(overdue.prefill_tokens <= 2 * kB);
}

TEST_CASE("the decode-role cap is the tighter bound, and takes effect with max_step_ms 0 too") {
  for (double max_step_ms : {0.0, 25.0}) {
    Rig rig(max_step_ms, kFake, 4096, 2.0);
    rig.StartDecodes(8, 512);
    Sequence* prompt = rig.Add(4000);
    ScheduledBatch b = rig.Step();
    const double decodes_us = DecodesUs(rig, b);
    REQUIRE(rig.Find(b, prompt) != nullptr);
    CHECK(b.time_bounded);
    CHECK(b.predicted_us <= 2.0 * decodes_us);
    CHECK(b.predicted_us > 1.9 * decodes_us);
  }
}

TEST_CASE("max_step_ms is 0 or 1..60000 ms, and the prior's coefficients are finite and >= 0") {
  SchedulerOptions o;
  for (double ok : {0.0, 1.0, 25.0, 60000.0}) {
    o.max_step_ms = ok;
    CHECK(o.Validate(kB).ok());
  }
  for (double bad : {-1.0, 0.5, 60001.0, std::nan(""), HUGE_VAL}) {
    o.max_step_ms = bad;
    Status st = o.Validate(kB);
    CHECK_FALSE(st.ok());
    CHECK(st.message().find("max_step_ms") != std::string::npos);
  }
  o.max_step_ms = 25;
  for (double bad : {-1.0, 0.5, 101.0, std::nan("")}) {
    o.max_step_over_decodes = bad;
    CHECK(o.Validate(kB).message().find("max_step_over_decodes") != std::string::npos);
  }
  o.max_step_over_decodes = 1.25;
  CHECK(o.Validate(kB).ok());
  o.max_capped_wait_ms = -1;
  CHECK(o.Validate(kB).message().find("max_capped_wait_ms") != std::string::npos);
  o.max_capped_wait_ms = 500;
  o.step_prior.prefill_token_us = -1;
  CHECK(o.Validate(kB).message().find("step_prior") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::engine
