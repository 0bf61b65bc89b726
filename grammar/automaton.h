// Automaton: the grammar IR compiled to one deterministic automaton per rule over bytes
// and rule calls (a recursive transition network). A matcher runs it as a pushdown
// automaton: the top of a stack is a state, the frames below it are return states.
//
// Each rule's body becomes a Thompson NFA over the alphabet bytes ∪ {call r}, which is
// then determinized (subset construction); determinizing a rule over that mixed alphabet
// keeps the language of the network. Character classes are expanded to UTF-8 byte
// sequences, so the automaton reads bytes and a token whose bytes split a character is
// matched exactly.
//
// Build is bounded: NFA and DFA states are counted against Limits and a grammar that
// would exceed them fails with InvalidArgument("grammar too large: ..."), so neither a
// {0,100000} repetition nor a schema built to explode can take unbounded memory or time.
//
// Thread safety: immutable after Build; safe to share between threads.
//
// Invariants (CheckInvariants asserts them):
//   1. a state's byte edges are sorted and disjoint; a state calls a rule at most once.
//   2. every state reachable from a rule's start can complete: it is final, or a byte edge
//      or a call leads to a state that can (states that cannot are trimmed).
//   3. no rule reaches a call of itself without consuming a byte (no left recursion), so
//      the closure of a stack is finite.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "grammar/ir.h"

namespace kvfleet::grammar {

struct BuildLimits {
  size_t max_states = 50000;  // NFA states, and separately DFA states, over all rules
  size_t max_rules = 5000;
};

class Automaton {
 public:
  struct ByteEdge {
    uint8_t lo;
    uint8_t hi;  // inclusive
    int32_t target;
  };
  struct CallEdge {
    int32_t rule;
    int32_t target;  // the return state
  };
  struct State {
    int32_t rule = -1;
    uint32_t bytes_begin = 0, bytes_end = 0;
    uint32_t calls_begin = 0, calls_end = 0;
    int32_t table = -1;  // a 256-entry row of tables_ for states with many edges
    bool final = false;
  };

  static Result<Automaton> Build(const Grammar& grammar, const BuildLimits& limits);

  int32_t root_start() const { return rule_start_[root_rule_]; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  size_t num_states() const { return states_.size(); }
  size_t num_rules() const { return rule_start_.size(); }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  const State& state(int32_t s) const { return states_[s]; }
  std::span<const ByteEdge> bytes(int32_t s) const {
    return {byte_edges_.data() + states_[s].bytes_begin, states_[s].bytes_end - states_[s].bytes_begin};
  }
  std::span<const CallEdge> calls(int32_t s) const {
    return {call_edges_.data() + states_[s].calls_begin, states_[s].calls_end - states_[s].calls_begin};
  }
  bool has_bytes(int32_t s) const { return states_[s].bytes_end != states_[s].bytes_begin; }
  // Neither calls a rule nor ends one: reaching it needs no closure.
  bool simple(int32_t s) const { return states_[s].calls_begin == states_[s].calls_end && !states_[s].final; }
  // The state after byte b from s, or -1.
  int32_t Next(int32_t s, uint8_t b) const {
    const State& st = states_[s];
    if (st.table >= 0) return tables_[static_cast<size_t>(st.table) * 256 + b];
    for (uint32_t i = st.bytes_begin; i < st.bytes_end; ++i) {
      const ByteEdge& e = byte_edges_[i];
      if (b < e.lo) return -1;
      if (b <= e.hi) return e.target;
    }
    return -1;
  }

  // Asserts the invariants above (KVF_CHECK); for tests.
  void CheckInvariants() const;

 private:
  friend class AutomatonBuilder;
  std::vector<State> states_;
  std::vector<ByteEdge> byte_edges_;
  std::vector<CallEdge> call_edges_;
  std::vector<int32_t> tables_;
  std::vector<int32_t> rule_start_;
  std::vector<std::string> rule_names_;
  int32_t root_rule_ = 0;
};

}  // namespace kvfleet::grammar
