// Internals of the Jinja engine (jinja.h): tokens, the syntax tree and runtime values.
// The shapes follow @huggingface/jinja (lexer.ts, ast.ts, runtime.ts) so that rendering
// agrees with it byte for byte; only the engine's own files (jinja_*) include this.
//
// Thread safety: a parsed tree is immutable; values live in one Render call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvfleet::tok::jinja {

enum class TokenType {
  kText, kNumericLiteral, kStringLiteral, kIdentifier, kEquals, kOpenParen, kCloseParen,
  kOpenStatement, kCloseStatement, kOpenExpression, kCloseExpression, kOpenSquareBracket,
  kCloseSquareBracket, kOpenCurlyBracket, kCloseCurlyBracket, kComma, kDot, kColon, kPipe,
  kCallOperator, kAdditiveBinaryOperator, kMultiplicativeBinaryOperator, kComparisonBinaryOperator,
  kUnaryOperator, kExponentiationBinaryOperator, kComment,
};

struct Token {
  std::string value;
  TokenType type;
};

// Preprocesses (trim_blocks, lstrip_blocks) and tokenizes a template.
Result<std::vector<Token>> Tokenize(std::string_view source);

enum class NodeKind {
  // statements
  kProgram, kIf, kFor, kSet, kMacro, kCallStatement, kFilterStatement, kBreak, kContinue, kComment,
  // expressions
  kIntegerLiteral, kFloatLiteral, kStringLiteral, kArrayLiteral, kTupleLiteral, kObjectLiteral,
  kIdentifier, kMember, kCall, kUnary, kBinary, kFilter, kTest, kSelect, kTernary, kSlice,
  kKeywordArgument, kSpread, kKeywordSpread,
};

// One syntax tree node. Which fields are used depends on kind:
//   kIf:        a = test, body, alternate
//   kFor:       a = loop variable, b = iterable (maybe kSelect), body, alternate (else)
//   kSet:       a = assignee, b = value (or null: body)
//   kMacro:     text = name, args = parameters, body
//   kCallStatement: a = call expression, args = caller parameters (has_caller_args), body
//   kFilterStatement: a = filter (identifier or call), body
//   literals:   text / integer / number; kArrayLiteral / kTupleLiteral: args;
//               kObjectLiteral: args (key, value, key, value, ...)
//   kIdentifier: text
//   kMember:    a = object, b = property, computed
//   kCall:      a = callee, args
//   kUnary:     text = operator, a
//   kBinary:    text = operator, a, b
//   kFilter:    a = operand, b = filter (identifier or call)
//   kTest:      a = operand, text = test name, negate
//   kSelect:    a = value, b = test
//   kTernary:   a = condition, b = if true, c = if false
//   kSlice:     a = start, b = stop, c = step (each may be null)
//   kKeywordArgument: text = key, a = value; kSpread / kKeywordSpread: a
struct Node {
  NodeKind kind;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  bool computed = false;
  bool negate = false;
  bool has_caller_args = false;
  std::unique_ptr<Node> a, b, c;
  std::vector<std::unique_ptr<Node>> args, body, alternate;
  explicit Node(NodeKind k) : kind(k) {}
};

Result<std::unique_ptr<Node>> Parse(const std::vector<Token>& tokens);

}  // namespace kvfleet::tok::jinja
