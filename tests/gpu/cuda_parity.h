// The cuda backend's parity fixture for the GPU tests: the models and their HF references
// (KVFLEET_TEST_DATA overrides the tests/data folder, since the bundle runs away from the
// source tree), backend options, and ForcedSeq, a reference prompt replayed teacher-forced
// with each row's logits and greedy choice compared within kBf16Tolerance, and
// CompareWithCpu, the same prompt and greedy steps on a gpu and a cpu backend.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/worker/backend/cpu/reference.h"  // Reference, BlockIds
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"

namespace kvfleet::testing {

// Max |logit - fp32 reference| allowed for the bf16 backend on the tiny models (their
// logits reach ~10; bf16 keeps 8 significant bits, ~0.04 on such a logit per rounding,
// and errors add up over the layers). Largest seen on an H200: 0.10 against HF, 0.14
// against the cpu backend (tests/bench/results/).
inline constexpr float kBf16Tolerance = 0.2f;

// KVFLEET_GPU_FULL=1 (tests/gpu/run.sh sets it for a full device run): the long cases run at
// full length (the 1M-token stream). Otherwise the suite fits one 10-minute device call.
inline bool GpuFullRun() {
  const char* e = std::getenv("KVFLEET_GPU_FULL");
  return e != nullptr && std::string(e) == "1";
}

inline std::string DataDir() {
  const char* d = std::getenv("KVFLEET_TEST_DATA");
  return d != nullptr && *d != 0 ? std::string(d) : TestDataDir();
}

// tiny, tiny-qwen2, tiny-mistral, and tiny-qwen3 once its fixture is there.
inline std::vector<std::string> TinyModels() { return TinyReferenceModels(DataDir() + "/model"); }

// Blocks for prompt p of `ref` and its greedy tokens.
inline int64_t BlocksFor(const Reference& ref, size_t p, int64_t block_size) {
  return static_cast<int64_t>(ref.prompts[p].size() + ref.greedy[p].size() + block_size - 1) / block_size;
}

// A dynamic NTK variant of the tiny model whose 16 positions sequences soon outgrow.
inline std::string DynamicTinyDir(uint64_t seed) {
  return VariantModelDir("tiny", seed, "dynamic16", [](nlohmann::json& j) {
    j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
    j["max_position_embeddings"] = 16;
  });
}

inline backend::BackendOptions OptionsFor(const std::string& model_dir, int32_t block_size) {
  backend::BackendOptions o;
  o.model_dir = model_dir;
  o.block_size = block_size;
  o.num_blocks = std::max(512, 4096 / block_size);  // at least 4,096 tokens (B = 1: 4,096 blocks)
  o.max_context = 4096;
  o.max_num_tokens = 1024;
  o.max_batch_size = 16;
  o.threads = 2;
  return o;
}

inline backend::BackendOptions Options(const std::string& shape, uint64_t seed, int32_t block_size) {
  return OptionsFor(RandomModelDir(shape, seed), block_size);
}

inline std::unique_ptr<backend::ModelBackend> Make(const char* name, const backend::BackendOptions& o) {
  auto b = backend::CreateBackend(name, o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

// One sequence replaying a reference prompt teacher-forced: the decode steps are fed the
// reference's greedy tokens, so every computed row is the reference's row and the logits
// comparison stays meaningful after a bf16 near-tie flips one greedy choice (a free-running
// replay would compare rows of different token sequences from there on).
struct ForcedSeq {
  const Reference* ref = nullptr;
  size_t prompt = 0;
  int64_t pos = 0;    // next position to compute (> 0: positions before are cached)
  int64_t chunk = 0;  // prefill tokens per step; 0: the rest of the prompt
  std::vector<backend::BlockId> table = {};
  bool drop_behind_window = false;
  // Results.
  float max_diff = 0;
  int64_t rows_checked = 0;
  int64_t rows_over = 0;  // rows whose max |logit diff| exceeds kBf16Tolerance
  int sampled = 0;        // greedy choices compared
  int exact = 0;          // equal to the reference's
  int near_ties = 0;      // different, where the reference's top-2 gap < kBf16Tolerance
  int wrong = 0;          // different elsewhere: a failure
  std::vector<TokenId> tokens = {};  // prompt + reference greedy

  int64_t prompt_len() const { return static_cast<int64_t>(ref->prompts[prompt].size()); }
  int64_t end() const { return static_cast<int64_t>(tokens.size()); }
};

inline float TopGap(const Reference& ref, size_t p, int64_t position) {
  const int64_t width = ref.top_k + static_cast<int64_t>(ref.stride_columns.size());
  const float* v = &ref.values[(ref.row0[p] + position) * width];
  return v[0] - v[1];
}

// Runs every sequence to its end, all of them in each step. Every KV pool gets the sequence's
// table (each pool has its own block ids). REQUIRES with drop_behind_window: one KV pool.
inline void ForcedReplay(backend::ModelBackend& b, std::vector<ForcedSeq*> seqs) {
  const int64_t B = b.block_size(), window = b.pools()[0].window, V = b.config().vocab_size;
  for (ForcedSeq* s : seqs) {
    s->tokens = s->ref->prompts[s->prompt];
    s->tokens.insert(s->tokens.end(), s->ref->greedy[s->prompt].begin(), s->ref->greedy[s->prompt].end());
  }
  for (;;) {
    backend::StepBatch batch;
    std::vector<ForcedSeq*> in_step;
    for (ForcedSeq* s : seqs) {
      if (s->pos >= s->end()) continue;
      backend::SequenceStep st;
      st.request_id = in_step.size();
      st.start_position = s->pos;
      st.logits = backend::LogitsRequest::kAll;
      int64_t n = 1;
      if (s->pos < s->prompt_len()) n = std::min(s->chunk > 0 ? s->chunk : s->prompt_len(), s->prompt_len() - s->pos);
      st.tokens = std::span<const TokenId>(s->tokens).subspan(s->pos, n);
      st.sample = s->pos + n >= s->prompt_len();
      if (s->drop_behind_window && window > 0) {
        const int64_t first_visible = s->pos - window + 1;
        for (int64_t blk = 0; (blk + 1) * B <= first_visible; ++blk) s->table[blk] = backend::kNoBlock;
      }
      st.block_tables.assign(b.pools().size(), s->table);
      batch.seqs.push_back(st);
      in_step.push_back(s);
    }
    if (in_step.empty()) return;
    backend::StepOutput out;
    Status status = b.Execute(batch, &out);
    REQUIRE_MESSAGE(status.ok(), status.ToString());
    for (size_t i = 0; i < in_step.size(); ++i) {
      ForcedSeq* s = in_step[i];
      const int64_t n = static_cast<int64_t>(batch.seqs[i].tokens.size());
      for (int64_t j = 0; j < n; ++j) {
        std::span<const float> row(&out.logits[(out.logits_offset[i] + j) * V], V);
        const float d = s->ref->MaxDiff(s->prompt, s->pos + j, row);
        s->max_diff = std::max(s->max_diff, d);
        s->rows_over += d > kBf16Tolerance;
        ++s->rows_checked;
      }
      const int64_t last = s->pos + n - 1;  // its greedy choice is the reference's token last + 1
      if (batch.seqs[i].sample && last + 1 < s->end()) {
        ++s->sampled;
        if (out.tokens[i] == s->tokens[last + 1]) {
          ++s->exact;
        } else if (TopGap(*s->ref, s->prompt, last) < kBf16Tolerance) {
          ++s->near_ties;
          MESSAGE(s->ref->name << " prompt " << s->prompt << " position " << last << ": a near-tie flipped (reference gap "
                               << TopGap(*s->ref, s->prompt, last) << ")");
        } else {
          ++s->wrong;
        }
      }
      s->pos += n;
    }
  }
}

inline void ExpectMatches(const ForcedSeq& s) {
  INFO(s.ref->name << " prompt " << s.prompt << " (" << s.prompt_len() << " tokens)");
  CHECK(s.pos == s.end());
  CHECK(s.max_diff <= kBf16Tolerance);
  CHECK(s.wrong == 0);
  CHECK(s.exact + s.near_ties == s.sampled);
}

// Runs `prompt` (in chunks of `chunk`) then `decode` greedy steps on both backends, both
// fed the cpu backend's greedy tokens; every row's logits must agree within `tolerance`.
// Greedy tokens must be identical when `exact_tokens`; otherwise a different choice is
// allowed only where the cpu's logit of the gpu's token is within `tolerance` of its max
// (a near-tie bf16 rounding can flip).
inline void CompareWithCpu(backend::ModelBackend& gpu, backend::ModelBackend& cpu, std::span<const TokenId> prompt,
                           int64_t chunk, int decode, float tolerance = kBf16Tolerance, bool exact_tokens = false,
                           bool dense_prompt = false) {
  const int64_t B = gpu.block_size(), V = gpu.config().vocab_size;
  const int64_t end = static_cast<int64_t>(prompt.size()) + decode;
  std::vector<backend::BlockId> table;
  for (int64_t i = 0; i < (end + B - 1) / B; ++i) table.push_back(static_cast<backend::BlockId>(i));
  std::vector<TokenId> gen_gpu, gen_cpu;
  float max_diff = 0;
  int64_t pos = 0;
  while (pos < end) {
    backend::SequenceStep st;
    TokenId tok = 0;
    if (pos < static_cast<int64_t>(prompt.size())) {
      const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(prompt.size()) - pos);
      st.tokens = prompt.subspan(pos, n);
      st.sample = pos + n == static_cast<int64_t>(prompt.size());
    } else {
      tok = gen_cpu.back();
      st.tokens = std::span<const TokenId>(&tok, 1);
      st.sample = true;
    }
    st.start_position = pos;
    st.context_end = dense_prompt ? static_cast<int64_t>(prompt.size()) : 0;
    st.logits = backend::LogitsRequest::kAll;
    st.block_tables.assign(gpu.pools().size(), table);  // every pool the same ids (Llama 4 has two)
    backend::StepBatch batch;
    batch.seqs = {st};
    backend::StepOutput og, oc;
    REQUIRE(gpu.Execute(batch, &og).ok());
    REQUIRE(cpu.Execute(batch, &oc).ok());
    REQUIRE(og.logits.size() == oc.logits.size());
    for (size_t i = 0; i < og.logits.size(); ++i) max_diff = std::max(max_diff, std::fabs(og.logits[i] - oc.logits[i]));
    if (st.sample) {
      gen_gpu.push_back(og.tokens[0]);
      gen_cpu.push_back(oc.tokens[0]);
      if (!exact_tokens && og.tokens[0] != oc.tokens[0]) {
        const float* last = &oc.logits[oc.logits.size() - static_cast<size_t>(V)];
        MESSAGE("position " << pos << ": gpu chose " << og.tokens[0] << " (cpu logit " << last[og.tokens[0]]
                            << "), cpu chose " << oc.tokens[0] << " (" << last[oc.tokens[0]] << ")");
        CHECK(last[og.tokens[0]] >= last[oc.tokens[0]] - tolerance);
      }
    }
    pos += static_cast<int64_t>(st.tokens.size());
  }
  MESSAGE("prompt of " << prompt.size() << ", chunk " << chunk << ": max |logit diff| vs cpu " << max_diff);
  CHECK(max_diff <= tolerance);
  if (exact_tokens) CHECK(gen_gpu == gen_cpu);
}

}  // namespace kvfleet::testing
