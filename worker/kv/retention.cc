#include "worker/kv/retention.h"

#include <algorithm>

namespace kvfleet::kv {

Status KvCacheRetentionConfig::Validate() const {
  for (const auto& r : token_ranges) {
    if (r.priority > kMaxPriority) return InvalidArgument("retention priority " + std::to_string(r.priority) + " > 100");
    if (r.end && *r.end <= r.start) return InvalidArgument("retention token range is empty");
    if (r.duration && *r.duration <= 0) return InvalidArgument("retention duration must be positive");
  }
  if (decode_priority > kMaxPriority) return InvalidArgument("decode retention priority > 100");
  if (decode_duration && *decode_duration <= 0) return InvalidArgument("decode retention duration must be positive");
  return Status::Ok();
}

BlockRetention RetentionForBlock(const KvCacheRetentionConfig& config, uint32_t prompt_len, uint32_t first,
                                 uint32_t last) {
  BlockRetention best{0, 0};
  bool any = false;
  auto consider = [&](uint8_t priority, std::optional<DurationNs> duration) {
    if (!any || priority > best.priority) {
      best = {priority, duration.value_or(0)};
      any = true;
    }
  };
  // Walk the block's prompt tokens as maximal runs sharing one winning range.
  const uint32_t prompt_last = std::min(last, prompt_len);
  uint32_t t = first;
  while (t < prompt_last) {
    const TokenRangeRetention* winner = nullptr;
    uint32_t run_end = prompt_last;
    for (const auto& r : config.token_ranges) {
      const uint32_t r_end = r.end.value_or(UINT32_MAX);
      if (r.start <= t && t < r_end) {
        winner = &r;
        run_end = std::min(run_end, r_end);
        break;
      }
      // A later-starting range that is earlier in the list cuts the run short.
      if (r.start > t) run_end = std::min(run_end, r.start);
    }
    if (winner != nullptr) {
      consider(winner->priority, winner->duration);
    } else {
      consider(kDefaultPriority, std::nullopt);
    }
    t = run_end;
  }
  if (last > prompt_len) consider(config.decode_priority, config.decode_duration);
  return best;
}

}  // namespace kvfleet::kv
