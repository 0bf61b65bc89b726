// A request's structured-output fields parsed into SamplingParams::structured
// (schema/sampling.h): OpenAI's `response_format` ({"type": "text" | "json_object" |
// "json_schema", "json_schema": {"name", "schema", "strict", "description"}}), vLLM's older
// `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and its
// `structured_outputs` ({"json" | "regex" | "choice" | "grammar" | "json_object"}). At most
// one constraint per request; a malformed value is a 400 naming its field.
//
// The spec is compiled without a vocabulary (grammar::Validate, bounded by grammar::Limits)
// before anything is routed, so an invalid or unsupported schema is a 400 naming the field
// and the keyword; the request then goes only to workers that decode under constraints
// (their Hello's structuredOutputs; none: a 400 from routing, never served unconstrained).
//
// Thread safety: pure functions over values.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "grammar/grammar.h"
#include "schema/sampling.h"

namespace kvfleet::router {

// Reads the fields from `body` (`ordered`: the same body with its keys in order, so a
// schema's properties keep the order the client gave, which a grammar engine generates them
// in). Errors in ParseCompletionRequest's form, naming the field.
Status ParseStructuredOutput(const nlohmann::ordered_json& ordered, StructuredOutput* out, std::string* field);

// The grammar spec of a constraint (the kinds map one to one). REQUIRES: s.kind != kNone.
grammar::Spec GrammarSpecOf(const StructuredOutput& s);
// grammar::Validate of the constraint: a 400 naming `field` and, in its message, the schema
// keyword or feature the grammar engine refuses. OK for no constraint.
Status ValidateStructuredOutput(const StructuredOutput& s, const std::string& field);

// True when `body` has any of the fields (ParseStructuredOutput has something to read).
bool HasStructuredOutputField(const nlohmann::json& body);

}  // namespace kvfleet::router
