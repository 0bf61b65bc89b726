// kvfleet's constrained-decoding engine (structured outputs).
//
// A Spec (JSON Schema, any JSON object, a regex, a choice of strings, or EBNF) compiles
// against a model's Vocabulary into a CompiledGrammar: an automaton over bytes plus, per
// automaton state, the tokens whose acceptance does not depend on the stack below it
// (XGrammar's adaptive token mask cache). A Matcher follows one sequence: it accepts the
// sampled token, fills the bitmask of tokens allowed next, and rolls back.
//
//   auto g = Compile({Kind::kJsonSchema, schema_text}, vocab);   // once per schema (GrammarCache)
//   Matcher m(*g);                                               // one per sequence
//   m.FillNextTokenBitmask(mask);  ...sample with the mask...  m.AcceptToken(id);
//
// A token is allowed iff every one of its bytes is accepted from the current state
// (tokens that split a UTF-8 character are matched byte by byte); a stop token only when
// the grammar can end here. See grammar/README.md for the design, limits and complexity.
//
// Thread safety: Vocabulary and CompiledGrammar are immutable and shared between threads;
// a Matcher is thread-compatible (one sequence, one thread at a time); GrammarCache is
// thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvfleet::grammar {

enum class Kind : uint8_t { kJsonSchema, kJsonObject, kRegex, kChoice, kEbnf };
std::string_view KindName(Kind kind);

struct Spec {
  Kind kind = Kind::kJsonObject;
  // kJsonSchema: the schema as JSON; kJsonObject: ignored; kRegex: the pattern; kChoice:
  // a JSON array of strings; kEbnf: the grammar text (its start rule is "root").
  std::string text;
  // kJsonSchema: an absent additionalProperties means false, and an array with prefixItems
  // and no items takes no more items (OpenAI strict mode, XGrammar's default). When false,
  // absent means any, as JSON Schema says.
  bool strict = true;
  // kJsonSchema, kJsonObject: whitespace JSON allows around structural characters
  // (" \t\n\r", unbounded). Off (the default): compact, no whitespace outside strings.
  bool any_whitespace = false;
};

// Bounds on compiling and matching, so that no spec can take unbounded time or memory.
// A spec beyond them fails with InvalidArgument ("grammar too large: ...").
struct Limits {
  size_t max_spec_bytes = size_t{1} << 20;  // the spec text
  int max_nesting_depth = 64;   // schema / regex group / EBNF group nesting
  size_t max_rules = 5000;      // rules after the front end
  size_t max_states = 50000;    // automaton states (NFA and DFA, each)
  size_t max_stacks = 512;      // parse stacks alive at one position of a matcher
  // Precompute the per-state token cache (mask in ~microseconds for most states). Off:
  // every mask walks the vocabulary's byte order from the live stacks.
  bool token_cache = true;
};

// Token id -> bytes, for one model. Cheap to copy (shares its data).
class Vocabulary {
 public:
  // bytes[id] is the token's byte string (decoded: byte-fallback tokens as their byte,
  // "Ġ" as a space). Ids in special_ids and empty strings are never allowed; stop_ids
  // (eos, eot) are allowed exactly when the grammar can end.
  static Vocabulary FromTokenBytes(std::vector<std::string> bytes, std::vector<int32_t> stop_ids,
                                   std::vector<int32_t> special_ids = {});
  Vocabulary();

  size_t size() const;
  const std::string& token(int32_t id) const;
  bool is_stop(int32_t id) const;
  // Not special, not a stop id, not empty: a token the grammar may allow.
  bool is_usable(int32_t id) const;
  std::span<const int32_t> stop_ids() const;
  // The usable ids in byte order, and for each first byte b the range [first[b], first[b+1]).
  std::span<const int32_t> sorted_ids() const;
  std::span<const uint32_t> first_byte_offsets() const;  // 257 entries
  // The index of a usable id in sorted_ids() (-1 for an unusable id).
  int32_t rank(int32_t id) const;
  // The bytes of sorted_ids()[rank], stored contiguously in byte order (a walk over the
  // vocabulary reads memory in sequence), and their common prefix with the rank before.
  std::string_view sorted_token(int32_t rank) const;
  uint32_t lcp_with_previous(int32_t rank) const;
  size_t max_token_bytes() const;
  uint64_t fingerprint() const;  // hash of the contents (GrammarCache keys)

