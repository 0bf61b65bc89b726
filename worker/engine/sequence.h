// Sequence: the engine's state of one request, from arrival to its last Delta.
//
// Token bookkeeping (n = tokens.size(), the prompt followed by every generated token):
//   - num_computed: tokens whose KV is in the cache (from reuse or from earlier steps).
//   - A step computes tokens [num_computed, num_computed + chunk); when that reaches n the
//     step samples the next token, which is appended (its KV is computed next step).
//   - So a decoding sequence has n - num_computed == 1, a prefilling one more.
// Preemption drops num_computed to 0 and keeps every token; the recompute prefills them
// again (mostly from the reuse tree) and continues where it stopped, so the stream the
// client sees has no gap and no repeat.
//
// Thread safety: thread-compatible; owned by the engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "worker/engine/request.h"
#include "worker/kv/kv_cache_manager.h"

namespace kvfleet::engine {

enum class SequenceState : uint8_t {
  kWaiting,  // holds no KV blocks: new, or preempted
  kRunning,  // holds blocks for all its tokens; scheduled every step
};

struct Sequence {
  // Sequence 0 of a request: its id is the request's.
  Sequence(RequestId id, GenerateRequest request, TimeNs arrival);
  // Sequence `index` of parent's request, forked once the parent's prompt is computed.
  Sequence(RequestId id, const Sequence& parent, uint32_t index);

  RequestId id;                  // this sequence's; unique within the engine
  RequestId request_id;          // the request's: sequence 0's id
  uint32_t index = 0;            // 0..n-1 within the request
  uint32_t forks_left = 0;       // sequence 0: sequences still to fork (n - 1 until its prompt is computed)
  GenerateRequest request;       // prompt, sampling, retention, namespace
  std::vector<TokenId> tokens;   // prompt + generated
  uint32_t prompt_len = 0;
  uint64_t seed = 0;             // the sampling seed: the request's (or derived from its id) + index
  uint8_t preemption_priority = kv::kDefaultPriority;  // PreemptionPriority(retention)
  TimeNs arrival = 0;

  SequenceState state = SequenceState::kWaiting;
  // The KV cache manager's sequence; registered: it exists there and its tokens equal `tokens`
  // (false after a preemption that dropped it; the next admission registers it again).
  bool kv_registered = false;
  kv::SequenceId kv_id = 0;
  uint32_t num_computed = 0;
  // The backend slot of request.lora while running (held in the LoraRegistry); -1 otherwise.
  int32_t lora_slot = -1;

  // Engine::Hold: queued but not admitted while the worker pulls its prefix (KV transfer).
  bool held = false;
  // It was held: once unheld it keeps its arrival place among the prefills (Scheduler, 1c).
  bool was_held = false;

  // Usage: cache hits counted on the first admission only (what the client saved).
  bool admitted_once = false;
  uint32_t cached_device_tokens = 0;
  uint32_t cached_host_tokens = 0;
  TimeNs first_token_time = 0;  // 0: none yet
  uint32_t num_streamed = 0;    // generated tokens already reported
  uint32_t num_preemptions = 0;
  bool finished = false;        // reported with a finish reason; leaves at the end of the step
  // Logprobs, when the request asks: one per generated token (streamed with it), and the
  // prompt's tokens 1..prompt_len-1 (sent once, in the first output).
  std::vector<backend::TokenLogprobs> logprobs;
  std::vector<backend::TokenLogprobs> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  // Constrained decoding (request.grammar set): the grammar's state after every generated
  // token (each token accepted once, as it is appended: a preempted sequence keeps it, and
  // its recompute samples only tokens after it). Its next-token mask is written straight
  // into the backend's memory during the step (Engine::FillMask).
  std::optional<grammar::Matcher> matcher;
  // The step's mask allowed no more text (only an end token, or nothing): the token drawn
  // with it is dropped and the sequence ends (stop when the document is complete, else error).
  bool grammar_end = false;

  uint32_t num_tokens() const { return static_cast<uint32_t>(tokens.size()); }
  uint32_t num_generated() const { return num_tokens() - prompt_len; }
  uint32_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool decoding() const { return state == SequenceState::kRunning && num_uncomputed() == 1; }
};

}  // namespace kvfleet::engine
