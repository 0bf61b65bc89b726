// Retention: how long a request wants its KV blocks kept, following TensorRT-LLM's
// KvCacheRetentionConfig (docs: "KV cache reuse" / "Priority-based eviction").
//
// A request carries token ranges [start, end) with a priority (0-100) and an optional
// duration, plus a priority and duration for the blocks filled during generation.
// Rules (TensorRT-LLM):
//   1. A token's priority comes from the first range that covers it (earlier ranges win);
//      tokens no range covers get kDefaultPriority.
//   2. A block's priority is the highest among its tokens' priorities; its duration is
//      the one attached to that winning priority.
//   3. Generated tokens take decode_priority / decode_duration.
//   4. After `duration` without reuse a block falls back to kDefaultPriority.
//
// Thread safety: values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "schema/kv_event.h"

namespace kvfleet::kv {

struct TokenRangeRetention {
  uint32_t start = 0;                // first token, inclusive
  std::optional<uint32_t> end;       // one past the last token; nullopt = to the end of the prompt
  uint8_t priority = kDefaultPriority;  // 0..100
  std::optional<DurationNs> duration;   // nullopt = kept at `priority` until evicted
};

struct KvCacheRetentionConfig {
  std::vector<TokenRangeRetention> token_ranges;  // earlier ranges win where they overlap
  uint8_t decode_priority = kDefaultPriority;     // blocks holding generated tokens
  std::optional<DurationNs> decode_duration;

  // Checks priorities are within 0..100 and ranges are non-empty.
  Status Validate() const;
};

// What one block is stored with.
struct BlockRetention {
  uint8_t priority = kDefaultPriority;
  DurationNs duration = 0;  // 0 = none
};

// The retention of the block covering tokens [first, last) of a sequence whose prompt has
// `prompt_len` tokens (tokens at or past prompt_len were generated).
BlockRetention RetentionForBlock(const KvCacheRetentionConfig& config, uint32_t prompt_len, uint32_t first,
                                 uint32_t last);

}  // namespace kvfleet::kv
