// The matcher: masks equal brute force (with and without the token cache), tokens that
// straddle structure or split a character, stop tokens, rollback, bounded stacks, and the
// grammar cache.
#include <algorithm>
#include <atomic>
#include <thread>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/ebnf_parser.h"
#include "grammar/pda.h"
#include "tests/grammar/grammar_test_util.h"

namespace kvfleet::grammar {
namespace {

using testing::Allowed;
using testing::BruteForceMask;
using testing::Mask;
using testing::MultiVocab;
using testing::MustCompile;

const char* kNestedEbnf = R"(
  root ::= value
  value ::= obj | arr | str | num | "true" | "null"
  obj ::= "{" (str ":" value ("," str ":" value)*)? "}"
  arr ::= "[" (value ("," value)*)? "]"
  str ::= "\"" ([^"\\] | "\\" ["\\n])* "\""
  num ::= "-"? [0-9]+ ("." [0-9]+)?
)";

const char* kSchema = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":5},"id":{"type":"integer","minimum":-20,"maximum":20},
    "tags":{"type":"array","items":{"enum":["x","y"]}},"ok":{"type":["boolean","null"]}},
    "required":["name"],"additionalProperties":false})";

// Walks randomly; at every step the mask must equal brute force and the cached mask
// the uncached one.
void CheckMasksAlongWalks(const Spec& spec, int walks) {
  CAPTURE(spec.text);
  const Vocabulary vocab = MultiVocab();
  Limits uncached;
  uncached.token_cache = false;
  auto g = MustCompile(spec, vocab);
  auto g_plain = MustCompile(spec, vocab, uncached);
  std::mt19937 rng(7);
  for (int w = 0; w < walks; ++w) {
    Matcher m(g), plain(g_plain);
    for (int step = 0; step < 25 && !m.IsTerminated(); ++step) {
      m.CheckInvariants();
      auto mask = Mask(m, vocab);
      REQUIRE(mask == BruteForceMask(m, vocab));
      REQUIRE(mask == Mask(plain, vocab));
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < vocab.size(); ++id) {
        if (Allowed(mask, static_cast<int32_t>(id))) allowed.push_back(static_cast<int32_t>(id));
      }
      if (allowed.empty()) break;
      int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      REQUIRE(m.AcceptToken(id));
      REQUIRE(plain.AcceptToken(id));
    }
  }
}

