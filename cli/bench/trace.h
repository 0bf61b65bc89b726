// A Mooncake-format request trace (FAST'25 release; ../shared/workloads/README.md) and the
// scaling a replay applies to it.
//
// Each JSONL line is one request: {"timestamp": ms, "input_length": tokens,
// "output_length": tokens, "hash_ids": [one id per 512-token prompt block]}. Two requests
// that carry the same id at the same position share that whole block (and, because the
// trace's ids are prefix-aware, everything before it).
//
// Thread safety: plain values; thread-compatible.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvfleet::bench {

namespace config {
// The trace's block: every hash id stands for this many prompt tokens.
inline constexpr uint32_t kTraceBlockTokens = 512;
}  // namespace config

struct TraceRequest {
  int64_t timestamp_ms = 0;    // arrival, from the start of the trace
  uint32_t input_length = 0;   // prompt tokens
  uint32_t output_length = 0;  // tokens to generate
  std::vector<uint64_t> hash_ids;  // one per 512-token block; the last may be partial
  uint32_t line = 0;           // 1-based line in the file, for messages
};

// Parses JSONL from `in`. Blank lines are skipped. A malformed line (bad JSON, a missing
// or mistyped field, negative values, fewer hash ids than the prompt needs) fails with a
// message naming `source` and the line number. Requests are returned sorted by timestamp
// (stable, so equal timestamps keep file order).
Result<std::vector<TraceRequest>> ParseTrace(std::istream& in, const std::string& source = "trace");
Result<std::vector<TraceRequest>> LoadTrace(const std::string& path);

// How a replay reshapes the trace to fit a machine.
struct TraceScale {
  // Arrivals are divided by this: 10 replays 10x faster. > 0.
  double time_scale = 1.0;
  // Token lengths are divided by this and each 512-token block becomes 512 / length_scale
  // tokens, so sharing between requests is kept. A power of two in [1, 512].
  uint32_t length_scale = 1;
  // Only requests arriving (after time scaling) before this many seconds; 0 = all.
  double duration_s = 0;
  // Requests arriving (after time scaling) before this many seconds are sent but left out of
  // every figure and of the ideal (whose cache they still fill): they warm the workers' caches
  // and the router's measures, and start the conversations whose later turns are measured.
  // 0 = none; below duration_s when that is set.
  double warmup_s = 0;

  Status Validate() const;
  uint32_t block_tokens() const { return config::kTraceBlockTokens / length_scale; }
};

// One request as the replay sends it.
struct ScaledRequest {
  double arrival_s = 0;         // send time from the start of the run
  uint32_t input_length = 0;    // ceil(trace input / length_scale), >= 1
  uint32_t output_length = 0;   // ceil(trace output / length_scale), >= 1
  const TraceRequest* source = nullptr;  // its trace line (hash ids)
};

// Applies `scale` to `trace` (which must outlive the result). Timestamps are taken
// relative to the first request. REQUIRES: scale.Validate().ok().
std::vector<ScaledRequest> ScaleTrace(const std::vector<TraceRequest>& trace, const TraceScale& scale);
// A temporary trace would not outlive the result: its requests would point into freed memory.
std::vector<ScaledRequest> ScaleTrace(std::vector<TraceRequest>&& trace, const TraceScale& scale) = delete;

}  // namespace kvfleet::bench
