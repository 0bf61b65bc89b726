// The cpu backend on Llama 4's text model (tiny-llama4: 4 layers, MoE on 1 and 3 with a
// shared expert, layer 3 NoPE, 16-token chunks on the RoPE layers, temperature tuning from
// position 7) against llama4_reference.py, a pure-Python model of transformers'
// modeling_llama4.py that reads the checkpoint itself: every row's logits within 2e-3 and the
// same argmax, for a 40-token prompt prefilled whole (three attention chunks), in chunks that
// straddle the chunk boundaries, and after a prefix served from another sequence's blocks.
// The same for Llama4ForConditionalGeneration's layout (text_config, tensors under
// language_model.); and two tensor-parallel ranks against one.
// Needs python3 (Debian CI has it); without it the comparison is skipped, saying so.
// Then against transformers itself: tests/data/model/tiny-llama4.* (tests/gpu/make_reference.py
// with tests/gpu/llama4_manifest.json), every stored column within 1e-3 and the greedy tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tests/worker/backend/cpu/reference.h"
#include "tests/worker/model/test_models.h"
#include "worker/backend/backend.h"
#include "worker/model/model_config.h"
#include "worker/model/random_model.h"

namespace kvfleet::backend {
namespace {

constexpr float kTolerance = 2e-3f;  // fp32 sums against Python doubles, logits of a few units
constexpr int kVocab = 512;          // a small LM head keeps the Python reference to seconds
constexpr int32_t kBlock = 8;

std::vector<TokenId> Prompt() {
  std::vector<TokenId> t;
  for (int i = 0; i < 40; ++i) t.push_back(static_cast<TokenId>((i * 7919 + 17) % kVocab));
  return t;
}

std::string ModelDir() { return testing::SmallVocabModelDir("tiny-llama4", 3, kVocab); }

// tiny-llama4's text model as Llama4ForConditionalGeneration writes it (other weights: the
// names, and so the generator's keys, differ), made once per machine beside the test models.
std::string ConditionalModelDir() {
  namespace fs = std::filesystem;
  const fs::path text_dir = ModelDir();
  const fs::path dir = text_dir.parent_path() / (text_dir.filename().string() + "-conditional");
  if (fs::exists(dir / "config.json")) return dir.string();
  std::stringstream text;
  text << std::ifstream(text_dir / "config.json").rdbuf();
  nlohmann::json config{{"architectures", {"Llama4ForConditionalGeneration"}},
                        {"model_type", "llama4"},
                        {"text_config", nlohmann::json::parse(text.str())},
                        {"tie_word_embeddings", false},
                        {"vision_config", {{"hidden_size", 1408}, {"model_type", "llama4_vision_model"}}}};
  const fs::path partial = dir.string() + ".tmp" + std::to_string(::getpid());
  model::RandomModelOptions o;
  o.config = config;
  o.tokenizer_dir = text_dir.string();
  o.out_dir = partial.string();
  o.seed = 3;
  Status st = model::MakeRandomModel(o);
  REQUIRE_MESSAGE(st.ok(), st.ToString());
  std::error_code ec;
  fs::rename(partial, dir, ec);  // another process may have won the race: use its copy
  if (ec) fs::remove_all(partial, ec);
  return dir.string();
}

// The reference's logits of every position of `tokens`, [T][vocab]; empty without python3.
std::vector<std::vector<float>> ReferenceLogits(const std::string& dir, const std::vector<TokenId>& tokens) {
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) {
    std::fprintf(stderr, "SKIPPED: python3 is not installed; the Llama 4 reference comparison needs it\n");
    return {};
  }
  std::string cmd = "python3 " + testing::TestDataDir() + "/../worker/backend/cpu/llama4_reference.py " + dir;
  for (TokenId t : tokens) cmd += " " + std::to_string(t);
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  REQUIRE(::pclose(p) == 0);
  const nlohmann::json j = nlohmann::json::parse(out);
  return j["logits"].get<std::vector<std::vector<float>>>();
}

std::unique_ptr<ModelBackend> MakeCpu(const std::string& dir = ModelDir(), int tensor_parallel = 1) {
  BackendOptions o;
  o.model_dir = dir;
  o.tensor_parallel = tensor_parallel;
  o.block_size = kBlock;
  o.num_blocks = 64;
  o.max_context = 256;
  o.threads = 2;
  auto b = CreateBackend("cpu", o);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return std::move(b).value();
}

// Logits of tokens[from..] (the positions before are in `table`'s blocks already), prefilled
// in steps of `chunk` (0: the rest at once). Every pool gets the same block ids.
std::vector<std::vector<float>> Run(ModelBackend& b, const std::vector<TokenId>& tokens, size_t from, size_t chunk,
                                    const std::vector<BlockId>& table) {
  std::vector<std::vector<float>> rows;
  const int64_t V = kVocab;
  for (size_t pos = from; pos < tokens.size();) {
    const size_t n = chunk > 0 ? std::min(chunk, tokens.size() - pos) : tokens.size() - pos;
    StepBatch batch;
    SequenceStep s;
    s.start_position = static_cast<int64_t>(pos);
    s.tokens = std::span<const TokenId>(tokens).subspan(pos, n);
    s.block_tables.assign(b.pools().size(), table);
    s.logits = LogitsRequest::kAll;
    batch.seqs.push_back(s);
    StepOutput out;
    Status st = b.Execute(batch, &out);
    REQUIRE_MESSAGE(st.ok(), st.ToString());
    for (size_t r = 0; r < n; ++r) rows.emplace_back(out.logits.begin() + r * V, out.logits.begin() + (r + 1) * V);
    pos += n;
  }
  return rows;
}

// Max |ours - reference| over rows [from, ...) of the reference, and argmax agreement.
void ExpectMatches(const std::vector<std::vector<float>>& ours, const std::vector<std::vector<float>>& ref,
                   size_t from) {
  REQUIRE(ours.size() + from == ref.size());
  float d = 0, scale = 0;
  for (size_t r = 0; r < ours.size(); ++r) {
    const auto& want = ref[from + r];
    for (size_t v = 0; v < want.size(); ++v) {
      d = std::max(d, std::fabs(ours[r][v] - want[v]));
      scale = std::max(scale, std::fabs(want[v]));
    }
    CHECK(std::max_element(ours[r].begin(), ours[r].end()) - ours[r].begin() ==
          std::max_element(want.begin(), want.end()) - want.begin());
  }
  MESSAGE("max |logit difference| " << d << " over logits up to " << scale);
  CHECK(d <= kTolerance);
  CHECK(scale > 1.0f);  // the logits are not near zero, so the bound means something
}

TEST_CASE("Llama 4: the config of tiny-llama4 has what the comparison exercises") {
  auto c = model::LoadModelConfig(ModelDir());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == model::Architecture::kLlama4);
  CHECK(c->layer_nope == std::vector<bool>{false, false, false, true});
  CHECK(c->layer_chunked == std::vector<bool>{true, true, true, false});
  CHECK(c->moe.layer_sparse == std::vector<bool>{false, true, false, true});
  CHECK(c->attention_chunk_size == 16);
  CHECK(c->floor_scale == 8);
  auto b = MakeCpu();
  CHECK(b->pools().size() == 2);  // the NoPE layer's full-attention pool and the chunked one
}

