// Turns a trace request into the token ids of a real prompt, so that the trace's block
// sharing becomes real prefix sharing in the fleet's KV caches.
//
// Each hash id expands to a fixed pseudo-random run of token ids seeded by the id alone
// (SplitMix64, so every platform and run gives the same tokens). A block of the scaled
// trace is the first block_tokens() ids of its run, and the prompt is the blocks in
// order, cut to the scaled input length. Equal ids at equal positions give equal tokens;
// any engine block size B that divides block_tokens() then sees the shared blocks as
// whole, identical KV blocks.
//
// Thread safety: immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "cli/bench/trace.h"
#include "common/status.h"

namespace kvfleet::bench {

class PromptBuilder {
 public:
  // REQUIRES: vocab_size >= 2; block_tokens in [1, 512].
  PromptBuilder(uint32_t vocab_size, uint32_t block_tokens);

  uint32_t block_tokens() const { return block_tokens_; }

  // The `n` leading tokens of hash id `id`'s run, each in [0, vocab_size).
  void AppendBlock(uint64_t id, uint32_t n, std::vector<uint32_t>* out) const;

  // The prompt of `request`: exactly request.input_length tokens.
  // REQUIRES: input_length <= block_tokens() * hash_ids.size() (ParseTrace checks the
  // unscaled form of this, which implies it).
  std::vector<uint32_t> Build(const ScaledRequest& request) const;

 private:
  uint32_t vocab_size_;
  uint32_t block_tokens_;
};

}  // namespace kvfleet::bench
