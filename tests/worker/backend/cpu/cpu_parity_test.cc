// The cpu backend against Hugging Face transformers (fp32, eager attention): logits of
// every position within 1e-3 and identical greedy tokens, for prompts prefilled whole, in
// chunks, after a reused prefix, and in mixed batches. The references come from
// tests/gpu/make_reference.py (tests/data/model/); the models are regenerated here by
// make-model with the same seeds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "tests/worker/backend/cpu/reference.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"

namespace kvfleet::testing {
namespace {

constexpr float kTolerance = 1e-3f;  // the bound on max |logit difference|, fp32

// The tiny references: Llama 3 style (GQA, tied, llama3 rope scaling), Qwen2 (QKV bias),
// Mistral (MQA, untied, a 20-token sliding window shorter than two of the prompts), Qwen3
// (q_norm/k_norm, head_dim 64 wider than hidden/heads, YaRN x4; 32 greedy tokens).
// Then the mixtures of experts: Mixtral (4 experts, top-2 renormalised) and Qwen3-MoE (8
// experts, top-2 not renormalised, a dense layer between two MoE layers), when their
// fixtures are there (skipped, and said so on stderr, when not).
std::vector<std::string> TinyModels() {
  std::vector<std::string> names = TinyReferenceModels(TestDataDir() + "/model");
  for (std::string& moe : TinyMoeReferenceModels(TestDataDir() + "/model")) names.push_back(std::move(moe));
  return names;
}

std::unique_ptr<backend::ModelBackend> MakeCpu(const Reference& ref, int32_t block_size) {
  backend::BackendOptions o;
  o.model_dir = RandomModelDir(ref.shape, ref.seed);
  o.block_size = block_size;
  o.num_blocks = std::max(512, 4096 / block_size);  // at least 4,096 tokens (B = 1: 4,096 blocks)
  o.max_context = 4096;
  o.threads = 2;
  auto b = backend::CreateBackend("cpu", o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

void ExpectMatches(const ReplaySeq& s) {
  INFO(s.ref->name << " prompt " << s.prompt << " (" << s.prompt_len() << " tokens)");
  CHECK(s.done);
  CHECK(s.max_diff <= kTolerance);
  CHECK(s.generated == s.ref->greedy[s.prompt]);
}

TEST_CASE("prefilled whole, then the reference's greedy steps: logits and tokens match transformers") {
  for (const std::string& name : TinyModels()) {
    Reference ref = Reference::Load(TestDataDir() + "/model", name);
    for (int32_t block_size : {1, 8, 32}) {  // 1: token-level KV, one block per token
      auto b = MakeCpu(ref, block_size);
      BlockIds ids;
      for (size_t p = 0; p < ref.prompts.size(); ++p) {
        ReplaySeq s{.ref = &ref, .prompt = p};
        s.table = ids.Take((s.end() + block_size - 1) / block_size);
        REQUIRE(Replay(*b, {&s}));
        CHECK(s.rows_checked == s.end());
        ExpectMatches(s);
        if (block_size == 8) MESSAGE(name << " prompt " << p << ": max |logit diff| " << s.max_diff);
      }
    }
  }
}

TEST_CASE("a prompt prefilled in several chunks gives the same logits") {
  for (const std::string& name : TinyModels()) {
    Reference ref = Reference::Load(TestDataDir() + "/model", name);
    auto b = MakeCpu(ref, 8);
    BlockIds ids;
    for (int64_t chunk : {1, 3, 7, 16}) {
      for (size_t p = 0; p < ref.prompts.size(); ++p) {
        ReplaySeq s{.ref = &ref, .prompt = p, .chunk = chunk};
        s.table = ids.Take((s.end() + 7) / 8);
        REQUIRE(Replay(*b, {&s}));
        INFO("chunk " << chunk);
        ExpectMatches(s);
      }
    }
  }
}

TEST_CASE("a prefix served from another sequence's blocks, whole or copied mid-block") {
  for (const std::string& name : TinyModels()) {
    Reference ref = Reference::Load(TestDataDir() + "/model", name);
    const int64_t B = 8;
    auto b = MakeCpu(ref, B);
    BlockIds ids;
    for (size_t p = 1; p < ref.prompts.size(); ++p) {  // prompts longer than a block
      ReplaySeq a{.ref = &ref, .prompt = p};
      a.table = ids.Take((a.end() + B - 1) / B);
      REQUIRE(Replay(*b, {&a}));
      ExpectMatches(a);

      // Full blocks: share a's first k blocks and compute from k·B.
      const int64_t k = (a.prompt_len() - 1) / B;
      ReplaySeq shared{.ref = &ref, .prompt = p, .pos = k * B};
      shared.table = ids.Take((a.end() + B - 1) / B);
      std::copy(a.table.begin(), a.table.begin() + k, shared.table.begin());
      REQUIRE(Replay(*b, {&shared}));
      CHECK(shared.rows_checked == shared.end() - k * B);
      ExpectMatches(shared);

      // Partial reuse: the copier duplicates a's block k; computing resumes inside it.
      const int64_t resume = k * B + (a.prompt_len() - 1 - k * B) / 2;
      ReplaySeq partial{.ref = &ref, .prompt = p, .pos = resume};
      partial.table = ids.Take((a.end() + B - 1) / B);
      std::copy(a.table.begin(), a.table.begin() + k, partial.table.begin());
      kv::BlockCopy copy{.pool = 0, .src = a.table[k], .dst = partial.table[k]};
      b->block_copier().Copy(std::span<const kv::BlockCopy>(&copy, 1));
      REQUIRE(Replay(*b, {&partial}));
      ExpectMatches(partial);
    }
  }
}

TEST_CASE("a batch of requests in different phases gives each its own logits") {
  for (const std::string& name : TinyModels()) {
    Reference ref = Reference::Load(TestDataDir() + "/model", name);
    auto b = MakeCpu(ref, 8);
    BlockIds ids;
    // Same prompts twice with different chunkings: prefill chunks, whole prefills and
    // decodes share steps, and two sequences with equal tokens do not disturb each other.
    std::vector<ReplaySeq> seqs;
    const int64_t chunks[] = {0, 5, 11, 4, 0, 2};
    for (size_t i = 0; i < 6; ++i) {
      ReplaySeq s{.ref = &ref, .prompt = i % ref.prompts.size(), .chunk = chunks[i]};
      s.table = ids.Take((s.end() + 7) / 8);
      seqs.push_back(s);
    }
    std::vector<ReplaySeq*> ptrs;
    for (auto& s : seqs) ptrs.push_back(&s);
    REQUIRE(Replay(*b, ptrs));
    for (const auto& s : seqs) ExpectMatches(s);
  }
}

TEST_CASE("sliding window: blocks no query can see may be absent from the table") {
  Reference ref = Reference::Load(TestDataDir() + "/model", "tiny-mistral");
  auto b = MakeCpu(ref, 8);
  REQUIRE(b->pools()[0].window == 20);
  BlockIds ids;
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    ReplaySeq s{.ref = &ref, .prompt = p, .chunk = 6, .drop_behind_window = true};
    s.table = ids.Take((s.end() + 7) / 8);
    REQUIRE(Replay(*b, {&s}));
    ExpectMatches(s);
  }
}

// The larger shapes' references are made on a GPU machine and are not in the repository
// (tests/data/model/README.md): KVFLEET_REFERENCE_DIR=<dir with NAME.json and
// NAME.logits.f32> compares them, and each must be there. Unset, the case is skipped and
// says so on stderr (doctest counts it as skipped, never as passed).
const char* const kLargerShapes[] = {"smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b"};

const char* LargerReferenceDir() {
  const char* dir = std::getenv("KVFLEET_REFERENCE_DIR");
  return dir != nullptr && *dir != 0 ? dir : nullptr;
}

bool SkipLargerShapes() {
  if (LargerReferenceDir() != nullptr) return false;
  std::fprintf(stderr,
               "cpu_parity_test: KVFLEET_REFERENCE_DIR is not set: SKIPPING \"larger shapes match transformers\" "
               "(smollm2-135m, qwen2.5-0.5b, qwen3-0.6b; tests/data/model/README.md says how to make them)\n");
  return true;
}

TEST_CASE("larger shapes match transformers (KVFLEET_REFERENCE_DIR)" * doctest::skip(SkipLargerShapes())) {
  const char* dir = LargerReferenceDir();
  REQUIRE(dir != nullptr);
  for (const char* name : kLargerShapes) {
    REQUIRE_MESSAGE(Reference::Exists(dir, name), dir << "/" << name << ".json is missing (KVFLEET_REFERENCE_DIR)");
  }
  for (const char* name : kLargerShapes) {
    Reference ref = Reference::Load(dir, name);
    auto b = MakeCpu(ref, 32);
    BlockIds ids;
    for (size_t p = 0; p < ref.prompts.size(); ++p) {
      ReplaySeq s{.ref = &ref, .prompt = p, .chunk = p == 2 ? 16 : 0};
      s.table = ids.Take((s.end() + 31) / 32);
      REQUIRE(Replay(*b, {&s}));
      MESSAGE(std::string(name) << " prompt " << p << ": max |logit diff| " << s.max_diff);
      ExpectMatches(s);
    }
  }
}

}  // namespace
}  // namespace kvfleet::testing
