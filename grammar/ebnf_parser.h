// ParseEbnf: EBNF text (GBNF / XGrammar syntax) into the grammar IR.
//
//   root ::= "{" pair ("," pair)* "}"      # a comment
//   pair ::= [a-z]+ ":" ("true" | 'false' | [0-9]{1,3})
//
// Rules are `name ::= alternatives` and may span lines; a rule ends where the next
// `name ::=` starts. Literals are "..." or '...' with \n \r \t \\ \" \' \uXXXX \UXXXXXXXX
// (codepoints) and \xHH (one raw byte); classes are [...] or [^...] of codepoints and
// ranges (\xHH is the codepoint U+00HH there); `.` is any codepoint; postfix * + ? {m}
// {m,} {m,n}. The rule named "root" is the start. Errors name the line and column.
//
// Thread safety: a pure function.
#pragma once

#include <string_view>

#include "common/status.h"
#include "grammar/ir.h"

namespace kvfleet::grammar {

// max_depth bounds the nesting of groups (the parser recurses once per level).
Result<Grammar> ParseEbnf(std::string_view text, int max_depth = 64);

}  // namespace kvfleet::grammar
