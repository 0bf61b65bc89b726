// MockBackend: the `mock` model backend. No math: each step takes the time the cost
// model (cost_model.h) says a real GPU would, and samples deterministic pseudo-random
// tokens. Everything around it is real (scheduler, KV cache manager, events, sockets),
// so prefix hits really shorten time to first token, and many mock workers can run in
// one process for fleet benchmarks.
//
// Tokens. The token sampled for a sequence is a pure function of its seed, the index of
// the token (rng_counter) and its context, so a request gives the same tokens in any
// batch and after preemption and recompute. The context is the step's last input token;
// with verify_kv it is instead a hash of every (token, position) attention reads through
// the block tables from a shadow KV cache, so a wrong block table, a wrongly reused block
// or a lost copy changes the output (or fails the step) — an oracle for engine tests.
// The mock never samples an EOS token unless eos_after says so. Logprobs asked for are
// placeholders of the right shape (MockLogprobs): the mock has no logits.
//
// Constrained decoding. With a token bitmask the choice is made among the allowed tokens
// only, still a pure function of the same inputs, and steered toward finishing the document
// so that a mock fleet serves short, valid structured outputs: from the first of these
// classes that has an allowed token (UseVocabulary sorts the vocabulary into them), a
// pseudo-random one: (0) stop ids and tokens made only of `"`, `}`, `]`; (1) only of `,`
// and `:`; (2) tokens without whitespace; (3) the rest. Without a vocabulary: the first
// allowed id from the pseudo-random one on.
//
// LoRA. options.max_loras slots; LoadLora only records which adapter a slot holds (no
// copy, no time). A sequence with a slot mixes its adapter's lora_id into its context, so
// the same prompt gives different tokens under different adapters, as on a real model. The
// cost model charges nothing for adapters (SGMV/BGMV adds a few percent to a step on a GPU;
// the mock keeps the base model's calibration).
//
// Time. Execute() returns once the step's modelled duration has passed since it began:
// `wait` is called with that deadline (default: sleep on the steady clock; tests pass a
// ManualClock's Advance).
//
// Settings in BackendOptions::extra (all optional):
//   mock.step_base_us, mock.prefill_token_us, mock.decode_seq_us, mock.kv_token_read_us,
//   mock.tier_copy_us_per_mib
//   mock.verify_kv (0/1), mock.eos_after (N: the Nth generated token is EOS; 0: never)
//   mock.device (a name: the mocks of this process naming it run one step at a time)
// Without a model_dir the model is Llama-3.1-8B's shape (config.json of
// meta-llama/Llama-3.1-8B): 32 layers, 8 KV heads of 128, vocab 128256.
//
// Thread safety: thread-compatible; the engine thread calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "worker/backend/backend.h"
#include "worker/backend/mock/cost_model.h"
#include "worker/kv/block_copier.h"

namespace kvfleet::backend::mock {

namespace config {
// KV bytes when none are given: what an H100 80GB holds for Llama-3.1-8B in bf16 after
// the 16 GB of weights at vLLM's gpu_memory_utilization 0.9 (~442k tokens, as vLLM logs
// "GPU KV cache size" for that setup).
constexpr uint64_t kDefaultKvBytes = 54ull << 30;
// Bytes per K/V element of the GPU the mock imitates (bf16).
constexpr uint32_t kKvElementBytes = 2;
}  // namespace config

struct MockOptions {
  CostModel cost;
  bool verify_kv = false;
  uint32_t eos_after = 0;  // > 0: the eos_after-th generated token is the first EOS id
  // Called with the step's deadline (the clock's time when Execute began + the modelled
  // duration). Empty: sleep until then on the steady clock.
  std::function<void(TimeNs deadline)> wait;
  const Clock* clock = nullptr;  // null: SystemClock::Default()
  // mock.device: the mocks of this process naming the same device share its time, a step
  // starting once the device's previous one (of any of them) has ended, as workers sharing
  // a GPU take turns on it. Empty: a device of its own.
  std::string device;
};

// Parses the mock.* settings of options.extra into `mock` (other fields untouched).
Status ParseMockSettings(const BackendOptions& options, MockOptions* mock);

// Llama-3.1-8B's architecture, for a mock without a model directory.
model::ModelConfig DefaultMockModelConfig();

class MockBackend final : public ModelBackendBase {
 public:
  static Result<std::unique_ptr<MockBackend>> Make(const BackendOptions& options, MockOptions mock);
  ~MockBackend() override;

  std::string_view name() const override { return "mock"; }
  bool applies_token_bitmask() const override { return true; }
  void UseVocabulary(const grammar::Vocabulary& vocabulary) override;
  Status Execute(const StepBatch& batch, StepOutput* out) override;
  kv::BlockCopier& block_copier() override;
  int32_t max_loras() const override { return options_.max_loras; }
  Status LoadLora(int32_t slot, const model::LoraAdapter& adapter) override;
  // KV transfer: the mock keeps no KV bytes ("none"); a pulled block costs the time its
  // modelled size (pools()[p].bytes_per_block) takes at the transfer's bandwidth.
  KvTransferFormat kv_transfer_format() const override { return KvTransferFormat{"none", "", {}}; }
  // From the cost model: the largest prefill step within max_step_ms (no decodes).
  double ExpectedPrefillTokensPerSecond(uint32_t max_tokens, double max_step_ms) const override;
  Status ReadKvBlocks(uint32_t, std::span<const kv::BlockLocation>, std::span<std::byte>) override { return {}; }
  Status WriteKvBlocks(uint32_t, std::span<const BlockId>, std::span<const std::byte>) override { return {}; }

  // The device bytes the pools were sized from (the KV manager must get the same).
  uint64_t kv_device_bytes() const { return device_bytes_; }
  uint64_t kv_host_bytes() const { return host_bytes_; }
  const CostModel& cost_model() const { return mock_.cost; }
  // The modelled duration of the last step.
  DurationNs last_step_duration() const { return last_step_; }

 private:
  class ShadowCopier;
  MockBackend(const BackendOptions& options, MockOptions mock, model::ModelConfig config);
  Status Validate(const StepBatch& batch) const;
  // The context hash of one sequence after writing its tokens (verify_kv).
  Result<uint64_t> WriteAndRead(const SequenceStep& step);
  // `allowed`: the step's token bitmask (FillStepTokenBitmask), empty when unconstrained.
  TokenId TokenFor(const SequenceStep& step, std::span<const uint32_t> allowed, uint64_t context) const;
  // TokenFor's choice among the tokens `allowed` allows.
  TokenId AllowedTokenFor(const SequenceStep& step, std::span<const uint32_t> allowed, uint64_t hash) const;
  TokenLogprobs MockLogprobs(TokenId token, int32_t top) const;

  MockOptions mock_;
  std::vector<uint32_t> mask_;  // Execute's scratch: a constrained row's token bitmask
  uint64_t device_bytes_ = 0;
  uint64_t host_bytes_ = 0;
  std::unique_ptr<ShadowCopier> copier_;
  DurationNs last_step_ = 0;
  std::vector<uint64_t> lora_slots_;  // [max_loras]: the lora_id of the adapter held; 0: none
  // UseVocabulary's token classes (see "Constrained decoding"), each a bitmask over the
  // vocabulary; empty: no vocabulary.
  std::vector<std::vector<uint32_t>> token_classes_;
};

}  // namespace kvfleet::backend::mock
