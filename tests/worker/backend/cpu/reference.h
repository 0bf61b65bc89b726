// Reference logits from Hugging Face transformers (tests/gpu/make_reference.py) and a
// driver that runs sequences through a backend step by step and compares every row.
//
// Thread safety: test-only, single-threaded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "worker/backend/backend.h"

namespace kvfleet::testing {

// The tiny models with HF references in tests/data/model: tiny, tiny-qwen2, tiny-mistral,
// tiny-qwen3. A missing fixture stops the test, naming it.
std::vector<std::string> TinyReferenceModels(const std::string& dir);
// The tiny MoE models with HF references: tiny-mixtral, tiny-qwen3-moe, each only when its
// fixture is in `dir`; an absent one is named on stderr as SKIPPED (they are made on a GPU
// machine: tests/data/model/README.md).
std::vector<std::string> TinyMoeReferenceModels(const std::string& dir);

struct Reference {
  std::string name, shape;
  uint64_t seed = 0;
  int64_t vocab = 0;
  std::vector<std::vector<TokenId>> prompts;  // [prompt][token]
  std::vector<std::vector<TokenId>> greedy;   // [prompt][16 greedy tokens, or the fixture's decode_steps]
  // Per prompt and position of prompt + greedy: the 8 top columns and 128 stride columns.
  std::vector<std::vector<std::vector<int64_t>>> top_ids;
  std::vector<int64_t> stride_columns;
  std::vector<float> values;    // [rows][8 + 128]
  std::vector<int64_t> row0;    // first row of each prompt
  int64_t top_k = 8;
  // Rows where transformers' own bf16 inference is past 0.2 from these fp32 logits (what
  // precision alone costs; make_reference.py's "bf16_rows"), or -1 where not measured.
  int64_t hf_bf16_rows_over = -1;

  // Loads DIR/NAME.json and DIR/NAME.logits.f32; aborts when they are missing or malformed.
  static Reference Load(const std::string& dir, const std::string& name);
  // Whether DIR/NAME.json is there (fixtures made on the GPU machine may not be yet).
  static bool Exists(const std::string& dir, const std::string& name);
  // max |ours - reference| over the stored columns of prompt p's row at `position`.
  float MaxDiff(size_t p, int64_t position, std::span<const float> logits) const;
};

// Hands out distinct block ids.
struct BlockIds {
  backend::BlockId next = 0;
  std::vector<backend::BlockId> Take(int64_t n) {
    std::vector<backend::BlockId> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(next++);
    return v;
  }
};

// One sequence replaying a reference prompt: prefill in chunks, then greedy decode,
// comparing the logits of every computed position with the reference.
struct ReplaySeq {
  const Reference* ref = nullptr;
  size_t prompt = 0;
  int64_t pos = 0;     // next position to compute (> 0: positions before are cached)
  int64_t chunk = 0;   // prefill tokens per step; 0: the whole rest of the prompt
  std::vector<backend::BlockId> table = {};  // one pool
  bool drop_behind_window = false;  // put kNoBlock where no query can see any more
  // Results.
  std::vector<TokenId> generated = {};
  float max_diff = 0;
  int64_t rows_checked = 0;
  bool done = false;

  int64_t prompt_len() const { return static_cast<int64_t>(ref->prompts[prompt].size()); }
  int64_t end() const {  // positions the reference covers
    return prompt_len() + static_cast<int64_t>(ref->greedy[prompt].size());
  }
};

// Runs every sequence to completion, all of them in each step (a mixed batch when they
// are in different phases). REQUIRES: a backend with one KV pool. Fails the test (doctest
// CHECK) on a backend error; returns false then.
bool Replay(backend::ModelBackend& b, std::vector<ReplaySeq*> seqs);

}  // namespace kvfleet::testing
