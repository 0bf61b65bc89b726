// WalkTokens: decides, for many tokens at once, whether all of a token's bytes are
// accepted from a Position. Tokens come in byte order, so each shares a prefix with the one
// before it; the positions after each prefix byte are kept per depth and a shared prefix is
// read once (the vocabulary walked as a trie without building one). A dead prefix rejects
// every following token that shares it at the cost of one comparison.
//
// Tokens are given by rank (their index in the vocabulary's byte order), ascending.
// verdict(rank, accepted, escaped) is called once per token: accepted when every byte was
// read and some stack is alive (or the bottom rule completed exactly at the end); escaped
// when, before the last byte, some stack completed the bottom rule (the token's fate then
// depends on the frames below the start: the token cache calls such tokens uncertain).
//
// Thread safety: thread-compatible; uses the caller's Pda and scratch.
#pragma once

#include <algorithm>
#include <span>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/pda.h"

namespace kvfleet::grammar {

struct WalkScratch {
  std::vector<Position> levels;
  std::vector<char> escaped;  // escaped[d]: some level <= d had can_end
};

template <typename Verdict>
void WalkTokens(Pda* pda, const Vocabulary& vocab, const Position& start, std::span<const int32_t> ranks,
                WalkScratch* scratch, Verdict&& verdict) {
  auto& levels = scratch->levels;
  auto& escaped = scratch->escaped;
  size_t need = vocab.max_token_bytes() + 1;
  if (levels.size() < need) levels.resize(need);
  if (escaped.size() < need) escaped.resize(need);
  levels[0] = start;
  escaped[0] = start.can_end;
  size_t computed = 0;  // levels[0..computed] hold the previous token's prefix positions
  std::string_view prev;
  int32_t prev_rank = -2;
  for (int32_t rank : ranks) {
    std::string_view tok = vocab.sorted_token(rank);
    size_t lcp;
    if (rank == prev_rank + 1) {
      lcp = std::min<size_t>(vocab.lcp_with_previous(rank), computed);
    } else {
      size_t limit = std::min({prev.size(), tok.size(), computed});
      lcp = 0;
      while (lcp < limit && prev[lcp] == tok[lcp]) ++lcp;
    }
    size_t d = lcp;
    while (d < tok.size() && !levels[d].tops.empty()) {
      pda->Step(levels[d], static_cast<uint8_t>(tok[d]), &levels[d + 1]);
      escaped[d + 1] = escaped[d] || levels[d + 1].can_end;
      ++d;
    }
    computed = d;
    prev = tok;
    prev_rank = rank;
    bool accepted = d == tok.size() && !levels[d].dead();
    bool esc = escaped[std::min(d, tok.size() - 1)] || levels[d].overflow;
    verdict(rank, accepted, esc);
  }
}

}  // namespace kvfleet::grammar