TEST_CASE("the mask equals brute force on random states, with the token cache and without") {
  CheckMasksAlongWalks({Kind::kEbnf, kNestedEbnf}, 8);
  CheckMasksAlongWalks({Kind::kJsonSchema, kSchema}, 8);
  CheckMasksAlongWalks({Kind::kJsonObject, ""}, 5);
  Spec spaced{Kind::kJsonSchema, kSchema};
  spaced.any_whitespace = true;
  CheckMasksAlongWalks(spaced, 5);
  CheckMasksAlongWalks({Kind::kRegex, R"(\d{1,3}(\.\d+)?[a-z]*"?)"}, 5);
  CheckMasksAlongWalks({Kind::kChoice, R"(["cat", "category", "dog\"s", "caf\u00e9"])"}, 5);
}

TEST_CASE("tokens that straddle structure or split a UTF-8 character are matched byte by byte") {
  const Vocabulary vocab = MultiVocab();
  auto id_of = [&](std::string_view s) {
    for (size_t id = 0; id < vocab.size(); ++id) {
      if (vocab.is_usable(static_cast<int32_t>(id)) && vocab.token(static_cast<int32_t>(id)) == s) return static_cast<int32_t>(id);
    }
    FAIL("no token " << s);
    return -1;
  };
  auto g = MustCompile({Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})"}, vocab);
  Matcher m(g);
  CHECK(m.AcceptToken(id_of("{\"")));
  CHECK_FALSE(m.AcceptToken(id_of("\":")));  // the key must be "a"
  CHECK(m.AcceptToken(id_of("a")));
  CHECK(m.AcceptToken(id_of("\":\"")));
  CHECK(m.AcceptToken(id_of("\xE2\x82")));  // half of the euro sign
  auto mask = Mask(m, vocab);
  CHECK(Allowed(mask, id_of("\xAC")));
  CHECK_FALSE(Allowed(mask, id_of("a")));   // a lone lead byte must be continued
  CHECK_FALSE(Allowed(mask, id_of("\"}")));
  CHECK(m.AcceptToken(id_of("\xAC")));
  CHECK_FALSE(m.CanTerminate());
  CHECK(m.AcceptToken(id_of("\"}")));
  CHECK(m.CanTerminate());
}

TEST_CASE("stop tokens only when the grammar can end; special and empty tokens never") {
  const Vocabulary vocab = MultiVocab();
  auto stops = vocab.stop_ids();
  REQUIRE(stops.size() == 2);
  auto g = MustCompile({Kind::kRegex, "ab(c)?"}, vocab);
  Matcher m(g);
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (!vocab.is_usable(static_cast<int32_t>(id))) CHECK_FALSE(Allowed(Mask(m, vocab), static_cast<int32_t>(id)));
  }
  CHECK_FALSE(m.AcceptToken(stops[0]));
  CHECK(m.AcceptToken('a'));
  CHECK(m.AcceptToken('b'));
  auto mask = Mask(m, vocab);
  CHECK(Allowed(mask, stops[0]));
  CHECK(Allowed(mask, stops[1]));
  CHECK(Allowed(mask, 'c'));
  CHECK_FALSE(m.AcceptToken(static_cast<int32_t>(vocab.size())));  // out of range
  CHECK(m.AcceptToken('c'));
  mask = Mask(m, vocab);
  CHECK(Allowed(mask, stops[1]));
  for (size_t id = 0; id < vocab.size(); ++id) {
    if (!vocab.is_stop(static_cast<int32_t>(id))) CHECK_FALSE(Allowed(mask, static_cast<int32_t>(id)));
  }
  CHECK(m.AcceptToken(stops[1]));
  CHECK(m.IsTerminated());
  CHECK_FALSE(m.CanTerminate());
  mask = Mask(m, vocab);
  CHECK(std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }));
  CHECK_FALSE(m.AcceptToken('c'));
  m.Rollback(1);  // un-terminates
  CHECK_FALSE(m.IsTerminated());
  CHECK(m.CanTerminate());
  m.CheckInvariants();
}

TEST_CASE("rollback restores the earlier state exactly") {
  const Vocabulary vocab = MultiVocab();
  auto g = MustCompile({Kind::kJsonSchema, kSchema}, vocab);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    Matcher m(g);
    std::vector<std::vector<uint32_t>> masks{Mask(m, vocab)};
    std::vector<int32_t> taken;
    for (int step = 0; step < 25; ++step) {
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < vocab.size(); ++id) {
        if (Allowed(masks.back(), static_cast<int32_t>(id)) && !vocab.is_stop(static_cast<int32_t>(id))) allowed.push_back(static_cast<int32_t>(id));
      }
      if (allowed.empty()) break;
      int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      REQUIRE(m.AcceptToken(id));
      taken.push_back(id);
      masks.push_back(Mask(m, vocab));
    }
    int n = std::uniform_int_distribution<int>(0, m.NumSteps())(rng);
    m.Rollback(n);
    CHECK(m.NumSteps() == static_cast<int>(taken.size()) - n);
    CHECK(Mask(m, vocab) == masks[taken.size() - n]);
    for (size_t i = taken.size() - n; i < taken.size(); ++i) CHECK(m.AcceptToken(taken[i]));  // replays
    CHECK(Mask(m, vocab) == masks.back());
    m.CheckInvariants();
  }
}

TEST_CASE("AcceptBytes takes a forced prefix as one step") {
  auto g = MustCompile({Kind::kEbnf, kNestedEbnf}, testing::ByteVocab());
  Matcher m(g);
  CHECK(m.AcceptBytes("{\"k\":[1,"));
  CHECK_FALSE(m.AcceptBytes("]"));
  CHECK(m.NumSteps() == 1);
  CHECK(m.AcceptBytes("2]}"));
  CHECK(m.CanTerminate());
  m.Rollback(1);
  CHECK_FALSE(m.CanTerminate());
}

