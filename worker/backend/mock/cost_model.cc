#include "worker/backend/mock/cost_model.h"

#include <cmath>

namespace kvfleet::backend::mock {

Status CostModel::Validate() const {
  for (double v : {step_base_us, prefill_token_us, decode_seq_us, kv_token_read_us, tier_copy_us_per_mib}) {
    if (!std::isfinite(v) || v < 0.0) return InvalidArgument("mock cost model constants must be finite and >= 0");
  }
  return Status::Ok();
}

DurationNs CostModel::StepDuration(const Work& work) const {
  double us = tier_copy_us_per_mib * static_cast<double>(work.tier_copy_bytes) / static_cast<double>(1 << 20);
  if (work.prefill_tokens != 0 || work.decode_seqs != 0) {
    us += step_base_us + prefill_token_us * static_cast<double>(work.prefill_tokens) +
          decode_seq_us * static_cast<double>(work.decode_seqs) +
          kv_token_read_us * static_cast<double>(work.kv_tokens_read);
  }
  return static_cast<DurationNs>(us * static_cast<double>(kNsPerUs));
}

}  // namespace kvfleet::backend::mock
