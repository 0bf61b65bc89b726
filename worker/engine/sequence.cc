#include "worker/engine/sequence.h"

#include "worker/backend/sampler.h"

namespace kvfleet::engine {

Sequence::Sequence(RequestId id_in, GenerateRequest request_in, TimeNs arrival_in)
    : id(id_in), request(std::move(request_in)), arrival(arrival_in) {
  tokens = request.prompt;
  prompt_len = static_cast<uint32_t>(tokens.size());
  // Without a seed of its own a request still samples reproducibly: from its id.
  seed = request.sampling.seed ? *request.sampling.seed : backend::SplitMix64(id);
  preemption_priority = PreemptionPriority(request.retention);
}

}  // namespace kvfleet::engine
