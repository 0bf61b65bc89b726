// Graphed decode against eager decode, for the cuda backend tests: the same model in two
// backends, one with CUDA graphs and one without. Each prompt is prefilled on both (eager in
// both), then `steps` decode steps run with batch_at(step) sequences; the graphed backend
// only samples, the eager one also returns logits (which keeps its steps eager). Each graphed
// token must equal the eager one, or be a near-tie by the eager logits (within kNearTie of
// its argmax: kernels that sum in another order). Test-only; include from the gpu tests.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "worker/backend/backend.h"

namespace kvfleet::testing {

struct GraphedDecode {
  std::vector<std::vector<TokenId>> prompts;            // one per sequence; grows by the tokens decoded
  std::vector<std::vector<backend::BlockId>> tables;    // one per sequence
  std::vector<int32_t> lora_slots;                      // one per sequence, or empty (no adapter)
  int steps = 24;
  std::function<int(int step)> batch_at;                // sequences in the step (the first n)
};

struct GraphedDecodeTally {
  int equal = 0;  // graphed tokens equal to eager
  int near = 0;   // near-ties
};

inline GraphedDecodeTally CompareGraphedDecode(backend::ModelBackend& eager, backend::ModelBackend& graphs,
                                               GraphedDecode& d) {
  constexpr float kNearTie = 0.05f;
  auto step_of = [&](size_t s) {
    backend::SequenceStep st;
    st.block_tables.assign(eager.pools().size(), d.tables[s]);  // every pool the same ids
    st.sample = true;
    st.lora_slot = d.lora_slots.empty() ? -1 : d.lora_slots[s];
    return st;
  };
  for (size_t s = 0; s < d.prompts.size(); ++s) {
    backend::StepBatch batch;
    backend::SequenceStep st = step_of(s);
    st.tokens = d.prompts[s];
    batch.seqs = {st};
    backend::StepOutput a, b;
    REQUIRE(eager.Execute(batch, &a).ok());
    REQUIRE(graphs.Execute(batch, &b).ok());
    CHECK(a.tokens == b.tokens);
    d.prompts[s].push_back(a.tokens[0]);
  }
  GraphedDecodeTally t;
  const int64_t V = eager.config().vocab_size;
  for (int step = 0; step < d.steps; ++step) {
    const int n = d.batch_at(step);
    backend::StepBatch ge, gg;
    for (int s = 0; s < n; ++s) {
      backend::SequenceStep st = step_of(static_cast<size_t>(s));
      st.tokens = std::span<const TokenId>(&d.prompts[s].back(), 1);
      st.start_position = static_cast<int64_t>(d.prompts[s].size()) - 1;
      gg.seqs.push_back(st);
      st.logits = backend::LogitsRequest::kLast;
      ge.seqs.push_back(st);
    }
    backend::StepOutput oe, og;
    REQUIRE(eager.Execute(ge, &oe).ok());
    REQUIRE(graphs.Execute(gg, &og).ok());
    for (int s = 0; s < n; ++s) {
      const float* row = &oe.logits[static_cast<size_t>(oe.logits_offset[s] * V)];
      if (og.tokens[s] == oe.tokens[s]) {
        ++t.equal;
      } else {
        ++t.near;
        CHECK(row[og.tokens[s]] >= row[oe.tokens[s]] - kNearTie);
      }
      d.prompts[s].push_back(oe.tokens[s]);
    }
  }
  return t;
}

}  // namespace kvfleet::testing
