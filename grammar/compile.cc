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
    case Kind::kJsonSchema: return JsonSchemaToGrammar(spec.text, {spec.strict, ""}, limits);
    case Kind::kJsonObject: return JsonSchemaToGrammar(R"({"type":"object"})", {false, ""}, limits);
    case Kind::kRegex: return RegexToGrammar(spec.text, limits);
    case Kind::kChoice: return ChoiceToGrammar(spec.text);
    case Kind::kEbnf: return ParseEbnf(spec.text, limits.max_nesting_depth);
  }
  return InvalidArgument("unknown grammar kind");
}

Result<std::shared_ptr<const CompiledGrammar>> Compile(const Spec& spec, const Vocabulary& vocab, const Limits& limits) {
  KVF_ASSIGN_OR_RETURN(Automaton a, BuildAutomaton(spec, limits));
  auto g = std::make_shared<CompiledGrammar>(std::move(a), vocab, limits);
  if (limits.token_cache) g->BuildTokenCache();
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

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

void CompiledGrammar::BuildTokenCache() {
  const Automaton& a = automaton_;
  state_tokens_.assign(a.num_states(), {});
  FramePool pool;
  Pda pda(&a, &pool, limits_.max_stacks);
  WalkScratch scratch;
  auto sorted = vocab_.sorted_ids();
  auto first = vocab_.first_byte_offsets();
  size_t words = BitmaskWords(vocab_.size());
  std::vector<int32_t> ids;
  for (size_t s = 0; s < a.num_states(); ++s) {
    if (!a.has_bytes(static_cast<int32_t>(s))) continue;
    Position start;
    start.tops.push_back({static_cast<int32_t>(s), kBottom});
    ids.clear();
    for (const auto& e : a.bytes(static_cast<int32_t>(s))) {
      ids.insert(ids.end(), sorted.begin() + first[e.lo], sorted.begin() + first[e.hi + 1]);
    }
    StateTokens& st = state_tokens_[s];
    WalkTokens(&pda, vocab_, start, ids, &scratch, [&](int32_t id, bool accepted, bool escaped) {
      if (accepted) {
        st.accepted.push_back(id);
      } else if (escaped) {
        st.uncertain.push_back(id);
      }
    });
    // A list costs 32 bits per token, the bitmask 1 bit per vocabulary entry.
    if (st.accepted.size() > words) {
      st.accepted_bits.assign(words, 0);
      for (int32_t id : st.accepted) st.accepted_bits[id / 32] |= 1u << (id % 32);
      st.accepted.clear();
      st.accepted.shrink_to_fit();
    }
  }
}

size_t CompiledGrammar::memory_bytes() const {
  size_t n = automaton_.num_states() * sizeof(Automaton::State);
  for (const auto& st : state_tokens_) {
    n += sizeof(st) + 4 * (st.accepted.capacity() + st.accepted_bits.capacity() + st.uncertain.capacity());
  }
  return n;
}

}  // namespace kvfleet::grammar
