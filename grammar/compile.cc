#include <nlohmann/json.hpp>

#include "grammar/compiled.h"
#include "grammar/ebnf_parser.h"
#include "grammar/front_ends.h"
#include "grammar/pda.h"
#include "grammar/token_walk.h"

namespace kvfleet::grammar {

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kJsonObject: return "json_object";
    case Kind::kRegex: return "regex";
    case Kind::kChoice: return "choice";
    case Kind::kEbnf: return "grammar";
  }
  return "unknown";
}

namespace {

Result<Grammar> ChoiceToGrammar(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return InvalidArgument("choice: expected a JSON array of strings");
  if (j.empty()) return InvalidArgument("choice: the list of choices is empty");
  Grammar g;
  int32_t root = g.AddRule("root");
  std::vector<int32_t> alts;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) return InvalidArgument("choice: element " + std::to_string(i) + " is not a string");
    alts.push_back(g.Bytes(j[i].get<std::string>()));
  }
  g.SetBody(root, g.Alt(std::move(alts)));
  g.set_root(root);
  return g;
}

Result<Grammar> RegexToGrammar(std::string_view pattern, const Limits& limits) {
  Grammar g;
  int32_t root = g.AddRule("root");
  KVF_ASSIGN_OR_RETURN(int32_t body, RegexToExpr(&g, pattern, RegexText::kRaw, /*search=*/false, limits));
  g.SetBody(root, body);
  g.set_root(root);
  return g;
}

Result<Automaton> BuildAutomaton(const Spec& spec, const Limits& limits) {
  KVF_ASSIGN_OR_RETURN(Grammar g, SpecToGrammar(spec, limits));
  return Automaton::Build(g, BuildLimits{limits.max_states, limits.max_rules});
}

}  // namespace

Result<Grammar> SpecToGrammar(const Spec& spec, const Limits& limits) {
  if (spec.text.size() > limits.max_spec_bytes) {
    return InvalidArgument("grammar too large: the " + std::string(KindName(spec.kind)) + " spec has " +
                           std::to_string(spec.text.size()) + " bytes, the limit is " +
                           std::to_string(limits.max_spec_bytes));
  }
  switch (spec.kind) {
    case Kind::kJsonSchema: return JsonSchemaToGrammar(spec.text, {spec.strict, "", spec.any_whitespace}, limits);
    case Kind::kJsonObject:
      return JsonSchemaToGrammar(R"({"type":"object"})", {false, "", spec.any_whitespace}, limits);
    case Kind::kRegex: return RegexToGrammar(spec.text, limits);
    case Kind::kChoice: return ChoiceToGrammar(spec.text);
    case Kind::kEbnf: return ParseEbnf(spec.text, limits.max_nesting_depth);
  }
  return InvalidArgument("unknown grammar kind");
}

Result<std::shared_ptr<const CompiledGrammar>> Compile(const Spec& spec, const Vocabulary& vocab, const Limits& limits) {
  KVF_ASSIGN_OR_RETURN(Automaton a, BuildAutomaton(spec, limits));
  return std::shared_ptr<const CompiledGrammar>(std::make_shared<CompiledGrammar>(std::move(a), vocab, limits));
}

void WarmTokenCache(const CompiledGrammar& grammar, const std::atomic<bool>* stop) { grammar.WarmTokenCache(stop); }
size_t MemoryBytes(const CompiledGrammar& grammar) { return grammar.memory_bytes(); }

Status Validate(const Spec& spec, const Limits& limits) { return BuildAutomaton(spec, limits).status(); }

Result<std::string> JsonSchemaToEbnf(std::string_view schema_json, const JsonSchemaOptions& options, const Limits& limits) {
  if (schema_json.size() > limits.max_spec_bytes) {
    return InvalidArgument("grammar too large: the schema has " + std::to_string(schema_json.size()) + " bytes");
  }
  KVF_ASSIGN_OR_RETURN(Grammar g, JsonSchemaToGrammar(schema_json, options, limits));
  // Built once to give the same errors as Compile (too large, no finite instance).
  KVF_RETURN_IF_ERROR(Automaton::Build(g, BuildLimits{limits.max_states, limits.max_rules}).status());
  return g.ToEbnf();
}

CompiledGrammar::CompiledGrammar(Automaton automaton, Vocabulary vocab, Limits limits)
    : automaton_(std::move(automaton)), vocab_(std::move(vocab)), limits_(limits) {
  if (limits_.token_cache) {
    once_ = std::make_unique<std::once_flag[]>(automaton_.num_states());
    state_tokens_.resize(automaton_.num_states());
  }
}

const CompiledGrammar::StateTokens& CompiledGrammar::tokens(int32_t state) const {
  std::call_once(once_[state], [&] { state_tokens_[state] = ComputeTokens(state); });
  return state_tokens_[state];
}

void CompiledGrammar::WarmTokenCache(const std::atomic<bool>* stop) const {
  if (!token_cache()) return;
  for (size_t s = 0; s < automaton_.num_states(); ++s) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) return;
    if (automaton_.has_bytes(static_cast<int32_t>(s))) tokens(static_cast<int32_t>(s));
  }
}

// Walks the tokens whose first byte the state reads from a stack of that state alone: a
// token read entirely inside the state's rule is accepted in any context; one that needs
// the rule to end first is uncertain; the rest are rejected in any context.
CompiledGrammar::StateTokens CompiledGrammar::ComputeTokens(int32_t state) const {
  const Automaton& a = automaton_;
  FramePool pool;
  Pda pda(&a, &pool, limits_.max_stacks);
  WalkScratch scratch;
  auto sorted = vocab_.sorted_ids();
  auto first = vocab_.first_byte_offsets();
  size_t words = BitmaskWords(vocab_.size());
  std::vector<int32_t> ranks;
  Position start;
  start.tops.push_back({state, kBottom});
  for (const auto& e : a.bytes(state)) {
    for (uint32_t r = first[e.lo]; r < first[e.hi + 1]; ++r) ranks.push_back(static_cast<int32_t>(r));
  }
  StateTokens st;
  WalkTokens(&pda, vocab_, start, ranks, &scratch, [&](int32_t rank, bool accepted, bool escaped) {
    if (accepted) {
      st.accepted.push_back(sorted[rank]);
    } else if (escaped) {
      st.uncertain.push_back(rank);
    }
  });
  // A list costs 32 bits per token, the bitmask 1 bit per vocabulary entry.
  if (st.accepted.size() > words) {
    st.accepted_bits.assign(words, 0);
    for (int32_t id : st.accepted) st.accepted_bits[id / 32] |= 1u << (id % 32);
    st.accepted.clear();
  }
  st.accepted.shrink_to_fit();
  st.uncertain.shrink_to_fit();
  cache_bytes_ += sizeof(st) + 4 * (st.accepted.capacity() + st.accepted_bits.capacity() + st.uncertain.capacity());
  return st;
}

size_t CompiledGrammar::memory_bytes() const {
  return automaton_.num_states() * (sizeof(Automaton::State) + sizeof(StateTokens) + sizeof(std::once_flag)) +
         cache_bytes_.load();
}

}  // namespace kvfleet::grammar
