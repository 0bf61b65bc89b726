// A generation request as the engine sees it, its limits, and what the engine reports
// back for it: streamed tokens, a finish reason, usage counts.
//
// These are plain values. The request server builds a GenerateRequest from a capnp
// Generate (Contract 3 of docs/DESIGN.md), taking its SamplingParams as they are, and turns
// RequestOutput back into Deltas, so the engine itself knows nothing of the wire.
//
// Thread safety: values; no shared state.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "common/clock.h"
#include "common/status.h"
#include "grammar/grammar.h"
#include "schema/sampling.h"
#include "worker/backend/sampler.h"
#include "worker/kv/retention.h"

namespace kvfleet::engine {

// The engine's handle of a request: unique within one engine, never reused. The request
// server maps (router connection, wire request id) to one of these.
using RequestId = uint64_t;

struct GenerateRequest {
  std::vector<TokenId> prompt;
  SamplingParams sampling;  // as the router sent it (schema/sampling.h); never changed here
  kv::KvCacheRetentionConfig retention;  // passed through to the KV cache manager
  std::string lora;        // empty: none
  std::string cache_salt;  // empty: none
  // sampling.structured compiled against the worker's vocabulary (StructuredOutputs::Prepare,
  // before Engine::Add); null when the request is unconstrained.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// Limits the engine enforces. A request that cannot fit is refused with an error; it is
// never truncated.
struct EngineLimits {
  uint32_t max_context = 8192;   // prompt + generated tokens of one request
  // Prompt tokens of one request: a windowed pool allocates a prompt's blocks at once (and
  // StreamingLLM keeps them through its dense context phase), so its blocks bound a prompt.
  uint32_t max_prompt = UINT32_MAX;
  uint32_t max_queued = 1024;    // requests waiting for their first step
  uint32_t vocab_size = 0;       // 0: unknown; else token ids must be below it
};

// The retention priority that ranks a request for preemption: the highest priority it
// asks for any of its blocks (its ranges and its decode blocks).
uint8_t PreemptionPriority(const kv::KvCacheRetentionConfig& retention);

// Checks a request against the limits. The codes the request server maps to wire
// errors: InvalidArgument (sampling values out of bounds, as ValidateSampling words them;
// an empty prompt, a bad token id or retention), OutOfRange (the prompt does not fit the
// context). The engine checks the lora (NotFound for one it does not serve).
Status ValidateRequest(const GenerateRequest& request, const EngineLimits& limits);

enum class FinishReason : uint8_t {
  kNone = 0,   // more output follows
  kStop,       // EOS or a stop token id
  kLength,     // max_tokens, or the context limit
  kCancelled,
  kError,
};
const char* FinishReasonName(FinishReason reason);

struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_device_tokens = 0;  // prompt tokens served from the device tier
  uint32_t cached_host_tokens = 0;    // prompt tokens onboarded from the host tier
  uint32_t completion_tokens = 0;
  DurationNs time_to_first_token = 0;  // from arrival to the first generated token; 0 before it
};

// One step's news about one sequence of a request: the tokens generated in that step, and
// a finish reason when it is that sequence's last. `last` marks the request's final output
// (every one of its n sequences has finished); with n = 1 it equals finish != kNone.
struct RequestOutput {
  RequestId id = 0;
  uint32_t index = 0;  // the sequence, 0..n-1
  std::vector<TokenId> new_tokens;
  FinishReason finish = FinishReason::kNone;
  bool last = false;
  Usage usage;  // prompt and cached tokens are the request's; completion tokens this sequence's
  std::vector<backend::TokenLogprobs> logprobs;         // one per new token, when asked for
  std::vector<backend::TokenLogprobs> prompt_logprobs;  // prompt tokens 1.., in sequence 0's first output only
};

}  // namespace kvfleet::engine
