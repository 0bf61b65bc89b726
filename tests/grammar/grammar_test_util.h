// Shared by the grammar tests: small vocabularies and ways to feed text to a matcher.
#pragma once

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace kvfleet::grammar::testing {

// Ids 0..255: the single bytes; 256: eos.
inline Vocabulary ByteVocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, static_cast<char>(b));
  t.emplace_back("<eos>");
  return Vocabulary::FromTokenBytes(std::move(t), {256});
}

// The single bytes, then multi-byte tokens of JSON and text fragments (including pieces
// that split a UTF-8 character), a special token and two stop tokens.
inline Vocabulary MultiVocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.emplace_back(1, static_cast<char>(b));
  const char* pieces[] = {"{\"", "\":", "\",", "\"}", "\"]", "\":\"", "\",\"", "},", "}]", "]}", "[{", "[\"", "\":[",
                          "\":{", "true", "false", "null", "tr", "ue", "fal", "se", "nu", "ll", "12", "123", "0.", ".5",
                          "e+", "E-", "-1", "00", "99", "\\n", "\\\"", "\\\\", "\\u", "00e9", "ab", "abc", "name",
                          "\"name", "age", "\"age\":", "id", "@", ".com", "20", "-0", "T1", ":00", "Z\"", "::",
                          "ff", "192", ".168", "a\"", "\"a", "xyz", " \"", "\n", "  ", "\xC3", "\xC3\xA9", "\xA9\"",
                          "\xE2\x82", "\xAC", "\xE2\x82\xAC", "caf\xC3\xA9", "\xF0\x9F", "\x98\x80", "\"\"", "[]", "{}",
                          ",\"", "1,", "1]", "1}", "\"x", "x\"", "yes", "no", "-", "--", "/", "\\/", "cat", "dog"};
  for (const char* p : pieces) t.emplace_back(p);
  int32_t special = static_cast<int32_t>(t.size());
  t.emplace_back("<special>");
  int32_t eos = static_cast<int32_t>(t.size());
  t.emplace_back("<eos>");
  t.emplace_back("<eot>");
  t.emplace_back("");  // a padding id: never allowed
  return Vocabulary::FromTokenBytes(std::move(t), {eos, eos + 1}, {special});
}

inline std::shared_ptr<const CompiledGrammar> MustCompile(const Spec& spec, const Vocabulary& vocab,
                                                           const Limits& limits = {}) {
  auto g = Compile(spec, vocab, limits);
  REQUIRE_MESSAGE(g.ok(), g.status().ToString());
  return *g;
}

// Feeds text byte by byte (REQUIRES: vocab's ids 0..255 are the bytes); true when every
// byte is accepted and the grammar can then end.
inline bool MatchBytes(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  for (char c : text) {
    if (!m.AcceptToken(static_cast<uint8_t>(c))) return false;
  }
  return m.CanTerminate();
}

// Feeds text as a random split into tokens of the vocabulary (each token one that the
// remaining text starts with); true when all are accepted and the grammar can end.
inline bool MatchTokens(const std::shared_ptr<const CompiledGrammar>& g, const Vocabulary& vocab,
                        std::string_view text, std::mt19937* rng) {
  Matcher m(g);
  size_t pos = 0;
  std::vector<int32_t> fits;
  while (pos < text.size()) {
    fits.clear();
    auto first = vocab.first_byte_offsets();
    auto b = static_cast<uint8_t>(text[pos]);
    for (uint32_t r = first[b]; r < first[b + 1]; ++r) {  // the usable tokens starting with b
      int32_t id = vocab.sorted_ids()[r];
      const std::string& tok = vocab.token(id);
      if (text.substr(pos, tok.size()) == tok) fits.push_back(id);
    }
    REQUIRE(!fits.empty());
    int32_t id = fits[std::uniform_int_distribution<size_t>(0, fits.size() - 1)(*rng)];
    if (!m.AcceptToken(id)) return false;
    pos += vocab.token(id).size();
  }
  return m.CanTerminate();
}

// The allowed set by trying every token on a copy of the matcher.
inline std::vector<uint32_t> BruteForceMask(const Matcher& m, const Vocabulary& vocab) {
  std::vector<uint32_t> mask(BitmaskWords(vocab.size()), 0);
  for (size_t id = 0; id < vocab.size(); ++id) {
    Matcher copy = m;
    if (copy.AcceptToken(static_cast<int32_t>(id))) mask[id / 32] |= 1u << (id % 32);
  }
  return mask;
}

inline std::vector<uint32_t> Mask(const Matcher& m, const Vocabulary& vocab) {
  std::vector<uint32_t> mask(BitmaskWords(vocab.size()));
  m.FillNextTokenBitmask(mask);
  return mask;
}

inline bool Allowed(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id / 32] >> (id % 32)) & 1; }

// A random walk: picks allowed tokens (stop tokens once in a while when allowed) until the
// matcher terminates or max_tokens; returns the bytes, and whether it terminated.
inline std::string RandomWalk(const std::shared_ptr<const CompiledGrammar>& g, const Vocabulary& vocab,
                              std::mt19937* rng, size_t max_tokens, bool* terminated) {
  Matcher m(g);
  std::string out;
  std::vector<int32_t> allowed;
  for (size_t step = 0; step < max_tokens && !m.IsTerminated(); ++step) {
    auto mask = Mask(m, vocab);
    allowed.clear();
    bool stop_ok = false;
    for (size_t id = 0; id < vocab.size(); ++id) {
      if (!Allowed(mask, static_cast<int32_t>(id))) continue;
      if (vocab.is_stop(static_cast<int32_t>(id))) stop_ok = true;
      else allowed.push_back(static_cast<int32_t>(id));
    }
    // Ends soon after it may: otherwise open structures make walks long.
    bool stop = stop_ok && (allowed.empty() || std::uniform_int_distribution<int>(0, 2)(*rng) == 0);
    if (stop) {
      REQUIRE(m.AcceptToken(vocab.stop_ids()[0]));
      break;
    }
    REQUIRE_MESSAGE(!allowed.empty(), "a dead end after \"" << out << "\"");
    // Half the time a token that closes something, so that walks end.
    std::vector<int32_t> closing;
    for (int32_t id : allowed) {
      if (vocab.token(id).find_first_of("\"]}") != std::string::npos) closing.push_back(id);
    }
    auto& pick = !closing.empty() && std::uniform_int_distribution<int>(0, 1)(*rng) ? closing : allowed;
    int32_t id = pick[std::uniform_int_distribution<size_t>(0, pick.size() - 1)(*rng)];
    REQUIRE(m.AcceptToken(id));
    out += vocab.token(id);
  }
  *terminated = m.IsTerminated();
  return out;
}

}  // namespace kvfleet::grammar::testing
