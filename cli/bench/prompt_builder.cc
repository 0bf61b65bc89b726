#include "cli/bench/prompt_builder.h"

#include <algorithm>

#include "common/check.h"

namespace kvfleet::bench {

namespace {
// SplitMix64 (Steele, Lea, Flood 2014): a tiny, well-mixed, portable sequence generator.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

PromptBuilder::PromptBuilder(uint32_t vocab_size, uint32_t block_tokens)
    : vocab_size_(vocab_size), block_tokens_(block_tokens) {
  KVF_CHECK(vocab_size >= 2);
  KVF_CHECK(block_tokens >= 1 && block_tokens <= config::kTraceBlockTokens);
}

void PromptBuilder::AppendBlock(uint64_t id, uint32_t n, std::vector<uint32_t>* out) const {
  uint64_t state = id;
  for (uint32_t i = 0; i < n; ++i) out->push_back(static_cast<uint32_t>(SplitMix64(&state) % vocab_size_));
}

std::vector<uint32_t> PromptBuilder::Build(const ScaledRequest& request) const {
  const std::vector<uint64_t>& ids = request.source->hash_ids;
  KVF_CHECK(uint64_t{request.input_length} <= uint64_t{block_tokens_} * ids.size());
  std::vector<uint32_t> tokens;
  tokens.reserve(request.input_length);
  for (size_t b = 0; tokens.size() < request.input_length; ++b) {
    uint32_t n = std::min<uint32_t>(block_tokens_, request.input_length - static_cast<uint32_t>(tokens.size()));
    AppendBlock(ids[b], n, &tokens);
  }
  return tokens;
}

}  // namespace kvfleet::bench
