#include "worker/engine/predicted_wait.h"

#include <algorithm>
#include <vector>

namespace kvfleet::engine {

namespace {

// Blocks a request of `tokens` tokens holds once admitted: all of them, and the slot of the
// token its first step samples.
uint64_t BlocksFor(uint64_t tokens, uint32_t block_size) { return (tokens + 1 + block_size - 1) / block_size; }

}  // namespace

double AdmissionWaitSeconds(const QueueSnapshot& q) {
  const uint64_t running = q.running_remaining.size();
  uint64_t slots = q.max_batch_size > running ? q.max_batch_size - running : 0;
  uint64_t blocks = q.free_blocks;
  // Admission is in order and stops at the first request that does not fit.
  uint64_t fit = 0;
  for (uint32_t tokens : q.waiting_tokens) {
    const uint64_t need = BlocksFor(tokens, q.block_size);
    if (slots == 0 || need > blocks) break;
    --slots;
    blocks -= need;
    ++fit;
  }
  const uint64_t blocked = q.waiting_tokens.size() - fit;
  // The newcomer needs a slot and at least its first block.
  if (blocked == 0 && slots > 0 && blocks > 0) return 0;
  if (running == 0 || q.step_s <= 0) return 0;  // nothing to wait for, or no step measured yet
  const uint64_t k = blocked + 1;               // finishes needed before the newcomer is admitted
  std::vector<uint32_t> remaining(q.running_remaining.begin(), q.running_remaining.end());
  if (k <= running) {
    std::nth_element(remaining.begin(), remaining.begin() + static_cast<std::ptrdiff_t>(k - 1), remaining.end());
    return remaining[k - 1] * q.step_s;
  }
  const uint32_t longest = *std::max_element(remaining.begin(), remaining.end());
  const uint64_t batches = (k + running - 1) / running;
  return static_cast<double>(longest) * q.step_s * static_cast<double>(batches);
}

double PredictedWaitSeconds(const QueueSnapshot& q) {
  double prefill = q.prefill_tokens_per_s > 0 ? static_cast<double>(q.prefill_tokens) / q.prefill_tokens_per_s : 0;
  return prefill + AdmissionWaitSeconds(q);
}

double PulledWaitSeconds(const QueueSnapshot& q, bool ahead) {
  if (!ahead) return PredictedWaitSeconds(q);
  QueueSnapshot first = q;
  first.waiting_tokens = {};
  return AdmissionWaitSeconds(first);
}

}  // namespace kvfleet::engine
