// The section cache under threads: each thread has its own cache, so threads sharing
// tokenizers and texts must each get exactly the uncached ids. Run under TSan.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>

#include "tests/tokenizer/section_texts.h"
#include "tokenizer/section_cache.h"

namespace kvfleet::tok {
namespace {

TEST_CASE("threads encoding the same repeated sections with two tokenizers all get the uncached ids") {
  std::shared_ptr<const Tokenizer> toks[] = {testing::LoadReal("llama3"), testing::LoadReal("qwen3")};
  std::vector<std::string> texts[2];
  std::vector<std::vector<TokenId>> expected[2];
  for (int t = 0; t < 2; ++t) {
    texts[t] = testing::SectionTexts(*toks[t]);
    texts[t].resize(16);  // the chat renders and the first-and-later sections: enough to overlap
    for (const auto& text : texts[t]) expected[t].push_back(*toks[t]->Encode(text, {.use_section_cache = false}));
  }
  std::atomic<int> mismatches{0};
  std::atomic<uint64_t> hits{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts[0].size(); ++i) {
          int t = static_cast<int>((i + th) % 2);
          size_t k = (i * 5 + th * 3) % texts[t].size();
          auto ids = toks[t]->Encode(texts[t][k]);
          if (!ids.ok() || *ids != expected[t][k]) ++mismatches;
        }
      }
      ThisThreadSectionCache().CheckInvariants();
      hits += ThisThreadSectionCache().hits();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(mismatches.load() == 0);
  CHECK(hits.load() > 0);
}

}  // namespace
}  // namespace kvfleet::tok