TEST_CASE("an ambiguous grammar whose stacks multiply is refused at the stack limit, not followed") {
  Limits limits;
  limits.max_stacks = 64;
  // Each "a" may open s (closed by "b") or t (closed by "c"): 2^n stacks after n.
  auto g = MustCompile({Kind::kEbnf, R"(root ::= s
    s ::= "a" s "b" | "a" t | "x"
    t ::= s "c")"}, testing::ByteVocab(), limits);
  Matcher m(g);
  int accepted = 0;
  while (accepted < 20 && m.AcceptToken('a')) ++accepted;
  CHECK(accepted >= 5);
  CHECK(accepted < 20);
  CHECK(m.status().code() == StatusCode::kResourceExhausted);
  CHECK(m.status().message().find("parse stacks") != std::string::npos);
  m.CheckInvariants();
}

TEST_CASE("the automaton keeps its invariants; its token cache agrees with walks from the bottom") {
  for (const char* text : {kNestedEbnf, "root ::= [a-z]+ (\",\" root)?"}) {
    auto grammar = ParseEbnf(text);
    REQUIRE(grammar.ok());
    auto a = Automaton::Build(*grammar, {});
    REQUIRE(a.ok());
    a->CheckInvariants();
  }
  auto g = MustCompile({Kind::kJsonSchema, kSchema}, MultiVocab());
  size_t before = MemoryBytes(*g);
  WarmTokenCache(*g);
  CHECK(MemoryBytes(*g) > before);
  // Every state's entry: its accepted tokens are accepted from a stack of that state alone.
  const Vocabulary vocab = MultiVocab();
  for (size_t s = 0; s < g->automaton().num_states(); ++s) {
    if (!g->automaton().has_bytes(static_cast<int32_t>(s))) continue;
    const auto& entry = g->tokens(static_cast<int32_t>(s));
    FramePool pool;
    Pda pda(&g->automaton(), &pool, 64);
    Position start, out;
    start.tops.push_back({static_cast<int32_t>(s), kBottom});
    for (int32_t id : entry.accepted) {
      pda.Run(start, vocab.token(id), &out);
      CHECK_FALSE(out.dead());
    }
  }
}

TEST_CASE("threads sharing a compiled grammar fill its token cache concurrently and agree") {
  const Vocabulary vocab = MultiVocab();
  auto shared = MustCompile({Kind::kJsonSchema, kSchema}, vocab);
  auto alone = MustCompile({Kind::kJsonSchema, kSchema}, vocab);
  const std::string text = R"({"name":"ab\"c","id":-7,"tags":["x","y"],"ok":null})";
  // The masks along the text, from a grammar no other thread touches.
  std::vector<std::vector<uint32_t>> expected;
  Matcher m(alone);
  for (char c : text) {
    expected.push_back(Mask(m, vocab));
    REQUIRE(m.AcceptToken(static_cast<uint8_t>(c)));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      Matcher mine(shared);
      for (size_t i = 0; i < text.size(); ++i) {
        if (Mask(mine, vocab) != expected[i]) ++mismatches;
        if (!mine.AcceptToken(static_cast<uint8_t>(text[i]))) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches == 0);
}

TEST_CASE("the grammar cache compiles a spec once and evicts the least recently used") {
  const Vocabulary vocab = MultiVocab();
  GrammarCache cache(2);
  auto a1 = cache.GetOrCompile({Kind::kRegex, "a+"}, vocab);
  auto a2 = cache.GetOrCompile({Kind::kRegex, "a+"}, vocab);
  REQUIRE(a1.ok());
  REQUIRE(a2.ok());
  CHECK(a1->get() == a2->get());
  CHECK(cache.hits() == 1);
  auto strict = cache.GetOrCompile({Kind::kJsonSchema, R"({"type":"object"})", true}, vocab);
  auto loose = cache.GetOrCompile({Kind::kJsonSchema, R"({"type":"object"})", false}, vocab);
  CHECK(strict->get() != loose->get());  // options are part of the key
  CHECK(cache.size() == 2);
  auto a3 = cache.GetOrCompile({Kind::kRegex, "a+"}, vocab);  // evicted: compiled again
  CHECK(a3->get() != a1->get());
  CHECK_FALSE(cache.GetOrCompile({Kind::kRegex, "(a"}, vocab).ok());
  CHECK(cache.size() == 2);
  // Threads share it.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        auto g = cache.GetOrCompile({Kind::kChoice, "[\"" + std::to_string((t + i) % 3) + "\"]"}, vocab);
        ok += g.ok();
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(ok == 80);
  CHECK(cache.size() == 2);
}

}  // namespace
}  // namespace kvfleet::grammar
