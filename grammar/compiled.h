// CompiledGrammar: a spec's automaton bound to one vocabulary, with the token cache.
//
// The token cache holds, for each automaton state that reads bytes, the tokens a stack
// whose top is that state accepts whatever lies below the top ("accepted"), and those whose
// acceptance depends on the frames below because the top's rule can end inside the token
// ("uncertain"); every other token is rejected from that state in any context (XGrammar's
// context-independent / context-dependent split). A mask is then the union, over the live
// tops, of their accepted sets, plus the uncertain tokens that pass a walk from the real
// stacks.
//
// Thread safety: immutable after Compile; shared by every Matcher of the spec.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/grammar.h"

namespace kvfleet::grammar {

class CompiledGrammar {
 public:
  struct StateTokens {
    std::vector<int32_t> accepted;        // ids, when few
    std::vector<uint32_t> accepted_bits;  // a bitmask, when many
    std::vector<int32_t> uncertain;       // ids in the vocabulary's byte order
  };

  CompiledGrammar(Automaton automaton, Vocabulary vocab, Limits limits)
      : automaton_(std::move(automaton)), vocab_(std::move(vocab)), limits_(limits) {}

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary& vocabulary() const { return vocab_; }
  const Limits& limits() const { return limits_; }
  // The cache entry of a state that reads bytes; nullptr when the cache is off.
  const StateTokens* tokens(int32_t state) const {
    return state_tokens_.empty() ? nullptr : &state_tokens_[state];
  }
  size_t memory_bytes() const;

  // Fills the token cache (Compile calls it once when Limits::token_cache is set).
  void BuildTokenCache();

 private:
  Automaton automaton_;
  Vocabulary vocab_;
  Limits limits_;
  std::vector<StateTokens> state_tokens_;
};

}  // namespace kvfleet::grammar