TEST_CASE("Llama 4: logits match transformers' semantics, whole, chunked and after a reused prefix") {
  const std::vector<TokenId> tokens = Prompt();
  static const auto ref = ReferenceLogits(ModelDir(), tokens);  // once for the three subcases
  if (ref.empty()) return;
  auto b = MakeCpu();
  std::vector<BlockId> table;
  for (BlockId i = 0; i < 5; ++i) table.push_back(i);
  SUBCASE("whole prompt: three chunks of the RoPE layers' attention") { ExpectMatches(Run(*b, tokens, 0, 0, table), ref, 0); }
  SUBCASE("prefilled 7 tokens a step, across the chunk and block boundaries") {
    ExpectMatches(Run(*b, tokens, 0, 7, table), ref, 0);
  }
  SUBCASE("a second sequence reuses the first's 32-token prefix blocks, then decodes token by token") {
    (void)Run(*b, tokens, 0, 0, table);
    std::vector<BlockId> second(table.begin(), table.begin() + 4);  // positions 0..31, shared
    second.push_back(10);                                            // its own block for 32..39
    ExpectMatches(Run(*b, tokens, 32, 1, second), ref, 32);
  }
}

TEST_CASE("Llama 4: logits and greedy tokens match transformers' own Llama4ForCausalLM") {
  const std::string data = testing::TestDataDir() + "/model";
  if (!testing::Reference::Exists(data, "tiny-llama4")) {
    std::fprintf(stderr, "SKIPPED: %s/tiny-llama4.json is missing (tests/data/model/README.md)\n", data.c_str());
    return;
  }
  const testing::Reference ref = testing::Reference::Load(data, "tiny-llama4");
  REQUIRE(ref.shape == "tiny-llama4");
  REQUIRE(ref.seed == 3);  // ModelDir()'s model: make-model's seed 3 over a 512-token vocabulary
  REQUIRE(ref.vocab == kVocab);
  auto b = MakeCpu();
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    std::vector<TokenId> tokens = ref.prompts[p];
    tokens.insert(tokens.end(), ref.greedy[p].begin(), ref.greedy[p].end());
    std::vector<BlockId> table;
    for (BlockId i = 0; i * kBlock < static_cast<BlockId>(tokens.size()); ++i) table.push_back(i);
    for (size_t chunk : {size_t{0}, size_t{5}}) {  // whole, and 5 tokens a step across the 16-token chunks
      CAPTURE(p);
      CAPTURE(chunk);
      const auto rows = Run(*b, tokens, 0, chunk, table);
      REQUIRE(rows.size() == tokens.size());
      float d = 0;
      std::vector<TokenId> greedy;
      for (size_t r = 0; r < rows.size(); ++r) {
        d = std::max(d, ref.MaxDiff(p, static_cast<int64_t>(r), rows[r]));
        if (r + 1 >= ref.prompts[p].size() && r + 1 < rows.size()) {
          greedy.push_back(static_cast<TokenId>(std::max_element(rows[r].begin(), rows[r].end()) - rows[r].begin()));
        }
      }
      MESSAGE("prompt " << p << " (" << ref.prompts[p].size() << " tokens): max |logit diff| " << d);
      CHECK(d <= 1e-3f);  // the bound for fp32 against transformers
      CHECK(greedy == ref.greedy[p]);  // row len-1+i chose greedy token i
    }
  }
}

TEST_CASE("Llama 4: Llama4ForConditionalGeneration's text model, read from under language_model.") {
  const std::string dir = ConditionalModelDir();
  std::vector<TokenId> tokens = Prompt();
  tokens.resize(20);  // past one chunk
  const auto ref = ReferenceLogits(dir, tokens);
  if (ref.empty()) return;
  auto b = MakeCpu(dir);
  ExpectMatches(Run(*b, tokens, 0, 0, {0, 1, 2}), ref, 0);
}

TEST_CASE("Llama 4: two tensor-parallel ranks give one rank's logits") {
  const std::vector<TokenId> tokens = Prompt();
  const std::vector<BlockId> table{0, 1, 2, 3, 4};
  auto one = MakeCpu(ModelDir(), 1);
  auto two = MakeCpu(ModelDir(), 2);
  const auto a = Run(*one, tokens, 0, 9, table), b = Run(*two, tokens, 0, 9, table);
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t r = 0; r < a.size(); ++r) {
    for (size_t v = 0; v < a[r].size(); ++v) d = std::max(d, std::fabs(a[r][v] - b[r][v]));
  }
  CHECK(d <= 1e-4f);
}

}  // namespace
}  // namespace kvfleet::backend
