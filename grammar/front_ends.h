// The front ends: each turns one kind of spec into the grammar IR. Bounded by Limits
// (nesting depth, spec size); the automaton builder bounds what they produce.
//
// Thread safety: pure functions.
#pragma once

#include <string_view>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/ir.h"

namespace kvfleet::grammar {

// JSON Schema -> grammar (grammar/json_schema.cc). Rule names start with options.rule_prefix.
Result<Grammar> JsonSchemaToGrammar(std::string_view schema_json, const JsonSchemaOptions& options,
                                    const Limits& limits);

// How a regex's characters are written: as themselves, or as the inside of a JSON string
// (", \ and control characters escaped the way JSON serializers write them).
enum class RegexText : uint8_t { kRaw, kJsonString };

// Adds a regex (ECMAScript subset; grammar/regex.cc) to `g`; returns its expression.
// ^ and $ are allowed only at the pattern's ends. search = false: the whole text matches
// the pattern (a regex spec). search = true: JSON Schema's "pattern", which matches
// anywhere in the string unless anchored, so an unanchored end admits any text there.
Result<int32_t> RegexToExpr(Grammar* g, std::string_view pattern, RegexText text, bool search, const Limits& limits);

// One character of `ranges` (normalized) inside a JSON string, written as JSON
// serializers write it: raw, except '"' and '\' (\" \\) and controls (\b \t \n \f \r, else
// \u00xx in lowercase hex). Other escapes (\/, \u00e9) are not generated.
int32_t JsonStringChar(Grammar* g, const std::vector<CodepointRange>& ranges);

// Any spec -> grammar, before the automaton.
Result<Grammar> SpecToGrammar(const Spec& spec, const Limits& limits);

}  // namespace kvfleet::grammar
