#include "worker/engine/sequence.h"

#include "worker/backend/sampler.h"

namespace kvfleet::engine {

Sequence::Sequence(RequestId id_in, GenerateRequest request_in, TimeNs arrival_in)
    : id(id_in), request_id(id_in), request(std::move(request_in)), arrival(arrival_in) {
  tokens = request.prompt;
  prompt_len = static_cast<uint32_t>(tokens.size());
  // Without a seed of its own a request still samples reproducibly: from its id.
  seed = request.sampling.seed ? *request.sampling.seed : backend::SplitMix64(id);
  preemption_priority = PreemptionPriority(request.retention);
  forks_left = request.sampling.n - 1;
  if (request.grammar) matcher.emplace(request.grammar);
}

Sequence::Sequence(RequestId id_in, const Sequence& parent, uint32_t index_in)
    : id(id_in), request_id(parent.request_id), index(index_in), request(parent.request), arrival(parent.arrival) {
  tokens = request.prompt;
  prompt_len = parent.prompt_len;
  // Each sequence its own stream of randomness; a seeded request is reproducible.
  seed = parent.seed + index;
  preemption_priority = parent.preemption_priority;
  // Usage is the request's: what the client saved on its prompt, counted once.
  admitted_once = true;
  // The request's prompt logprobs come from sequence 0: a fork reuses the prompt's blocks.
  prompt_logprobs_sent = true;
  cached_device_tokens = parent.cached_device_tokens;
  cached_host_tokens = parent.cached_host_tokens;
  if (request.grammar) matcher.emplace(request.grammar);  // from the start: its tokens are its own
}

}  // namespace kvfleet::engine
