// The section cache: its LRU bound on its own, and on real tokenizers that a cached
// encode gives exactly the ids of an uncached one, whatever the order of the texts, the
// options, the bound, and the other tokenizers sharing the thread.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "tests/tokenizer/byte_level_bpe.h"
#include "tests/tokenizer/section_texts.h"
#include "tokenizer/section_cache.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok {
namespace {

using json = nlohmann::json;
using testing::LoadMetaspaceFirst;
using testing::LoadReal;
using testing::SectionTexts;

std::vector<TokenId> Ids(std::initializer_list<TokenId> ids) { return ids; }

TEST_CASE("the least recently used entry goes first, and a lookup makes an entry recent") {
  std::string a(600, 'a'), b(600, 'b'), c(600, 'c'), d(600, 'd');
  SectionCache cache(3 * SectionCache::Charge(600, 2));
  cache.Insert({1, true, false, a}, Ids({1, 2}));
  cache.Insert({1, true, false, b}, Ids({3, 4}));
  cache.Insert({1, true, false, c}, Ids({5, 6}));
  std::vector<TokenId> out;
  CHECK(cache.Lookup({1, true, false, a}, &out));
  cache.Insert({1, true, false, d}, Ids({7, 8}));  // evicts b, not a
  cache.CheckInvariants();
  CHECK(cache.entries() == 3);
  CHECK_FALSE(cache.Lookup({1, true, false, b}, &out));
  CHECK(cache.Lookup({1, true, false, c}, &out));
  CHECK(cache.Lookup({1, true, false, d}, &out));
  CHECK(cache.Lookup({1, true, false, a}, &out));
  CHECK(out == Ids({1, 2, 5, 6, 7, 8, 1, 2}));
}

TEST_CASE("every key field tells entries apart: tokenizer, parse_special, first section, text") {
  std::string text(700, 'x');
  SectionCache cache;
  cache.Insert({1, true, false, text}, Ids({1}));
  cache.Insert({2, true, false, text}, Ids({2}));
  cache.Insert({1, false, false, text}, Ids({3}));
  cache.Insert({1, true, true, text}, Ids({4}));
  cache.Insert({1, true, false, text + "y"}, Ids({5}));
  std::vector<TokenId> out;
  for (SectionKey key : {SectionKey{1, true, false, text}, SectionKey{2, true, false, text},
                         SectionKey{1, false, false, text}, SectionKey{1, true, true, text}}) {
    CHECK(cache.Lookup(key, &out));
  }
  std::string longer = text + "y";
  CHECK(cache.Lookup({1, true, false, longer}, &out));
  CHECK(out == Ids({1, 2, 3, 4, 5}));
  CHECK_FALSE(cache.Lookup({3, true, false, text}, &out));
  cache.CheckInvariants();
}

TEST_CASE("an entry larger than the bound is not stored; a smaller bound evicts at once") {
  SectionCache cache(SectionCache::Charge(1000, 10));
  std::string big(2000, 'b'), small(900, 's');
  cache.Insert({1, true, false, big}, std::vector<TokenId>(10, 7));
  CHECK(cache.entries() == 0);
  cache.Insert({1, true, false, small}, std::vector<TokenId>(10, 7));
  CHECK(cache.entries() == 1);
  cache.set_max_bytes(100);
  CHECK(cache.entries() == 0);
  CHECK(cache.bytes() == 0);
  cache.CheckInvariants();
}

// Property: random inserts and lookups against a model (a recency-ordered list).
TEST_CASE("random inserts and lookups agree with a simple LRU model and stay within the bound") {
  std::mt19937 rng(42);
  const size_t bound = 20000;
  SectionCache cache(bound);
  struct ModelEntry {
    std::string text;
    std::vector<TokenId> ids;
  };
  std::vector<ModelEntry> model;  // front: most recent
  size_t model_bytes = 0;
  for (int op = 0; op < 4000; ++op) {
    std::string text = "t" + std::to_string(rng() % 40) + std::string(500 + rng() % 3000, 'z');
    text.resize(text.size() - text.size() % 7);  // a few lengths collide, texts differ by prefix
    auto it = std::find_if(model.begin(), model.end(), [&](const ModelEntry& e) { return e.text == text; });
    if (rng() % 2) {
      std::vector<TokenId> out;
      bool hit = cache.Lookup({9, true, false, text}, &out);
      REQUIRE(hit == (it != model.end()));
      if (hit) {
        REQUIRE(out == it->ids);
        std::rotate(model.begin(), it, it + 1);
      }
    } else {
      std::vector<TokenId> ids(rng() % 300, static_cast<TokenId>(op));
      if (it != model.end()) {
        model_bytes -= SectionCache::Charge(it->text.size(), it->ids.size());
        model.erase(it);
      }
      size_t charge = SectionCache::Charge(text.size(), ids.size());
      while (model_bytes + charge > bound && !model.empty()) {
        model_bytes -= SectionCache::Charge(model.back().text.size(), model.back().ids.size());
        model.pop_back();
      }
      model.insert(model.begin(), {text, ids});
      model_bytes += charge;
      cache.Insert({9, true, false, text}, ids);
    }
    cache.CheckInvariants();
    REQUIRE(cache.entries() == model.size());
    REQUIRE(cache.bytes() == model_bytes);
  }
}

struct Pass {
  size_t mismatches = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
};

// Encodes every text under every option in `order`, comparing with `expected`.
Pass EncodeAll(const Tokenizer& tok, const std::vector<std::string>& texts, const std::vector<size_t>& order,
               const std::vector<std::vector<TokenId>>& expected, size_t bound) {
  SectionCache& cache = ThisThreadSectionCache();
  uint64_t hits0 = cache.hits(), misses0 = cache.misses();
  Pass pass;
  for (size_t k : order) {
    for (int opt = 0; opt < 4; ++opt) {
      EncodeOptions options{.add_special_tokens = (opt & 1) != 0, .parse_special = (opt & 2) != 0};
      auto ids = tok.Encode(texts[k], options);
      REQUIRE(ids.ok());
      if (*ids != expected[k * 4 + opt] && ++pass.mismatches <= 3) {
        MESSAGE("text " << k << " option " << opt << ": cached ids differ from uncached ones");
      }
      REQUIRE(cache.bytes() <= bound);
    }
  }
  cache.CheckInvariants();
  pass.hits = cache.hits() - hits0;
  pass.misses = cache.misses() - misses0;
  return pass;
}

void CheckCachedEqualsUncached(const Tokenizer& tok) {
  std::vector<std::string> texts = SectionTexts(tok);
  std::vector<std::vector<TokenId>> expected;
  for (const std::string& text : texts) {
    for (int opt = 0; opt < 4; ++opt) {
      EncodeOptions options{.add_special_tokens = (opt & 1) != 0, .parse_special = (opt & 2) != 0,
                            .use_section_cache = false};
      auto ids = tok.Encode(text, options);
      REQUIRE(ids.ok());
      expected.push_back(*ids);
    }
  }
  SectionCache& cache = ThisThreadSectionCache();
  std::vector<size_t> order(texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(7);
  // The default bound, then one that holds only a few sections, so that texts evict each other.
  for (size_t bound : {config::kSectionCacheMaxBytes, size_t{24} << 10}) {
    CAPTURE(bound);
    cache.Clear();
    cache.set_max_bytes(bound);
    Pass first = EncodeAll(tok, texts, order, expected, bound);
    Pass again = EncodeAll(tok, texts, order, expected, bound);
    CHECK(first.mismatches == 0);
    CHECK(again.mismatches == 0);
    CHECK(first.hits > 0);  // the chat renders repeat their system prompt
    if (bound == config::kSectionCacheMaxBytes) {
      CHECK(again.misses == 0);  // everything fits: the second pass only hits
    } else {
      CHECK(again.misses > 0);  // texts evicted each other
    }
    for (int round = 0; round < 3; ++round) {
      std::shuffle(order.begin(), order.end(), rng);
      CHECK(EncodeAll(tok, texts, order, expected, bound).mismatches == 0);
    }
  }
  cache.Clear();
  cache.set_max_bytes(config::kSectionCacheMaxBytes);
}

TEST_CASE("Llama 3: cached encodes equal uncached ones in any order, option and bound") {
  CheckCachedEqualsUncached(*LoadReal("llama3"));
}
TEST_CASE("Llama 3.1: cached encodes equal uncached ones") { CheckCachedEqualsUncached(*LoadReal("llama3_1")); }
TEST_CASE("Qwen3 (NFC normalizer): cached encodes equal uncached ones") { CheckCachedEqualsUncached(*LoadReal("qwen3")); }
TEST_CASE("Llama 2 (Prepend normalizer, byte fallback): cached encodes equal uncached ones") {
  CheckCachedEqualsUncached(*LoadReal("llama2"));
}

TEST_CASE("Metaspace prepend_scheme first: a section cached first is not reused later, nor the reverse") {
  for (bool split : {false, true}) {
    CAPTURE(split);
    auto tok = LoadMetaspaceFirst(split);
    std::string body = testing::SystemPrompt().substr(100, 2000);
    std::string special = tok->IdToToken(tok->eos_token_ids().front());
    EncodeOptions uncached{.add_special_tokens = false, .use_section_cache = false};
    auto first = *tok->Encode(body, uncached);
    auto later = *tok->Encode(special + body, uncached);
    later.erase(later.begin());
    REQUIRE(first != later);  // the case this test is about: "▁" prepended only in section 0
    ThisThreadSectionCache().Clear();
    for (int round = 0; round < 3; ++round) {
      auto later_cached = *tok->Encode(special + body, {.add_special_tokens = false});
      later_cached.erase(later_cached.begin());
      CHECK(later_cached == later);
      CHECK(*tok->Encode(body, {.add_special_tokens = false}) == first);
    }
    CheckCachedEqualsUncached(*tok);
  }
}

TEST_CASE("two tokenizers on one thread never share entries: Llama 3 and Qwen3 alternate on one text") {
  auto llama = LoadReal("llama3");
  auto qwen = LoadReal("qwen3");
  std::string text = testing::SystemPrompt();
  EncodeOptions uncached{.use_section_cache = false};
  auto llama_ids = *llama->Encode(text, uncached);
  auto qwen_ids = *qwen->Encode(text, uncached);
  REQUIRE(llama_ids != qwen_ids);
  ThisThreadSectionCache().Clear();
  for (int round = 0; round < 4; ++round) {
    CHECK(*llama->Encode(text) == llama_ids);
    CHECK(*qwen->Encode(text) == qwen_ids);
  }
  CHECK(ThisThreadSectionCache().entries() == 2);
}

// A byte-level BPE over the 256 byte symbols with the given merges; `normalized_special`
// adds a normalizer and a special token matched after normalization.
std::shared_ptr<const Tokenizer> TinyByteLevel(const std::vector<std::pair<std::string, std::string>>& merges,
                                               bool normalized_special = false) {
  json t;
  t["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  t["decoder"] = {{"type", "ByteLevel"}};
  t["model"] = testing::ByteLevelBpeModel(merges);
  if (normalized_special) {
    t["normalizer"] = {{"type", "NFC"}};
    t["added_tokens"] = json::array({{{"id", 400}, {"content", "<|sep|>"}, {"single_word", false}, {"lstrip", false},
                                      {"rstrip", false}, {"normalized", true}, {"special", true}}});
  }
  auto tok = Tokenizer::FromJson(t.dump(), "{}");
  REQUIRE_MESSAGE(tok.ok(), tok.status().ToString());
  return *tok;
}

TEST_CASE("a tokenizer loaded after another is freed never gets the freed one's entries") {
  // Regression guard: keying by address would hit here when the allocator reuses it.
  std::string text;
  while (text.size() < 2000) text += "hello shell ";
  std::vector<TokenId> he_ids, ll_ids;
  for (int round = 0; round < 8; ++round) {
    auto he = TinyByteLevel({{"h", "e"}});
    auto ids = *he->Encode(text);
    if (round == 0) he_ids = *he->Encode(text, {.use_section_cache = false});
    CHECK(ids == he_ids);
    he.reset();
    auto ll = TinyByteLevel({{"l", "l"}});
    ids = *ll->Encode(text);
    if (round == 0) ll_ids = *ll->Encode(text, {.use_section_cache = false});
    CHECK(ids == ll_ids);
  }
  CHECK(he_ids != ll_ids);
}

TEST_CASE("parse_special is part of the key: a normalized special token splits one section only when parsed") {
  // The same section text gives different ids by parse_special when the special token is
  // matched after normalization (normalized: true), inside the section.
  auto tok = TinyByteLevel({{"h", "e"}}, /*normalized_special=*/true);
  std::string half(600, 'a');
  std::string text = half + "<|sep|>" + half;
  EncodeOptions parsed{.add_special_tokens = false, .use_section_cache = false};
  EncodeOptions plain{.add_special_tokens = false, .parse_special = false, .use_section_cache = false};
  auto parsed_ids = *tok->Encode(text, parsed);
  auto plain_ids = *tok->Encode(text, plain);
  REQUIRE(std::count(parsed_ids.begin(), parsed_ids.end(), 400) == 1);
  REQUIRE(std::count(plain_ids.begin(), plain_ids.end(), 400) == 0);
  ThisThreadSectionCache().Clear();
  for (int round = 0; round < 3; ++round) {
    CHECK(*tok->Encode(text, {.add_special_tokens = false}) == parsed_ids);
    CHECK(*tok->Encode(text, {.add_special_tokens = false, .parse_special = false}) == plain_ids);
  }
}

}  // namespace
}  // namespace kvfleet::tok
