// The cuda backend's mixtures of experts (cuda_backend.h invariant 9) on tiny-mixtral (4
// experts, top-2 renormalised) and tiny-qwen3-moe (8 experts, top-2 raw, a dense layer
// between two MoE layers): teacher-forced against transformers' fp32 references within the
// bf16 tolerance, prefilled whole and in chunks; decode through CUDA graphs against eager;
// two tensor-parallel ranks on one GPU against the cpu backend; LoRA refused.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "tests/gpu/cuda_parity.h"
#include "tests/gpu/graphed_decode.h"
#include "worker/backend/backend.h"

namespace kvfleet::testing {
namespace {

std::vector<std::string> MoeModels() { return TinyMoeReferenceModels(DataDir() + "/model"); }

TEST_CASE("MoE models: logits within bf16 tolerance of transformers', whole and chunked prefill") {
  for (const std::string& name : MoeModels()) {
    Reference ref = Reference::Load(DataDir() + "/model", name);
    for (int64_t chunk : {0, 7}) {
      auto b = Make("cuda", Options(ref.shape, ref.seed, 8));
      BlockIds ids;
      for (size_t p = 0; p < ref.prompts.size(); ++p) {
        ForcedSeq s{.ref = &ref, .prompt = p, .chunk = chunk};
        s.table = ids.Take(BlocksFor(ref, p, 8));
        ForcedReplay(*b, {&s});
        ExpectMatches(s);
        MESSAGE(name << " chunk " << chunk << " prompt " << p << ": max |logit diff| " << s.max_diff << ", greedy "
                     << s.exact << "/" << s.sampled << " exact");
      }
    }
  }
}

TEST_CASE("MoE decode through CUDA graphs gives the tokens of eager execution") {
  for (const char* shape : {"tiny-mixtral", "tiny-qwen3-moe"}) {
    INFO(shape);
    backend::BackendOptions o = OptionsFor(RandomModelDir(shape, 5), 16);
    auto graphs = Make("cuda", o);
    o.extra.emplace("cuda_graphs", "0");
    auto eager = Make("cuda", o);
    constexpr int kSeqs = 5, kSteps = 24;
    std::vector<std::vector<TokenId>> toks(kSeqs);
    std::vector<std::vector<backend::BlockId>> tables(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      for (int i = 0; i < 10 + 7 * s; ++i) toks[s].push_back(static_cast<TokenId>((s * 131 + i * 7919) % 20000 + 50));
      for (int j = 0; j < 8; ++j) tables[s].push_back(static_cast<backend::BlockId>(s * 8 + j));
    }
    GraphedDecode d{toks, tables, {}, kSteps, [](int step) { return step < kSteps / 2 ? kSeqs : 3; }};
    const auto [equal, near] = CompareGraphedDecode(*eager, *graphs, d);
    MESSAGE(shape << ": " << equal << " graph tokens equal to eager, " << near << " near-ties");
    CHECK(equal > 0);
  }
}

TEST_CASE("MoE on two tensor-parallel ranks (one GPU) agrees with the cpu backend") {
  std::vector<TokenId> prompt;
  for (int i = 0; i < 60; ++i) prompt.push_back(static_cast<TokenId>((i * 7919) % 30000 + 100));
  for (const char* shape : {"tiny-mixtral", "tiny-qwen3-moe"}) {
    INFO(shape);
    backend::BackendOptions o = Options(shape, 5, 16);
    auto cpu = Make("cpu", o);
    o.tensor_parallel = 2;
    o.extra["tp_devices"] = "0,0";
    auto gpu = Make("cuda", o);
    CompareWithCpu(*gpu, *cpu, prompt, 23, 12, kBf16Tolerance, false);
  }
}

TEST_CASE("LoRA on an MoE model is refused at start-up") {
  backend::BackendOptions o = Options("tiny-qwen3-moe", 5, 16);
  o.max_loras = 1;
  auto b = backend::CreateBackend("cuda", o);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("LoRA adapters on a mixture of experts") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::testing
