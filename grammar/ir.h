// Grammar IR: a context-free grammar over Unicode text, the one form every front end
// (EBNF, JSON Schema, regex, choice) compiles to and the automaton builder reads.
//
// A Grammar is a list of rules, each with one body expression; expressions live in one
// arena and refer to each other by index. An expression may have several parents (the
// arena is a DAG), but the automaton builder expands it again at each use, so a front end
// shares anything large through a rule (Ref) and only small pieces through expressions.
//
// Thread safety: a value; thread-compatible.
//
// Invariants:
//   1. every child and rule index is in range; every rule has a body (after the front end);
//      expressions refer only to earlier ones (no cycles: recursion goes through rules).
//   2. character classes hold sorted, disjoint, non-adjacent ranges within [0, 0x10FFFF].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvfleet::grammar {

struct CodepointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;  // inclusive
};

struct Expr {
  enum class Type : uint8_t {
    kBytes,   // the literal bytes of `bytes` (UTF-8 text, or raw bytes)
    kClass,   // one codepoint in `ranges` (UTF-8 encoded)
    kSeq,     // children in order; no children = the empty string
    kAlt,     // one of the children
    kRef,     // the rule `rule`
    kRepeat,  // children[0] between min and max times (max == kUnbounded: no bound)
  };
  static constexpr int32_t kUnbounded = -1;

  Type type = Type::kSeq;
  std::string bytes;
  std::vector<CodepointRange> ranges;
  std::vector<int32_t> children;
  int32_t rule = -1;
  int32_t min = 0;
  int32_t max = kUnbounded;
};

struct Rule {
  std::string name;
  int32_t body = -1;
};

class Grammar {
 public:
  // Declares a rule (body set later, so rules can refer to each other); returns its index.
  int32_t AddRule(std::string name);
  void SetBody(int32_t rule, int32_t expr) { rules_[rule].body = expr; }
  // The index of the rule named `name`, or -1.
  int32_t FindRule(std::string_view name) const;
  // A rule name not used yet, starting with `base`.
  std::string FreshName(std::string_view base) const;

  int32_t Bytes(std::string bytes);
  // One codepoint in `ranges` (normalized here: sorted, merged), or outside them if negated.
  int32_t Class(std::vector<CodepointRange> ranges, bool negated = false);
  int32_t Seq(std::vector<int32_t> children);
  int32_t Alt(std::vector<int32_t> children);
  int32_t Empty() { return Seq({}); }
  int32_t Ref(int32_t rule);
  int32_t Repeat(int32_t child, int32_t min, int32_t max);
  int32_t Optional(int32_t child) { return Repeat(child, 0, 1); }
  int32_t Star(int32_t child) { return Repeat(child, 0, Expr::kUnbounded); }
  int32_t Plus(int32_t child) { return Repeat(child, 1, Expr::kUnbounded); }

  const Expr& expr(int32_t i) const { return exprs_[i]; }
  const Rule& rule(int32_t i) const { return rules_[i]; }
  size_t num_exprs() const { return exprs_.size(); }
  size_t num_rules() const { return rules_.size(); }
  int32_t root() const { return root_; }
  void set_root(int32_t rule) { root_ = rule; }

  // Every rule has a body and root is set; InvalidArgument names the first that has none.
  Status CheckComplete() const;

  // EBNF text that ParseEbnf reads back into an equivalent grammar, root rule first.
  std::string ToEbnf() const;

 private:
  std::string ExprToEbnf(int32_t e, int parent_precedence) const;

  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  int32_t root_ = -1;
};

// Sorts, merges and (if negated) complements ranges within [0, 0x10FFFF].
std::vector<CodepointRange> NormalizeRanges(std::vector<CodepointRange> ranges, bool negated);

// Appends the UTF-8 encoding of `cp` (REQUIRES: cp <= 0x10FFFF).
void AppendUtf8(uint32_t cp, std::string* out);

}  // namespace kvfleet::grammar
