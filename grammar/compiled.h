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
// The cache is filled lazily, a state the first time a mask needs it (a walk of the
// vocabulary: about a millisecond for a state inside a string, microseconds for most), so
// that compiling stays cheap and only the states generation reaches are paid for.
//
// Thread safety: thread-safe; shared by every Matcher of the spec. Each state's entry is
// computed once (std::call_once) and immutable after.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
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
    std::vector<int32_t> uncertain;       // ranks (indices in the vocabulary's byte order), ascending
  };

  CompiledGrammar(Automaton automaton, Vocabulary vocab, Limits limits);

  const Automaton& automaton() const { return automaton_; }
  const Vocabulary& vocabulary() const { return vocab_; }
  const Limits& limits() const { return limits_; }
  bool token_cache() const { return limits_.token_cache; }
  // The cache entry of a state that reads bytes, computed on first use.
  // REQUIRES: token_cache() and automaton().has_bytes(state).
  const StateTokens& tokens(int32_t state) const;
  // The automaton and the cache entries computed so far.
  size_t memory_bytes() const;
  // Computes every state's entry now (benchmarks, and a server's background thread); stops
  // between states once *stop is true.
  void WarmTokenCache(const std::atomic<bool>* stop = nullptr) const;

 private:
  StateTokens ComputeTokens(int32_t state) const;

  Automaton automaton_;
  Vocabulary vocab_;
  Limits limits_;
  std::unique_ptr<std::once_flag[]> once_;      // one per state
  mutable std::vector<StateTokens> state_tokens_;  // entry s is written once, under once_[s]
  mutable std::atomic<size_t> cache_bytes_{0};
};

}  // namespace kvfleet::grammar
