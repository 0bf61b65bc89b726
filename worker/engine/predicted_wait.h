// PredictedWait: how long a request arriving at a worker now would wait before its prefill
// starts, from a snapshot of the engine's queue. The worker sends it in every load report
// (Contract 2's Load.predictedWaitUs), and routers add the request's own prefill to it to
// decide whether its first token can come before their first-token timeout.
//
//   wait      = prefill / rate + admission
//   prefill   = prompt tokens still to compute: running prefills' uncomputed tokens, and
//               waiting prompts whole (their cache hits are not known before admission)
//   rate      = the measured prefill rate (tokens/s); 0 while unmeasured, and then the
//               prefill term is 0: a router applies its own prior to the tokens
//   admission = 0 when one more request would be admitted behind those waiting, as far
//               as batch slots and KV blocks go; else the time until k running requests
//               finish, k = (waiting requests that do not fit now) + 1: the k-th shortest
//               remaining output × the step time. Past the running requests' count, the
//               longest remaining output × step time, once per full batch of them.
//               A running prompt's remaining output leaves out the token its prefill's last
//               chunk samples: until then it waits on prefill, which the prefill term counts.
//               So a worker whose requests end at their first token (a prefill-role worker's)
//               has no admission term: its queue is its prefill, counted once.
//
// The admission term is an approximation: each finished request is taken to make room for
// one waiting request, and a waiting prompt to need blocks for all its tokens (no cache
// hits). It matters when a GPU's KV cache or batch is full, where a new request waits for
// decodes to finish, which the prefill queue alone does not say.
//
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <span>

namespace kvfleet::engine {

struct QueueSnapshot {
  uint64_t prefill_tokens = 0;         // prompt tokens still to compute, waiting prompts whole
  double prefill_tokens_per_s = 0;     // measured; 0: unmeasured
  double step_s = 0;                   // smoothed engine step duration; 0: no step yet
  uint32_t max_batch_size = 1;         // running sequences at most
  uint32_t block_size = 1;             // tokens per KV block
  uint64_t free_blocks = 0;            // device blocks free or evictable (one pool's worth)
  // Waiting requests in admission order: each one's tokens (prompt, plus any generated
  // before a preemption).
  std::span<const uint32_t> waiting_tokens;
  // Running requests: each one's tokens still to generate, less the one its prefill samples
  // while it still computes its prompt (so >= 0).
  std::span<const uint32_t> running_remaining;
};

// Seconds a request arriving now waits before its prefill starts (see above).
double PredictedWaitSeconds(const QueueSnapshot& queue);

// The admission term alone: seconds until one more request behind the waiting ones can be
// admitted, as far as batch slots and KV blocks go.
double AdmissionWaitSeconds(const QueueSnapshot& queue);

// Seconds a prompt with at most a block left to compute (its prefix pulled) waits to be
// admitted. A worker that admits such prompts ahead of its queue (`ahead`: a decode-role
// worker's scheduler, Scheduler::AdmitNearlyCached) makes it wait for a batch slot and a
// block only: the admission term with nothing waiting. Otherwise it queues like any request:
// PredictedWaitSeconds.
double PulledWaitSeconds(const QueueSnapshot& queue, bool ahead);

}  // namespace kvfleet::engine