 private:
  struct Data;
  std::shared_ptr<const Data> d_;
};

// The number of 32-bit words of a bitmask over `vocab_size` tokens.
inline size_t BitmaskWords(size_t vocab_size) { return (vocab_size + 31) / 32; }

class CompiledGrammar;

// InvalidArgument naming the keyword/feature for a spec that is invalid or unsupported.
Result<std::shared_ptr<const CompiledGrammar>> Compile(const Spec& spec, const Vocabulary& vocab,
                                                       const Limits& limits = {});
// Fills every state's token cache entry now, instead of at each state's first mask: for a
// background thread after Compile (matchers may run meanwhile). Seconds on a 128K vocabulary
// for a large schema; returns between two states once *stop is true.
void WarmTokenCache(const CompiledGrammar& grammar, const std::atomic<bool>* stop = nullptr);
// The compiled grammar's memory: its automaton and the cache entries filled so far.
size_t MemoryBytes(const CompiledGrammar& grammar);

// Compiles the spec without a vocabulary: the same errors as Compile, for the router's 400s.
Status Validate(const Spec& spec, const Limits& limits = {});

// The grammar a JSON Schema compiles to, as EBNF text, so that a tool-call grammar can
// embed a schema. Its rule names start with `rule_prefix` and its start rule is
// `rule_prefix + "root"`.
struct JsonSchemaOptions {
  bool strict = true;
  std::string rule_prefix;
  bool any_whitespace = false;
};
Result<std::string> JsonSchemaToEbnf(std::string_view schema_json, const JsonSchemaOptions& options = {},
                                     const Limits& limits = {});

// Follows one sequence through a compiled grammar.
//
// Invariants (CheckInvariants asserts them):
//   1. history holds one position per accepted token plus the start; the last is current.
//   2. a terminated matcher allows no token; a dead matcher (no stack left) allows none.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(const Matcher& other);
  Matcher& operator=(const Matcher& other);
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Advances by one token when the grammar allows it; returns false (state unchanged)
  // otherwise. A stop token is accepted only when CanTerminate(), and terminates.
  bool AcceptToken(int32_t id);
  // Advances by raw bytes (e.g. a forced prefix); false (unchanged) when not allowed.
  // Counts as one step for Rollback.
  bool AcceptBytes(std::string_view bytes);
  // Sets bit id (word id / 32, bit id % 32) for each allowed token, clears the rest.
  // REQUIRES: mask.size() >= BitmaskWords(vocabulary size).
  void FillNextTokenBitmask(std::span<uint32_t> mask) const;
  // The grammar can end here (a stop token is allowed).
  bool CanTerminate() const;
  // A stop token was accepted.
  bool IsTerminated() const;
  // Undoes the last n accepted steps (tokens or AcceptBytes calls).
  // REQUIRES: n <= NumSteps().
  void Rollback(int n);
  int NumSteps() const;
  void Reset();
  // Not OK after a step would have exceeded Limits::max_stacks (that step was refused).
  Status status() const;

  const CompiledGrammar& grammar() const;
  void CheckInvariants() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Compiled grammars by (kind, spec text, strict, vocabulary, limits), LRU-bounded by count.
// Thread-safe. Two threads missing on the same key both compile; the second insert wins.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256);
  ~GrammarCache();
  Result<std::shared_ptr<const CompiledGrammar>> GetOrCompile(const Spec& spec, const Vocabulary& vocab,
                                                              const Limits& limits = {});
  size_t size() const;
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvfleet::grammar
